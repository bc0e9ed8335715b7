//! The budget's control law, a plain state machine: each tick's congestion signals and
//! the rate sessions used in, the node's backlog rate out. Additive increase while the
//! node keeps up, multiplicative decrease while a signal is over its target, between a
//! floor and a ceiling.

use std::time::Duration;

/// Each congested tick keeps this share of the rate.
const DECREASE: f64 = 0.7;
/// Each clear tick adds this share of the ceiling: floor to ceiling in about 100 ticks.
const INCREASE: f64 = 0.01;

/// What one tick measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// The worst lateness of the probe timer in the tick.
    pub lag: Duration,
    /// Realtime pushes written in the tick.
    pub pushes: u64,
    /// Those of them slower than the realtime target.
    pub slow: u64,
}

/// Above what a signal counts as congestion.
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    pub lag: Duration,
}

/// Which signal was over its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    Lag,
    Realtime,
}

impl Congestion {
    pub fn label(self) -> &'static str {
        match self {
            Congestion::Lag => "lag",
            Congestion::Realtime => "realtime",
        }
    }
}

impl Signals {
    /// The tick's congestion, if any: lag over its target, or more than 1 % of realtime
    /// pushes slow (their p99 over its target).
    pub fn congestion(&self, targets: &Targets) -> Option<Congestion> {
        if self.lag > targets.lag {
            Some(Congestion::Lag)
        } else if self.slow * 100 > self.pushes {
            Some(Congestion::Realtime)
        } else {
            None
        }
    }
}

/// The node's backlog rate under AIMD.
#[derive(Clone, Debug)]
pub struct Aimd {
    rate: f64,
    floor: f64,
    ceiling: f64,
}

impl Aimd {
    /// Starting at `rate`, kept within `floor..=ceiling`.
    pub fn new(floor: u32, ceiling: u32, rate: u32) -> Aimd {
        let (floor, ceiling) = (f64::from(floor.max(1)), f64::from(ceiling.max(floor).max(1)));
        Aimd { rate: f64::from(rate).clamp(floor, ceiling), floor, ceiling }
    }

    pub fn rate(&self) -> u32 {
        self.rate.round() as u32
    }

    /// One tick: cut while congested, grow otherwise, but only as far as the sessions
    /// use the budget: to at most twice the rate they took in the tick (`used`, per
    /// second) plus a step, falling no faster than a cut. So an idle node's budget
    /// comes to rest at its floor and a storm starts there, growing while the node
    /// keeps up, instead of meeting the ceiling. Returns the new rate.
    pub fn tick(&mut self, congested: bool, used: f64) -> u32 {
        let step = (self.ceiling * INCREASE).max(1.0);
        self.rate = if congested {
            (self.rate * DECREASE).max(self.floor)
        } else {
            let used_up_to = (2.0 * used + step).max(self.rate * DECREASE);
            (self.rate + step).min(used_up_to).clamp(self.floor, self.ceiling)
        };
        self.rate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGETS: Targets = Targets { lag: Duration::from_millis(10) };

    #[test]
    fn congestion_cuts_multiplicatively_down_to_the_floor() {
        let mut a = Aimd::new(2_000, 100_000, 100_000);
        assert_eq!(a.tick(true, 1e6), 70_000);
        assert_eq!(a.tick(true, 1e6), 49_000);
        for _ in 0..20 {
            a.tick(true, 1e6);
        }
        assert_eq!(a.rate(), 2_000, "never below the floor");
    }

    /// A tick in which the sessions took all the budget.
    fn used_up(a: &mut Aimd, congested: bool) -> u32 {
        let used = f64::from(a.rate());
        a.tick(congested, used)
    }

    #[test]
    fn a_clear_node_in_use_gets_its_budget_back_additively_up_to_the_ceiling() {
        let mut a = Aimd::new(2_000, 100_000, 2_000);
        assert_eq!(used_up(&mut a, false), 3_000);
        assert_eq!(used_up(&mut a, false), 4_000);
        let ticks = (0..200).take_while(|_| used_up(&mut a, false) < 100_000).count();
        assert_eq!(ticks, 95, "a step of 1 % of the ceiling per tick");
        assert_eq!(used_up(&mut a, false), 100_000, "never above the ceiling");
        // A cut, then growth again: the sawtooth of AIMD.
        assert_eq!(used_up(&mut a, true), 70_000);
        assert_eq!(used_up(&mut a, false), 71_000);
    }

    #[test]
    fn a_budget_grows_only_as_far_as_it_is_used_and_rests_at_the_floor() {
        let mut a = Aimd::new(2_000, 100_000, 100_000);
        assert_eq!(a.tick(false, 40_000.0), 81_000, "twice what was used, plus a step");
        assert_eq!(a.tick(false, 0.0), 56_700, "idle: falling as fast as a cut");
        let ticks = (0..100).take_while(|_| a.tick(false, 0.0) > 2_000).count();
        assert_eq!((ticks, a.rate()), (9, 2_000), "to the floor, where the next storm starts");
        assert_eq!(a.tick(false, 1_000.0), 3_000, "half used still grows by a step");
        assert_eq!(a.tick(false, 1_000.0), 3_000, "a third used does not");
    }

    #[test]
    fn a_start_outside_the_bounds_is_brought_within() {
        assert_eq!(Aimd::new(2_000, 100_000, 500_000).rate(), 100_000);
        assert_eq!(Aimd::new(2_000, 100_000, 10).rate(), 2_000);
        // A tiny ceiling still grows by at least one message per second.
        let mut a = Aimd::new(1, 50, 1);
        assert_eq!(used_up(&mut a, false), 2);
    }

    #[test]
    fn lag_over_its_target_or_slow_realtime_pushes_are_congestion() {
        let clear = Signals { lag: Duration::from_millis(10), pushes: 200, slow: 2 };
        assert_eq!(clear.congestion(&TARGETS), None, "at the target, and 1 % slow, is not congestion");
        let lag = Signals { lag: Duration::from_millis(11), ..clear };
        assert_eq!(lag.congestion(&TARGETS), Some(Congestion::Lag));
        let slow = Signals { slow: 3, ..clear };
        assert_eq!(slow.congestion(&TARGETS), Some(Congestion::Realtime));
        let idle = Signals::default();
        assert_eq!(idle.congestion(&TARGETS), None, "no pushes, nothing slow");
        assert_eq!(Signals { pushes: 1, slow: 1, ..idle }.congestion(&TARGETS), Some(Congestion::Realtime));
    }
}
