//! One session of a device, after `hello`: a single loop over the socket, the app's
//! frames, a half-second tick (pings, liveness, gap filling) and the stop signal. It
//! acks every `msg`, keeps the timelines, and ends with what the next attempt needs to
//! know.

use std::time::{Duration, Instant};

use herald_shared::error::ErrorCode;
use herald_shared::protocol::{AckFrame, ClientFrame, PingFrame, ServerFrame, SyncFrame};
use tokio::sync::{mpsc, watch};

use super::liveness::Liveness;
use super::reconnect::Hints;
use super::timeline::State;
use super::{DeviceSpec, Observer, Outgoing, Via};
use crate::ws::{WsClient, WsEvent};

/// How a session ended.
#[derive(Clone, Copy)]
pub(super) enum SessionEnd {
    /// The app stopped the device.
    Stopped,
    /// Closed with this code (`None`: lost without a close frame, or given up as silent),
    /// with what the server said before.
    Closed { code: Option<u16>, hints: Hints },
}

pub(super) struct Session<'a> {
    pub(super) spec: &'a DeviceSpec,
    pub(super) ws: &'a mut WsClient,
    pub(super) st: &'a mut State,
    pub(super) observer: &'a dyn Observer,
    /// When the upgrade began.
    pub(super) started: Instant,
    pub(super) hb: Duration,
}

impl Session<'_> {
    pub(super) async fn run(
        &mut self,
        stopped: &mut watch::Receiver<bool>,
        out: &mut mpsc::Receiver<Outgoing>,
    ) -> SessionEnd {
        let lost = SessionEnd::Closed { code: None, hints: Hints::default() };
        let mut caught_up = false;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_ping = Instant::now();
        let mut liveness = Liveness::new(self.hb, Instant::now());
        let mut hints = Hints::default();
        loop {
            tokio::select! {
                _ = stopped.changed() => return SessionEnd::Stopped,
                Some(o) = out.recv() => {
                    let sent = match o {
                        Outgoing::Frame(f) => self.ws.send(&f).await,
                        Outgoing::Text(t) => self.ws.send_text(&t).await,
                    };
                    if sent.is_err() {
                        return lost;
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
                }
                ev = self.ws.next(Duration::from_secs(3600)) => match ev {
                    Some(WsEvent::Frame(f)) => {
                        liveness.heard(Instant::now());
                        match f {
                            ServerFrame::Msg(m) => {
                                let via = if caught_up { Via::Realtime } else { Via::Backlog };
                                self.observer.message(&m, via, self.started.elapsed());
                                self.st.arrive(m.id.0, &m.conv, m.seq, via);
                                if self.ws.send(&ClientFrame::Ack(AckFrame { ids: vec![m.id] })).await.is_err() {
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
                                        if let Some(joined) = h.joined_seq {
                                            self.st.joined(&h.conv, joined);
                                        }
                                        for m in &h.items {
                                            self.st.arrive(m.id.0, &h.conv, m.seq, Via::Sync);
                                        }
                                        if let Some(t) = self.st.timelines.get_mut(&h.conv) {
                                            t.settle(h.more);
                                        }
                                    }
                                    ServerFrame::Error(e) if e.code == ErrorCode::RateLimited && e.reference.is_none() => {
                                        hints.retry_after = e.retry_after_ms.map(Duration::from_millis);
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
