//! The senders of a scenario: one per conversation, over HTTP (`POST /v1/messages`).
//! Each keeps an open-loop schedule ([`crate::load`]): message `n` is due at a
//! fixed time; a sender behind its schedule sends what is due as soon as a send slot
//! frees (up to `in_flight` sends waiting for answers at once), and every latency counts
//! from the due time. Every send is retried with its `cmid` until the server commits it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use herald_client::HttpClient;
use herald_shared::protocol::SendResult;
use serde_json::{json, Value};

use crate::engine::{send_durably, AckLog, Conv, SendPlan, Target};
use crate::integrity::Acked;
use crate::load::{Clock, Schedule};
use crate::recorder::Recorder;

/// A send gives up (counts as not acknowledged) after this long.
const DEADLINE: Duration = Duration::from_secs(120);
/// A sender waiting for its next due time still looks at the stop flag this often.
const STOP_POLL: Duration = Duration::from_millis(100);

/// How the senders of a scenario send, beside the [`SendPlan`].
#[derive(Clone, Copy, Debug)]
pub struct SenderOptions {
    /// Sends each sender may have waiting for an answer at once.
    pub in_flight: usize,
    /// No send is due from this time on (the end of the send window); `None`: until stopped.
    pub until: Option<Instant>,
}

impl Default for SenderOptions {
    fn default() -> Self {
        SenderOptions { in_flight: 1, until: None }
    }
}

/// One transport per conversation's sender, ready to send.
pub struct Ready(Vec<Transport>);

/// One sender per conversation.
pub async fn connect(target: &Target, convs: &[Conv]) -> Result<Ready> {
    Ok(Ready(convs.iter().map(|c| http(target, c)).collect()))
}

/// HTTP senders, started at once.
pub fn spawn_http(
    target: &Target,
    convs: &[Conv],
    plan: &SendPlan,
    rec: &Arc<Recorder>,
    acked: &AckLog,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let ready = Ready(convs.iter().map(|c| http(target, c)).collect());
    spawn(ready, convs, plan, SenderOptions::default(), rec, acked, stop)
}

fn http(target: &Target, c: &Conv) -> Transport {
    Transport::Http((0..target.gateways.len()).map(|g| target.http_as(g, &c.sender, "s")).collect())
}

/// Starts the senders of `ready`, together offering `plan.rate` msg/s (0: each as fast
/// as its answers come) from now, until `stop`.
pub fn spawn(
    Ready(transports): Ready,
    convs: &[Conv],
    plan: &SendPlan,
    opts: SenderOptions,
    rec: &Arc<Recorder>,
    acked: &AckLog,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let interval = (plan.rate > 0.0).then(|| Duration::from_secs_f64(convs.len() as f64 / plan.rate));
    let start = Instant::now();
    transports
        .into_iter()
        .zip(convs)
        .enumerate()
        .map(|(k, (transport, c))| {
            // Spread the first sends over one interval so the senders do not beat in step.
            let schedule = interval.map(|i| Schedule { first: start + i.mul_f64(k as f64 / 97.0 % 1.0), interval: i });
            let opts = SenderOptions { in_flight: opts.in_flight.max(1), ..opts };
            let sender = Sender {
                k,
                conv: c.clone(),
                transport,
                prefix: plan.cmid_prefix.clone(),
                pad: "x".repeat(plan.payload.saturating_sub(50)),
                schedule,
                opts,
            };
            tokio::spawn(sender.run(rec.clone(), acked.clone(), stop.clone()))
        })
        .collect()
}

/// What a sender sends through.
enum Transport {
    /// One client per gateway: a send moves to the next when one is unreachable.
    Http(Vec<HttpClient>),
}

impl Transport {
    async fn send(&self, first: usize, cmid: &str, conv: &str, body: &Value) -> Result<SendResult> {
        match self {
            Transport::Http(clients) => Ok(send_durably(clients, first, cmid, conv, body, DEADLINE).await?),
        }
    }

    async fn close(self) {}
}

/// One sender: its conversation, its schedule (none: closed loop) and its transport.
struct Sender {
    k: usize,
    conv: Conv,
    transport: Transport,
    prefix: String,
    pad: String,
    schedule: Option<Schedule>,
    opts: SenderOptions,
}

/// A send that ended: its `cmid`, when it was due and sent, and the server's answer.
type Done = (String, Instant, Instant, Result<SendResult>);

impl Sender {
    async fn run(self, rec: Arc<Recorder>, acked: AckLog, stop: Arc<AtomicBool>) {
        let Sender { k, conv, transport, prefix, pad, schedule, opts } = self;
        let clock = Clock::now();
        let finish = |(cmid, due, sent, r): Done| {
            let now = Instant::now();
            match r {
                Ok(r) => {
                    rec.send_done(now.duration_since(due), now.duration_since(sent));
                    acked.lock().expect("log").push(Acked::of(&r, &conv.sender, "s", cmid));
                }
                Err(e) => {
                    if rec.send_errors.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("send failed: {e:#}");
                    }
                }
            }
        };
        let mut in_flight = FuturesUnordered::new();
        let mut n = 0u64;
        // When a send slot last freed after all were busy: a send due before then waited
        // for the server, not for the load generator.
        let mut freed = Instant::now();
        let stopped_at = loop {
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) {
                break now;
            }
            if in_flight.len() >= opts.in_flight {
                if let Some(done) = in_flight.next().await {
                    finish(done);
                }
                freed = Instant::now();
                continue;
            }
            let due = schedule.map_or(now, |s| s.due(n));
            if opts.until.is_some_and(|until| due >= until) {
                // The window is over: wait for the stop, collecting answers.
                tokio::select! {
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => finish(done),
                    _ = tokio::time::sleep(STOP_POLL) => {}
                }
                continue;
            }
            if due > now {
                let wake = due.min(now + STOP_POLL);
                tokio::select! {
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => finish(done),
                    _ = tokio::time::sleep_until(wake.into()) => {}
                }
                continue;
            }
            if schedule.is_some() {
                rec.send_issued(now.duration_since(due), now.duration_since(due.max(freed)));
            } else {
                rec.sent.fetch_add(1, Ordering::Relaxed);
            }
            let cmid = format!("{prefix}{n}");
            let body = json!({"t0": clock.micros(now), "ti": clock.micros(due), "pad": pad});
            let (transport, conv_id) = (&transport, &conv.id);
            in_flight.push(async move {
                let r = transport.send(k, &cmid, conv_id, &body).await;
                (cmid, due, now, r)
            });
            n += 1;
        };
        while let Some(done) = in_flight.next().await {
            finish(done);
        }
        drop(in_flight);
        if let Some(s) = schedule {
            let end = opts.until.map_or(stopped_at, |u| u.min(stopped_at));
            rec.unsent_due.fetch_add(s.due_before(end).saturating_sub(n), Ordering::Relaxed);
        }
        transport.close().await;
    }
}
