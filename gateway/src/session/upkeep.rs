//! The session's timer and its upkeep: the heartbeat (pings, idle limit, half-open
//! probe), a new Redis epoch, a presence that vanished, and the device's watermark
//! report; the timer also ends the session at the token's expiry, resumes a paced
//! backlog and flushes batched acks.
//!
//! One timer per session, set to whatever is due first, instead of a one-second tick
//! plus a timer per deadline: an idle session is woken only to ping (18 000 idle
//! sessions cost 18 000 wake-ups a second with the tick). A new epoch wakes every
//! session through the node's one signal ([`crate::epoch::EpochWatch::subscribe`]).

use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::Message;
use futures::{Sink, Stream};
use herald_shared::protocol::CloseCode;
use tokio::time::Instant;

use super::inflight::Dead;
use super::presence::Kept;
use super::{End, Flow, Session, LOGGED_OUT, REPLACED};
use crate::recovery::RecoveryError;
use crate::watermarks::Mark;

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// When the timer must fire next.
    pub(super) fn next_due(&self) -> Instant {
        let mut due = self
            .heartbeat
            .next_due(self.last_upkeep, &self.inflight)
            .min(self.last_mark + self.mark_every())
            .min(self.expires);
        if self.epoch.is_behind(&self.env.epoch) {
            // A rebuild for a new epoch failed: retried every second.
            due = due.min(self.last_upkeep + Duration::from_secs(1));
        }
        for at in [self.backlog.resume_at(), self.acks.due(), self.status_due()].into_iter().flatten() {
            due = due.min(at);
        }
        due
    }

    /// The timer fired: whatever is due now.
    pub(super) async fn on_timer(&mut self) -> Flow {
        let now = Instant::now();
        if now >= self.expires {
            return ControlFlow::Break(End::Close(CloseCode::Unauthorized, "token expired"));
        }
        if self.backlog.resume_at().is_some_and(|t| t <= now) {
            self.backlog.resume();
        }
        if self.acks.due().is_some_and(|t| t <= now) {
            self.on_ack_due().await?;
        }
        if self.status_due().is_some_and(|t| t <= now) {
            self.show_due_statuses(now).await;
        }
        let upkeep_due =
            self.heartbeat.next_due(self.last_upkeep, &self.inflight).min(self.last_mark + self.mark_every());
        if upkeep_due <= now || self.epoch.is_behind(&self.env.epoch) {
            self.last_upkeep = now;
            return self.on_upkeep().await;
        }
        ControlFlow::Continue(())
    }

    async fn on_upkeep(&mut self) -> Flow {
        self.check_epoch().await?;
        if self.last_mark.elapsed() >= self.mark_every() {
            self.report_watermark().await;
        }
        let beat = match self.heartbeat.tick(Instant::now(), &self.inflight) {
            Ok(beat) => beat,
            Err(Dead::Idle) => {
                metrics::counter!("herald_heartbeat_timeouts_total").increment(1);
                return ControlFlow::Break(End::Close(CloseCode::HeartbeatTimeout, "heartbeat timeout"));
            }
            Err(Dead::HalfOpen) => {
                metrics::counter!("herald_half_open_closes_total").increment(1);
                return ControlFlow::Break(End::Close(
                    CloseCode::HeartbeatTimeout,
                    "unacked pushes and no pong: half-open",
                ));
            }
        };
        if beat.probe {
            metrics::counter!("herald_ack_timeouts_total").increment(1);
        }
        if beat.ping {
            self.ping().await;
        }
        let kept =
            if beat.keepalive { self.presence.keep(self.env.redis.next(), &self.env.keys).await } else { Kept::Held };
        if kept == Kept::Superseded {
            // A newer session of the device claimed its presence; its kick was lost.
            return ControlFlow::Break(End::Close(CloseCode::Replaced, REPLACED));
        }
        if kept == Kept::SetAgain {
            // The presence expired (Redis paused) or went with the data of the user's
            // slot. In a Redis Cluster a master other than the epoch's can lose its
            // data with the epoch unchanged: the device's marker went too, and this
            // restores the pending set from MySQL (a no-op while the marker is there).
            tracing::info!("presence was missing; set again and the pending set read again");
            match self.env.recovery.ensure_pending(&self.device, &self.epoch.epoch, None, None).await {
                Ok(_) => {}
                // Its presence went because it logged out (on another node, whose kick
                // did not arrive).
                Err(RecoveryError::Unregistered) => {
                    return ControlFlow::Break(End::Close(CloseCode::Replaced, LOGGED_OUT));
                }
                Err(e) => tracing::warn!(error = %e, "pending set rebuild failed"),
            }
            // Workers skipped pushes to this device while it had no presence; they
            // are still in its pending set.
            self.backlog.restart();
        }
        ControlFlow::Continue(())
    }

    /// Redis lost its data: restore the pending set from MySQL, read it again.
    pub(super) async fn check_epoch(&mut self) -> Flow {
        let Some((generation, epoch)) = self.epoch.changed(&self.env.epoch) else { return ControlFlow::Continue(()) };
        match self.env.recovery.ensure_pending(&self.device, &epoch, None, None).await {
            Ok(_) => {
                self.epoch.accept(generation, epoch);
                // The presence went with the data: restore it now, not at the next
                // heartbeat (the backlog is read again just below anyway).
                self.presence.keep(self.env.redis.next(), &self.env.keys).await;
                self.backlog.restart();
            }
            Err(RecoveryError::Unregistered) => {
                return ControlFlow::Break(End::Close(CloseCode::Replaced, LOGGED_OUT));
            }
            Err(e) => tracing::warn!(error = %e, "pending set rebuild failed; retrying"),
        }
        ControlFlow::Continue(())
    }

    /// How often W is looked at: the flush period, or more often when the device TTL
    /// needs `last_seen_at` written sooner.
    fn mark_every(&self) -> Duration {
        Duration::from_millis(self.env.cfg.gateway.watermark_flush_ms).min(self.env.cfg.delivery.last_seen_every())
    }

    /// Reports W for the MySQL flush when it moved (only while the pending set is
    /// trusted): an idle device costs no write until its W has something to say, or
    /// until its `last_seen_at` is due again (the report writes it too).
    pub(super) async fn report_watermark(&mut self) {
        let now = Instant::now();
        self.last_mark = now;
        if let Ok(Some(watermark)) = self.env.recovery.watermark(&self.device, &self.epoch.epoch).await {
            let seen_due = now.duration_since(self.last_report) >= self.env.cfg.delivery.last_seen_every();
            if self.reported_watermark == Some(watermark) && !seen_due {
                return;
            }
            self.reported_watermark = Some(watermark);
            self.last_report = now;
            self.env.marks.report(Mark { device: self.device.clone(), watermark });
        }
    }
}

impl End {
    /// The `reason` label of `herald_sessions_closed_total`: the close code's name, or
    /// `client_gone`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            End::Close(code, _) => code.name(),
            End::Gone => "client_gone",
        }
    }
}
