//! The senders of a scenario: one per conversation, over HTTP (`POST /v1/messages`) or
//! over the sender's own WebSocket session (`send` frames answered by `sent`, matched by
//! `cmid`). Each keeps an open-loop schedule ([`crate::load`]): message `n` is due at a
//! fixed time; a sender behind its schedule sends what is due as soon as a send slot
//! frees (up to `in_flight` sends waiting for answers at once), and every latency counts
//! from the due time. Every send is retried with its `cmid` until the server commits it.
//! With `change_every`, a sender also edits or recalls its latest message now and then
//! (over HTTP, durably like a send): timeline events the integrity check counts too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use herald_client::device::{Device, Observer, Via};
use herald_client::HttpClient;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ClientFrame, ErrorFrame, Message, SendFrame, SendResult, ServerFrame};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::cli::SendVia;
use crate::engine::{change_durably, send_durably, AckLog, Conv, SendPlan, Target};
use crate::integrity::Acked;
use crate::load::{Clock, Schedule};
use crate::pacer::Pacer;
use crate::recorder::Recorder;

/// A send gives up (counts as not acknowledged) after this long.
const DEADLINE: Duration = Duration::from_secs(120);
/// A `send` frame without an answer this long is sent again (same `cmid`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// A sender waiting for its next due time still looks at the stop flag this often.
const STOP_POLL: Duration = Duration::from_millis(100);
/// The last stretch before a due time, slept on the [`Pacer`] rather than tokio's timer.
const PRECISE: Duration = Duration::from_millis(3);

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

/// One transport per conversation's sender, connected (WebSocket senders are online),
/// and its HTTP clients for timeline changes.
pub struct Ready(Vec<Transport>, Vec<Vec<HttpClient>>);

/// Connects one sender per conversation: HTTP clients, or devices of the senders whose
/// sessions are open before this returns (so the schedule does not start with them).
pub async fn connect(target: &Target, convs: &[Conv], via: SendVia) -> Result<Ready> {
    let changes = convs.iter().map(|c| clients(target, c)).collect();
    let transports = match via {
        SendVia::Http => convs.iter().map(|c| http(target, c)).collect(),
        SendVia::Ws => {
            eprintln!("connecting {} senders over WebSocket ...", convs.len());
            let senders: Vec<WsSender> =
                convs.iter().enumerate().map(|(k, c)| WsSender::start(target, k, &c.sender)).collect();
            for (s, c) in senders.iter().zip(convs) {
                ensure!(
                    s.device.wait_online(Duration::from_secs(60)).await,
                    "the sender {} could not open its WebSocket session",
                    c.sender
                );
            }
            senders.into_iter().map(Transport::Ws).collect()
        }
    };
    Ok(Ready(transports, changes))
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
    let ready =
        Ready(convs.iter().map(|c| http(target, c)).collect(), convs.iter().map(|c| clients(target, c)).collect());
    spawn(ready, convs, plan, SenderOptions::default(), rec, acked, stop)
}

fn http(target: &Target, c: &Conv) -> Transport {
    Transport::Http(clients(target, c))
}

/// The sender's HTTP clients, one per gateway.
fn clients(target: &Target, c: &Conv) -> Vec<HttpClient> {
    (0..target.gateways.len()).map(|g| target.http_as(g, &c.sender, "s")).collect()
}

/// Starts the senders of `ready`, together offering `plan.rate` msg/s (0: each as fast
/// as its answers come) from now, until `stop`.
pub fn spawn(
    Ready(transports, changes): Ready,
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
        .zip(changes)
        .zip(convs)
        .enumerate()
        .map(|(k, ((transport, changes), c))| {
            // Spread the first sends over one interval so the senders do not beat in step.
            let schedule = interval.map(|i| Schedule { first: start + i.mul_f64(k as f64 / 97.0 % 1.0), interval: i });
            let opts = SenderOptions { in_flight: opts.in_flight.max(1), ..opts };
            let sender = Sender {
                k,
                conv: c.clone(),
                transport,
                changes,
                change_every: plan.change_every,
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
    Ws(WsSender),
}

impl Transport {
    async fn send(&self, first: usize, cmid: &str, conv: &str, body: &Value) -> Result<SendResult> {
        match self {
            Transport::Http(clients) => Ok(send_durably(clients, first, cmid, conv, body, DEADLINE).await?),
            Transport::Ws(w) => w.send(cmid, conv, body).await,
        }
    }

    async fn close(self) {
        if let Transport::Ws(w) = self {
            w.device.stop().await;
        }
    }
}

/// One sender: its conversation, its schedule (none: closed loop) and its transport.
struct Sender {
    k: usize,
    conv: Conv,
    transport: Transport,
    /// HTTP clients for timeline changes, and how often one follows a send (0: never).
    changes: Vec<HttpClient>,
    change_every: u64,
    prefix: String,
    pad: String,
    schedule: Option<Schedule>,
    opts: SenderOptions,
}

/// A send that ended: its `cmid`, when it was due, sent and answered, the server's
/// answer, and the timeline change that followed it (its key and answer), if any.
type Done = (String, Instant, Instant, Instant, Result<SendResult>, Option<(String, Result<SendResult>)>);

impl Sender {
    async fn run(self, rec: Arc<Recorder>, acked: AckLog, stop: Arc<AtomicBool>) {
        let Sender { k, conv, transport, changes, change_every, prefix, pad, schedule, opts } = self;
        let clock = Clock::now();
        let failed = |e: anyhow::Error| {
            if rec.send_errors.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("send failed: {e:#}");
            }
        };
        let finish = |(cmid, due, sent, answered, r, change): Done| {
            match r {
                Ok(r) => {
                    rec.send_done(answered.duration_since(due), answered.duration_since(sent));
                    acked.lock().expect("log").push(Acked::of(&r, &conv.sender, "s", cmid));
                }
                Err(e) => failed(e),
            }
            match change {
                Some((key, Ok(r))) => acked.lock().expect("log").push(Acked::event(&r, &conv.sender, "s", key)),
                Some((_, Err(e))) => failed(e),
                None => {}
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
                // tokio's timer until shortly before the due time (it wakes up to ~1.5 ms
                // late), the pacer for the rest: one precise wake-up per send.
                let coarse = due.min(now + STOP_POLL).checked_sub(PRECISE).filter(|t| *t > now);
                tokio::select! {
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => finish(done),
                    _ = tokio::time::sleep_until(coarse.unwrap_or(now).into()), if coarse.is_some() => {}
                    _ = Pacer::global().sleep_until(due), if coarse.is_none() => {}
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
            let (transport, conv_id, changes) = (&transport, &conv.id, &changes);
            // Every `change_every`th message is edited, the next time recalled.
            let change = (change_every > 0 && (n + 1).is_multiple_of(change_every))
                .then(|| (n / change_every).is_multiple_of(2));
            in_flight.push(async move {
                let r = transport.send(k, &cmid, conv_id, &body).await;
                let answered = Instant::now();
                let changed = match (&r, change) {
                    (Ok(sent), Some(edit)) => {
                        let key = format!("{cmid}-c");
                        let new_body = edit.then(|| json!({"edited": n}));
                        let r = change_durably(changes, k, sent.id, &key, new_body.as_ref(), DEADLINE).await;
                        Some((key, r.map_err(anyhow::Error::from)))
                    }
                    _ => None,
                };
                (cmid, due, now, answered, r, changed)
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

/// A sender's WebSocket session: a device of the sender's user (`s`) whose observer
/// hands each `sent` or `error` answer to the send waiting for it.
struct WsSender {
    device: Device,
    answers: Arc<Answers>,
}

/// What a `send` frame got back.
#[derive(Debug)]
enum Answer {
    Sent(SendResult),
    Refused(ErrorFrame),
    /// The session ended before an answer came: the frame may or may not have arrived.
    Lost,
}

/// Sends waiting for their answer, by `cmid`: one sender's own, so its lock is uncontended.
#[derive(Default)]
struct Answers {
    waiting: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
}

impl Observer for Answers {
    fn message(&self, _: &Message, _: Via, _: Duration) {}
    fn caught_up(&self, _: Duration) {}

    fn online(&self, up: bool) {
        if !up {
            for (_, tx) in self.waiting.lock().expect("answers").drain() {
                let _ = tx.send(Answer::Lost);
            }
        }
    }

    fn frame(&self, frame: &ServerFrame) {
        let (cmid, answer) = match frame {
            ServerFrame::Sent(s) => {
                let r = SendResult { id: s.id, conv: s.conv.clone(), seq: s.seq, ts: s.ts, dup: s.dup };
                (&s.cmid, Answer::Sent(r))
            }
            ServerFrame::Error(e) => match &e.reference {
                Some(cmid) => (cmid, Answer::Refused(e.clone())),
                None => return,
            },
            _ => return,
        };
        if let Some(tx) = self.waiting.lock().expect("answers").remove(cmid) {
            let _ = tx.send(answer);
        }
    }
}

impl WsSender {
    fn start(target: &Target, index: usize, user: &str) -> WsSender {
        let answers = Arc::new(Answers::default());
        let device = Device::spawn(target.device_spec(index, user, "s"), answers.clone());
        WsSender { device, answers }
    }

    /// Sends until the server commits: on `unavailable`, `rate_limited`, a lost session or
    /// no answer it sends again with the same `cmid` (the device queues frames while it
    /// reconnects). Gives up after [`DEADLINE`].
    async fn send(&self, cmid: &str, conv: &str, body: &Value) -> Result<SendResult> {
        let body = serde_json::value::to_raw_value(body)?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let (tx, rx) = oneshot::channel();
            self.answers.waiting.lock().expect("answers").insert(cmid.to_owned(), tx);
            let frame = SendFrame { cmid: cmid.to_owned(), conv: conv.to_owned(), body: body.clone() };
            self.device.send(ClientFrame::Send(frame)).await.context("the sender's device ended")?;
            let wait = match tokio::time::timeout(ANSWER_TIMEOUT, rx).await {
                Ok(Ok(Answer::Sent(r))) => return Ok(r),
                Ok(Ok(Answer::Refused(e))) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::RateLimited) => {
                    e.retry_after_ms.map_or(pause, Duration::from_millis)
                }
                Ok(Ok(Answer::Refused(e))) => bail!("{cmid} refused: {:?}: {}", e.code, e.message),
                Ok(Ok(Answer::Lost)) | Ok(Err(_)) => pause,
                Err(_) => Duration::ZERO,
            };
            if started.elapsed() + wait > DEADLINE {
                bail!("{cmid}: not committed within {DEADLINE:?}");
            }
            tokio::time::sleep(wait).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::ids::MsgId;
    use herald_shared::protocol::Sent;

    #[test]
    fn answers_reach_the_send_waiting_for_their_cmid() {
        let a = Answers::default();
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        let (tx3, mut rx3) = oneshot::channel();
        a.waiting.lock().unwrap().extend([("m1".to_string(), tx1), ("m2".to_string(), tx2), ("m3".to_string(), tx3)]);
        let r = SendResult { id: MsgId(7), conv: "c".into(), seq: 3, ts: 1, dup: false };
        a.frame(&ServerFrame::Sent(Sent::new("m2", &r)));
        assert!(matches!(rx2.try_recv(), Ok(Answer::Sent(s)) if s == r));
        let refused = ErrorFrame { reference: Some("m1".into()), ..ErrorFrame::new(ErrorCode::Unavailable, "later") };
        a.frame(&ServerFrame::Error(refused));
        assert!(matches!(rx1.try_recv(), Ok(Answer::Refused(e)) if e.code == ErrorCode::Unavailable));
        // an error without a ref answers nobody
        a.frame(&ServerFrame::Error(ErrorFrame::new(ErrorCode::Unavailable, "ack not recorded")));
        assert!(rx3.try_recv().is_err());
        // a lost session fails what is still waiting, to be sent again
        a.online(false);
        assert!(matches!(rx3.try_recv(), Ok(Answer::Lost)));
        assert!(a.waiting.lock().unwrap().is_empty());
    }
}
