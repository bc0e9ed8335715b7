//! `typing`: what typing indicators and presence cost. Groups of `--group` members are
//! online, every device asking for `typing` and `presence` and following the presence
//! of its group's other members. Two measured phases of `--duration` each:
//!
//! - **typing**: the devices type in turn, `--rate` `typing` frames per second in
//!   total; each is shown to the group's other online members. CPU per typing frame
//!   and per typing indicator shown.
//! - **presence**: `--churn` devices per second disconnect and connect again (and
//!   follow their group again); each is two changes of its user's presence for its
//!   followers. CPU per reconnect and per `presence` frame shown.
//!
//! Nothing is stored, so there is no integrity check of messages: the report says how
//! many frames were shown against how many the fan-out owed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use herald_client::device::Device;
use herald_shared::protocol::{ClientFrame, PresenceSubscribeFrame, TypingFrame, TypingState};
use serde_json::{json, Value};

use super::{groups, report, Finished, MAX_GROUP};
use crate::cli;
use crate::cpu::{self, CpuMeter, CpuReport, CpuRow};
use crate::engine::{self, AckLog, Recorder, Target};
use crate::report::ScenarioReport;

/// A device types at most once in this long (the gateway's default burst is 4 per
/// conversation per 5 s per session).
const TYPING_EVERY_MIN: Duration = Duration::from_secs(2);
/// The most users a session follows (`gateway.presence_max_users`' default).
const FOLLOW_MAX: usize = 200;
/// How long the devices get to come online (and a churned one to come back).
const ONLINE_WITHIN: Duration = Duration::from_secs(120);

/// One device of the run: its user, its group, and the device while it runs.
struct Member {
    user: String,
    conv: String,
    /// The group's other members: whom the device follows.
    follows: Vec<String>,
    /// `None` only while it reconnects.
    device: Option<Device>,
}

impl Member {
    fn device(&self) -> &Device {
        self.device.as_ref().expect("a member's device runs but while it reconnects")
    }
}

pub async fn typing(args: &cli::Typing) -> Result<ScenarioReport> {
    let target = Target::from_args(&args.target)?;
    let (n, size) = (args.receivers, args.group);
    ensure!((2..=MAX_GROUP).contains(&size), "--group must be 2..={MAX_GROUP}");
    ensure!(n >= size, "--receivers must be at least --group");
    ensure!(args.rate > 0.0, "--rate must be > 0");
    ensure!(
        args.rate * TYPING_EVERY_MIN.as_secs_f64() <= n as f64,
        "--rate {} is more than one typing frame per device every {} s ({} devices)",
        args.rate,
        TYPING_EVERY_MIN.as_secs(),
        n
    );
    ensure!(args.duration > 0.0, "--duration must be > 0");
    ensure!(args.churn >= 0.0 && args.churn <= n as f64, "--churn must be 0..=--receivers devices per second");
    let duration = Duration::from_secs_f64(args.duration);
    let meter = CpuMeter::new(&args.target.measure).await?;
    let convs = groups(&target, "t", n, size);
    engine::provision(&target, &convs, "group").await?;
    let rec = Recorder::new();
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor = rec.monitor("typing", Duration::from_secs(1), monitor_stop.clone());

    eprintln!("connecting {} devices ...", n);
    let mut members = Vec::with_capacity(n);
    for c in &convs {
        for u in &c.receivers {
            let follows: Vec<String> = c.receivers.iter().filter(|o| *o != u).take(FOLLOW_MAX).cloned().collect();
            let device = start(&target, members.len(), u, &rec);
            members.push(Member { user: u.clone(), conv: c.id.clone(), follows, device: Some(device) });
        }
    }
    let started = Instant::now();
    for m in &members {
        let left = ONLINE_WITHIN.saturating_sub(started.elapsed());
        ensure!(m.device().wait_online(left).await, "{} did not come online within {ONLINE_WITHIN:?}", m.user);
        follow(m).await;
    }
    // Every follower is told each followed user's presence once (and, while the others
    // came online, of some their changes): wait for at least those.
    let owed_at_start: u64 = members.iter().map(|m| m.follows.len() as u64).sum();
    let shown_at_start = wait_for(&rec.presence, owed_at_start, Duration::from_secs(30)).await;
    ensure!(
        shown_at_start >= owed_at_start,
        "{shown_at_start} presence frames within 30 s; following owed {owed_at_start}"
    );
    rec.note(format!("{n} devices online; {shown_at_start} presence frames for {owed_at_start} users followed"));

    // Phase 1: typing, each device in turn.
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let (typed_before, cpu_before) = (rec.typing.load(Ordering::Relaxed), meter.snapshot().await);
    let first = Instant::now();
    let mut sent = 0u64;
    while first.elapsed() < duration {
        tokio::time::sleep_until((first + interval.mul_f64(sent as f64)).into()).await;
        let m = &members[sent as usize % members.len()];
        let frame = TypingFrame { conv: m.conv.clone(), state: TypingState::Started, reference: None };
        if m.device().send(ClientFrame::Typing(frame)).await.is_ok() {
            sent += 1;
        }
    }
    let typing_window = first.elapsed();
    // A shown frame comes within milliseconds; what has not come in a second is lost.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shown = rec.typing.load(Ordering::Relaxed) - typed_before;
    let typing_cpu = cpu::account(&cpu_before, &meter.snapshot().await, sent, shown, cpu::cores());
    let per_group = (size - 1) as u64;
    let owed = sent * per_group;
    rec.note(format!(
        "typing: {sent} frames in {:.1} s, shown {shown} times of {owed} owed; server {} us per frame, {} us per indicator shown",
        typing_window.as_secs_f64(),
        us(&typing_cpu, "server", false),
        us(&typing_cpu, "server", true)
    ));

    // Phase 2: presence, devices reconnecting in turn.
    let (presence_before, cpu_before) = (rec.presence.load(Ordering::Relaxed), meter.snapshot().await);
    let first = Instant::now();
    let mut churned = 0usize;
    if args.churn > 0.0 {
        let every = Duration::from_secs_f64(1.0 / args.churn);
        while first.elapsed() < duration {
            tokio::time::sleep_until((first + every.mul_f64(churned as f64)).into()).await;
            let index = churned % members.len();
            let m = &mut members[index];
            // Gone first, so its user goes offline (a new session of the device would
            // replace the old one and keep the user online).
            if let Some(old) = m.device.take() {
                old.stop().await;
            }
            m.device = Some(start(&target, index, &m.user, &rec));
            ensure!(m.device().wait_online(ONLINE_WITHIN).await, "{} did not come back online", m.user);
            follow(m).await;
            churned += 1;
        }
    } else {
        tokio::time::sleep(duration).await;
    }
    let presence_window = first.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let presence_shown = rec.presence.load(Ordering::Relaxed) - presence_before;
    let presence_cpu = cpu::account(&cpu_before, &meter.snapshot().await, churned as u64, presence_shown, cpu::cores());
    rec.note(format!(
        "presence: {churned} reconnects in {:.1} s, {presence_shown} presence frames shown; server {} us per reconnect, {} us per frame",
        presence_window.as_secs_f64(),
        us(&presence_cpu, "server", false),
        us(&presence_cpu, "server", true)
    ));
    monitor_stop.store(true, Ordering::Relaxed);
    monitor.await?;

    let devices: Vec<(String, Device)> = members.into_iter().filter_map(|m| Some((m.user, m.device?))).collect();
    // No message was sent: the check proves that none arrived either.
    let (integrity, logs) = engine::finish(devices, &convs, &AckLog::default()).await;
    let params = json!({"receivers": n, "group": size, "rate": args.rate, "duration_s": args.duration, "churn": args.churn, "gateways": target.gateways.len()});
    let extra = json!({
        "typing_sent": sent,
        "typing_per_s": sent as f64 / typing_window.as_secs_f64(),
        "typing_shown": shown,
        "typing_owed": owed,
        "typing_shown_share": if owed > 0 { shown as f64 / owed as f64 } else { 0.0 },
        "typing_server_us_per_frame": row(&typing_cpu, false),
        "typing_server_us_per_shown": row(&typing_cpu, true),
        "presence_followed": owed_at_start,
        "presence_shown_at_start": shown_at_start,
        "presence_reconnects": churned,
        "presence_shown": presence_shown,
        "presence_server_us_per_reconnect": row(&presence_cpu, false),
        "presence_server_us_per_shown": row(&presence_cpu, true),
    });
    let done = Finished { integrity, logs, cpu: Some(typing_cpu), load: None };
    Ok(report("typing", params, &rec, typing_window.as_secs_f64(), shown, &done, extra))
}

/// A device of `user` asking for typing and presence frames.
fn start(target: &Target, index: usize, user: &str, rec: &Arc<Recorder>) -> Device {
    let mut spec = target.device_spec(index, user, "d");
    spec.typing_and_presence = true;
    Device::spawn(spec, rec.clone())
}

/// The device follows its group's other members.
async fn follow(m: &Member) {
    let frame = PresenceSubscribeFrame { users: m.follows.clone(), reference: None };
    let _ = m.device().send(ClientFrame::PresenceSubscribe(frame)).await;
}

/// Waits until `counter` reaches `want` or `limit` passes; what it reached.
async fn wait_for(counter: &std::sync::atomic::AtomicU64, want: u64, limit: Duration) -> u64 {
    let started = Instant::now();
    while counter.load(Ordering::Relaxed) < want && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    counter.load(Ordering::Relaxed)
}

/// A total's CPU microseconds per counted item: per frame shown with `per_shown`, else
/// per frame sent (typing) or reconnect (presence).
fn per(r: &CpuRow, per_shown: bool) -> Option<f64> {
    if per_shown {
        r.us_per_delivery
    } else {
        r.us_per_message
    }
}

/// Every total's CPU per counted item, by process group, as the report's extra.
fn row(c: &CpuReport, per_shown: bool) -> Value {
    let totals =
        c.totals.iter().filter_map(|r| Some((r.name.clone(), json!((per(r, per_shown)? * 10.0).round() / 10.0))));
    Value::Object(totals.collect())
}

/// One total's CPU per counted item, for the progress notes.
fn us(c: &CpuReport, name: &str, per_shown: bool) -> String {
    c.total(name).and_then(|r| per(r, per_shown)).map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The scenario's options, as the command line gives them.
    fn args(more: &[&str]) -> cli::Typing {
        let words = ["herald-loadtest", "typing", "--secret", "s", "--gateways", "http://127.0.0.1:9"];
        match cli::Cli::try_parse_from(words.iter().chain(more)).expect("parses").command {
            cli::Command::Typing(t) => t,
            other => panic!("typing, not {other:?}"),
        }
    }

    /// Options the gateway would refuse or that measure nothing stop the run before
    /// it connects to anything, with the option named.
    #[tokio::test]
    async fn bad_options_are_refused_before_any_connection() {
        for (more, says) in [
            (
                &["--rate", "100", "--receivers", "20", "--group", "5"][..],
                "--rate 100 is more than one typing frame per device every 2 s",
            ),
            (&["--group", "1"][..], "--group must be 2..="),
            (&["--receivers", "10", "--group", "20"][..], "--receivers must be at least --group"),
            (&["--rate", "0"][..], "--rate must be > 0"),
            (&["--duration", "0"][..], "--duration must be > 0"),
            (&["--receivers", "20", "--group", "5", "--rate", "5", "--churn", "30"][..], "--churn must be"),
        ] {
            let e = typing(&args(more)).await.err().unwrap_or_else(|| panic!("{more:?} is refused"));
            assert!(e.to_string().contains(says), "{more:?}: {e}");
        }
    }
}
