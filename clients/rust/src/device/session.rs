//! One session of a device, after `hello`: a single loop over the socket, the app's
//! frames, a half-second tick (pings, liveness, gap filling, token refresh) and the
//! stop signal. It acks every `msg` (the ids of a burst in one frame, as docs/client.md
//! asks), keeps the timelines, refreshes the token before it expires, and ends with
//! what the next attempt needs to know.

use std::time::{Duration, Instant};

use herald_shared::error::ErrorCode;
use herald_shared::protocol::{AckFrame, ClientFrame, PingFrame, ServerFrame, SyncFrame, TokenFrame};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::liveness::Liveness;
use super::reconnect::Hints;
use super::timeline::State;
use super::token::{exp_of, refresh_at, TokenReason};
use super::{DeviceSpec, Observer, Outgoing, Via};
use crate::ws::{WsClient, WsEvent};

/// A refused refresh is tried again this much later (the session still ends at the old
/// token's `exp`; a token source may have a better one by then), unless the gateway did
/// not know the frame.
const REFRESH_RETRY: Duration = Duration::from_secs(5);

/// Acks wait this long for more ids to share their frame...
const ACK_LINGER: Duration = Duration::from_millis(2);
/// ...or until this many are waiting.
const ACK_MAX: usize = 128;

/// How a session ended.
#[derive(Clone, Copy)]
pub(super) enum SessionEnd {
    /// The app stopped the device.
    Stopped,
    /// Closed with this code (`None`: lost without a close frame, or given up as silent),
    /// with what the server said before.
    Closed { code: Option<u16>, hints: Hints },
}

/// The in-session refresh of the token: when it is due, the token being fetched, and
/// the one sent and not yet confirmed.
#[derive(Default)]
struct Refresh {
    due: Option<Instant>,
    fetching: Option<JoinHandle<Option<String>>>,
    /// (`ref`, token) of the `refresh` frame awaiting `refreshed`.
    sent: Option<(String, String)>,
    count: u64,
}

pub(super) struct Session<'a> {
    pub(super) spec: &'a DeviceSpec,
    pub(super) ws: &'a mut WsClient,
    pub(super) st: &'a mut State,
    pub(super) observer: &'a dyn Observer,
    /// When the upgrade began.
    pub(super) started: Instant,
    pub(super) hb: Duration,
    /// The session's token; one the server confirmed in `refreshed` replaces it.
    pub(super) token: &'a mut String,
}

impl Session<'_> {
    pub(super) async fn run(
        &mut self,
        stopped: &mut watch::Receiver<bool>,
        out: &mut mpsc::Receiver<Outgoing>,
    ) -> SessionEnd {
        let mut refresh = Refresh::default();
        if self.spec.token_source.is_some() {
            refresh.due = exp_of(self.token).map(|exp| self.refresh_due(exp));
        }
        let ended = self.serve(stopped, out, &mut refresh).await;
        if let Some(fetching) = refresh.fetching {
            fetching.abort();
        }
        ended
    }

    fn refresh_due(&self, exp: u64) -> Instant {
        refresh_at(exp, self.spec.refresh_before, Instant::now(), herald_shared::ids::now_ms())
    }

    async fn serve(
        &mut self,
        stopped: &mut watch::Receiver<bool>,
        out: &mut mpsc::Receiver<Outgoing>,
        refresh: &mut Refresh,
    ) -> SessionEnd {
        let lost = SessionEnd::Closed { code: None, hints: Hints::default() };
        let mut caught_up = false;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_ping = Instant::now();
        let mut liveness = Liveness::new(self.hb, Instant::now());
        let mut hints = Hints::default();
        // Ids received and not yet acked, and when they are due.
        let (mut acks, mut acks_due) = (Vec::new(), tokio::time::Instant::now());
        loop {
            tokio::select! {
                _ = stopped.changed() => {
                    if !acks.is_empty() {
                        let _ = self.ws.send(&ClientFrame::Ack(AckFrame { ids: std::mem::take(&mut acks) })).await;
                    }
                    return SessionEnd::Stopped;
                }
                () = tokio::time::sleep_until(acks_due), if !acks.is_empty() => {
                    if self.ws.send(&ClientFrame::Ack(AckFrame { ids: std::mem::take(&mut acks) })).await.is_err() {
                        return lost;
                    }
                }
                Some(o) = out.recv() => {
                    let sent = match o {
                        Outgoing::Frame(f) => self.ws.send(&f).await,
                        Outgoing::Text(t) => self.ws.send_text(&t).await,
                    };
                    if sent.is_err() {
                        return lost;
                    }
                }
                fetched = async { refresh.fetching.as_mut().expect("guarded").await }, if refresh.fetching.is_some() => {
                    refresh.fetching = None;
                    // No token: the session ends at its token's `exp`, and the next
                    // connection asks again.
                    if let Ok(Some(token)) = fetched {
                        refresh.count += 1;
                        let reference = format!("refresh-{}", refresh.count);
                        let frame = TokenFrame { token: token.clone(), reference: Some(reference.clone()) };
                        if self.ws.send(&ClientFrame::Refresh(frame)).await.is_err() {
                            return lost;
                        }
                        refresh.sent = Some((reference, token));
                    }
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if liveness.is_lost(now) {
                        return lost;
                    }
                    if now.duration_since(last_ping) >= self.hb / 2 {
                        last_ping = now;
                        if self.ws.send(&ClientFrame::Ping(PingFrame { ts: None })).await.is_err() {
                            return lost;
                        }
                    }
                    if caught_up && !self.fill_gaps(now).await {
                        return lost;
                    }
                    if let (Some(due), Some(source)) = (refresh.due, &self.spec.token_source) {
                        if now >= due && refresh.fetching.is_none() && refresh.sent.is_none() {
                            refresh.due = None;
                            refresh.fetching = Some(tokio::spawn(source.get(TokenReason::Refresh)));
                        }
                    }
                }
                ev = self.ws.next(Duration::from_secs(3600)) => match ev {
                    Some(WsEvent::Frame(f)) => {
                        liveness.heard(Instant::now());
                        match f {
                            ServerFrame::Msg(m) => {
                                let via = if caught_up { Via::Realtime } else { Via::Backlog };
                                self.observer.message(&m, via, self.started.elapsed());
                                self.st.arrive_message(&m, via);
                                if acks.is_empty() {
                                    acks_due = tokio::time::Instant::now() + ACK_LINGER;
                                }
                                acks.push(m.id);
                                if acks.len() >= ACK_MAX
                                    && self.ws.send(&ClientFrame::Ack(AckFrame { ids: std::mem::take(&mut acks) })).await.is_err()
                                {
                                    return lost;
                                }
                            }
                            other => {
                                self.observer.frame(&other);
                                match other {
                                    ServerFrame::CaughtUp(_) if !caught_up => {
                                        caught_up = true;
                                        self.st.log.catch_ups.push(self.started.elapsed());
                                        self.observer.caught_up(self.started.elapsed());
                                    }
                                    ServerFrame::History(h) => {
                                        // This device's start (`start_seq`), else its user's
                                        // membership's (`joined_seq`, older servers).
                                        if let Some(start) = h.joined_seq.max(h.start_seq) {
                                            self.st.joined(&h.conv, start);
                                        }
                                        for m in &h.items {
                                            self.st.arrive_message(m, Via::Sync);
                                        }
                                        if let Some(t) = self.st.timelines.get_mut(&h.conv) {
                                            t.settle(h.more);
                                        }
                                    }
                                    ServerFrame::Refreshed(r) => {
                                        if let Some((_, token)) = refresh.sent.take_if(|(re, _)| r.reference.as_ref() == Some(re)) {
                                            *self.token = token;
                                            refresh.due = Some(self.refresh_due(r.exp));
                                        }
                                    }
                                    ServerFrame::Error(e) => {
                                        if refresh.sent.take_if(|(re, _)| e.reference.as_ref() == Some(re)).is_some() {
                                            // `bad_request`: a gateway older than `refresh`, where
                                            // each try is a protocol error (the 10th closes with 4009).
                                            let again = e.code != ErrorCode::BadRequest;
                                            refresh.due = again.then(|| Instant::now() + REFRESH_RETRY);
                                        } else if e.code == ErrorCode::RateLimited && e.reference.is_none() {
                                            hints.retry_after = e.retry_after_ms.map(Duration::from_millis);
                                        }
                                    }
                                    ServerFrame::Reconnect(r) => hints.reconnect_after = Some(Duration::from_millis(r.after_ms)),
                                    _ => {}
                                }
                            }
                        }
                    }
                    Some(WsEvent::Other(_)) => liveness.heard(Instant::now()),
                    Some(WsEvent::Closed(code)) => {
                        self.observer.closed(code);
                        return SessionEnd::Closed { code, hints };
                    }
                    None => return SessionEnd::Closed { code: None, hints },
                },
            }
        }
    }

    /// Asks for what a gap still open after `caught_up` is missing; false when the
    /// session is gone.
    async fn fill_gaps(&mut self, now: Instant) -> bool {
        for (conv, after) in self.st.gaps_to_fill(now, self.spec.gap_sync_after) {
            let f = ClientFrame::Sync(SyncFrame {
                conv: conv.clone(),
                after_seq: after,
                limit: Some(200),
                reference: Some(conv),
            });
            if self.ws.send(&f).await.is_err() {
                return false;
            }
        }
        true
    }
}
