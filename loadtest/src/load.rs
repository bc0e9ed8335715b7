//! Offered against achieved load, and which side was the limit. Senders keep an open-loop
//! schedule: message `n` of a sender is due at a fixed time, whatever happened to the
//! ones before it, and its latencies count from that time (no coordinated omission: a
//! stalled server shows as latency, not only as fewer sends). How late each send went
//! out is its send lag; the part of it the load generator caused itself (a send slot
//! was free, yet it went out late) tells a slow generator from a slow server.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::recorder::Pct;

/// Send lag beyond this (p99) means the senders fell behind their schedule.
pub const LAG_LIMIT_MS: f64 = 100.0;
/// Achieved below this fraction of the offered rate means the senders fell behind.
pub const ACHIEVED_FLOOR: f64 = 0.95;
/// A load generator busy on this fraction of all cores has no room left.
pub const GENERATOR_BUSY: f64 = 0.85;
/// A machine this busy has no core left for anyone.
pub const MACHINE_BUSY: f64 = 0.95;

/// When each message of one sender is due: `first`, then one every `interval`.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub first: Instant,
    pub interval: Duration,
}

impl Schedule {
    /// When message `n` (from 0) is due.
    pub fn due(&self, n: u64) -> Instant {
        self.first + Duration::from_nanos((self.interval.as_nanos() as u64).saturating_mul(n))
    }

    /// How many messages are due strictly before `t`.
    pub fn due_before(&self, t: Instant) -> u64 {
        if t <= self.first {
            return 0;
        }
        let nanos = self.interval.as_nanos().max(1);
        let span = t.duration_since(self.first).as_nanos();
        (span.div_ceil(nanos)) as u64
    }
}

/// Converts instants of this process into wall-clock microseconds (what message bodies
/// carry, so the receiving side can tell how old a message is).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    at: Instant,
    micros: u64,
}

impl Clock {
    pub fn now() -> Clock {
        Clock { at: Instant::now(), micros: crate::recorder::micros_now() }
    }

    pub fn micros(&self, t: Instant) -> u64 {
        if t >= self.at {
            self.micros + t.duration_since(self.at).as_micros() as u64
        } else {
            self.micros.saturating_sub(self.at.duration_since(t).as_micros() as u64)
        }
    }
}

/// Which side held the throughput back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The senders kept their schedule: the offered load was carried.
    NotSaturated,
    /// The load generator could not send on time (its CPU, or its own lag).
    LoadGenerator,
    /// Every core of the machine was busy: generator and server starved each other.
    Machine,
    /// The senders waited for the server's answers.
    Server,
}

/// What the verdict is judged on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// msg/s the schedule asked for (`None`: closed loop, as fast as answers come).
    pub offered: Option<f64>,
    /// Acknowledged msg/s over the send window.
    pub achieved: f64,
    pub lag_p99_ms: f64,
    /// The part of the lag the load generator caused (a send slot was free).
    pub own_lag_p99_ms: f64,
    /// The load generator's CPU in cores (1.0: one core all the time).
    pub generator_cores: Option<f64>,
    /// The server's CPU in cores (gateways + workers + MariaDB + Redis).
    pub server_cores: Option<f64>,
    pub cores: usize,
    /// Busy fraction of all cores (`/proc/stat`).
    pub machine_busy: Option<f64>,
}

fn pct(f: f64) -> String {
    format!("{:.0} %", f * 100.0)
}

/// The limit, and a line that says it with the numbers it rests on.
pub fn verdict(o: &Observed) -> (Limit, String) {
    let cores = o.cores.max(1) as f64;
    let generator = match o.generator_cores {
        Some(c) => format!("its CPU {} of one core, {} of all {} cores", pct(c), pct(c / cores), o.cores),
        None => "its CPU not measured".into(),
    };
    let lag = format!("send lag p99 {:.0} ms", o.lag_p99_ms);
    let behind = match o.offered {
        Some(offered) => o.achieved < ACHIEVED_FLOOR * offered || o.lag_p99_ms > LAG_LIMIT_MS,
        None => true,
    };
    if !behind {
        let offered = o.offered.unwrap_or_default();
        return (
            Limit::NotSaturated,
            format!(
                "not saturated: {:.0} of {offered:.0} msg/s offered were acknowledged, {lag}; load generator: {generator}",
                o.achieved
            ),
        );
    }
    let generator_busy = o.generator_cores.is_some_and(|c| c / cores >= GENERATOR_BUSY);
    let own_lag = o.offered.is_some() && o.lag_p99_ms > 0.0 && o.own_lag_p99_ms >= 0.5 * o.lag_p99_ms;
    if generator_busy || own_lag {
        return (
            Limit::LoadGenerator,
            format!("limit: the load generator ({generator}; {lag}, {:.0} ms of it its own)", o.own_lag_p99_ms),
        );
    }
    let carried = match o.offered {
        Some(offered) => format!("{:.0} of {offered:.0} msg/s offered acknowledged, {lag}", o.achieved),
        None => format!("closed loop, {:.0} msg/s acknowledged as fast as answers came", o.achieved),
    };
    if let Some(busy) = o.machine_busy.filter(|b| *b >= MACHINE_BUSY) {
        let share = |c: Option<f64>| c.map_or_else(|| "?".into(), |c| pct(c / cores));
        return (
            Limit::Machine,
            format!(
                "limit: the machine's CPU ({} of all {} cores busy: the server took {}, the load generator {}; {carried})",
                pct(busy),
                o.cores,
                share(o.server_cores),
                share(o.generator_cores)
            ),
        );
    }
    (Limit::Server, format!("limit: the server ({carried}; load generator: {generator})"))
}

/// How the senders sent, what they were asked to offer and what they achieved.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadReport {
    /// `http` or `ws`.
    pub via: String,
    pub senders: usize,
    /// Sends each sender may have waiting for an answer at once.
    pub in_flight: usize,
    /// msg/s the schedule asked for (`None`: closed loop).
    pub offered_per_s: Option<f64>,
    /// Acknowledged msg/s over the send window.
    pub achieved_per_s: f64,
    /// Sends that went out (first attempts).
    pub sent: u64,
    /// Sends due before the window closed that never went out (the senders were behind).
    pub unsent_due: u64,
    /// How far behind its due time each send went out.
    pub send_lag_ms: Pct,
    /// The part of the send lag the load generator caused (a send slot was free).
    pub own_lag_ms: Pct,
    /// The load generator's CPU, in cores, and as a fraction of all cores.
    pub generator_cores: Option<f64>,
    pub generator_share: Option<f64>,
    pub machine_busy: Option<f64>,
    pub limit: Option<Limit>,
    pub verdict: String,
}

/// The offered-against-achieved paragraph of a scenario's Markdown report.
pub fn markdown(l: &LoadReport) -> String {
    let mut s = String::new();
    let offered = match l.offered_per_s {
        Some(o) => format!("Offered {o:.0} msg/s (open loop"),
        None => "Closed loop (as fast as answers came".into(),
    };
    let _ = write!(
        s,
        "{offered}, {} senders over {}, up to {} in flight each); achieved {:.0} msg/s acknowledged; {} sent",
        l.senders, l.via, l.in_flight, l.achieved_per_s, l.sent
    );
    if l.unsent_due > 0 {
        let _ = write!(s, ", {} due but not sent when the window closed", l.unsent_due);
    }
    s.push('.');
    if let Some(c) = l.generator_cores {
        let _ = write!(
            s,
            " Load generator CPU {} of one core ({} of all cores)",
            pct(c),
            pct(l.generator_share.unwrap_or_default())
        );
        if let Some(b) = l.machine_busy {
            let _ = write!(s, "; the machine {} busy", pct(b));
        }
        s.push('.');
    }
    let _ = writeln!(s, "\n\n**{}**\n", l.verdict);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_due_at_fixed_times_whatever_came_before() {
        let t0 = Instant::now();
        let s = Schedule { first: t0 + Duration::from_millis(3), interval: Duration::from_millis(10) };
        assert_eq!(s.due(0), t0 + Duration::from_millis(3));
        assert_eq!(s.due(5), t0 + Duration::from_millis(53));
        assert_eq!(s.due_before(t0), 0);
        assert_eq!(s.due_before(t0 + Duration::from_millis(3)), 0, "strictly before");
        assert_eq!(s.due_before(t0 + Duration::from_millis(4)), 1);
        assert_eq!(s.due_before(t0 + Duration::from_millis(53)), 5);
        assert_eq!(s.due_before(t0 + Duration::from_millis(54)), 6);
    }

    #[test]
    fn the_clock_turns_instants_into_wall_microseconds() {
        let c = Clock::now();
        let later = c.at + Duration::from_millis(250);
        assert_eq!(c.micros(later) - c.micros(c.at), 250_000);
        assert_eq!(c.micros(c.at) - c.micros(c.at - Duration::from_millis(1)), 1_000);
    }

    fn observed() -> Observed {
        Observed {
            offered: Some(1000.0),
            achieved: 990.0,
            lag_p99_ms: 4.0,
            own_lag_p99_ms: 2.0,
            generator_cores: Some(0.2),
            server_cores: Some(0.9),
            cores: 2,
            machine_busy: Some(0.6),
        }
    }

    #[test]
    fn a_kept_schedule_is_not_saturated() {
        let (limit, line) = verdict(&observed());
        assert_eq!(limit, Limit::NotSaturated);
        assert!(line.starts_with("not saturated: 990 of 1000 msg/s"), "{line}");
        assert!(line.contains("20 % of one core, 10 % of all 2 cores"), "{line}");
    }

    #[test]
    fn senders_waiting_for_answers_blame_the_server() {
        let o = Observed { achieved: 600.0, lag_p99_ms: 800.0, own_lag_p99_ms: 3.0, ..observed() };
        let (limit, line) = verdict(&o);
        assert_eq!(limit, Limit::Server);
        assert!(
            line.starts_with("limit: the server (600 of 1000 msg/s offered acknowledged, send lag p99 800 ms"),
            "{line}"
        );
        // the rate held but the lag did not: still behind
        let o = Observed { lag_p99_ms: 300.0, own_lag_p99_ms: 5.0, ..observed() };
        assert_eq!(verdict(&o).0, Limit::Server);
        // closed loop is always paced by the answers
        let o = Observed { offered: None, lag_p99_ms: 0.0, own_lag_p99_ms: 0.0, ..observed() };
        let (limit, line) = verdict(&o);
        assert_eq!(limit, Limit::Server);
        assert!(line.contains("closed loop, 990 msg/s"), "{line}");
    }

    #[test]
    fn a_busy_or_late_generator_blames_itself() {
        let o = Observed { achieved: 600.0, lag_p99_ms: 800.0, generator_cores: Some(1.94), ..observed() };
        let (limit, line) = verdict(&o);
        assert_eq!(limit, Limit::LoadGenerator);
        assert!(
            line.starts_with(
                "limit: the load generator (its CPU 194 % of one core, 97 % of all 2 cores; send lag p99 800 ms"
            ),
            "{line}"
        );
        let o = Observed { achieved: 600.0, lag_p99_ms: 800.0, own_lag_p99_ms: 700.0, ..observed() };
        assert_eq!(verdict(&o).0, Limit::LoadGenerator, "most of the lag was its own");
    }

    #[test]
    fn a_machine_without_a_free_core_is_said() {
        let o = Observed { achieved: 600.0, lag_p99_ms: 800.0, machine_busy: Some(0.99), ..observed() };
        let (limit, line) = verdict(&o);
        assert_eq!(limit, Limit::Machine);
        assert!(line.contains("99 % of all 2 cores busy: the server took 45 %, the load generator 10 %"), "{line}");
    }

    #[test]
    fn the_paragraph_says_offered_achieved_and_the_verdict() {
        let l = LoadReport {
            via: "ws".into(),
            senders: 20,
            in_flight: 1,
            offered_per_s: Some(200.0),
            achieved_per_s: 199.0,
            sent: 600,
            generator_cores: Some(0.5),
            generator_share: Some(0.25),
            machine_busy: Some(0.7),
            verdict: "not saturated: x".into(),
            ..LoadReport::default()
        };
        let md = markdown(&l);
        assert!(md.starts_with("Offered 200 msg/s (open loop, 20 senders over ws, up to 1 in flight each); achieved 199 msg/s acknowledged; 600 sent."), "{md}");
        assert!(md.contains("Load generator CPU 50 % of one core (25 % of all cores); the machine 70 % busy."), "{md}");
        assert!(md.contains("**not saturated: x**"));
    }
}
