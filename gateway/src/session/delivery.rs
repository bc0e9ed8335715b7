//! Delivery within a session: realtime pushes, backlog pages, and acks, which are the
//! only way an id leaves the pending set.

use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use fred::interfaces::SortedSetsInterface;
use futures::{Sink, Stream};
use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{msg_frame, CaughtUp, CloseCode, ErrorFrame};
use herald_shared::scripts;
use tokio::time::Instant;

use super::backlog::PageRequest;
use super::{End, Flow, Session, SessionError};

/// How soon a failed ack removal is tried again.
const ACK_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
use crate::recovery::Band;
use crate::sessions::Push;

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// A realtime push from the node channel.
    pub(super) async fn on_push(&mut self, push: Push) -> Flow {
        if !self.inflight.insert(push.id, Instant::now(), &push.frame) {
            return ControlFlow::Continue(());
        }
        // Time the push waited for room in a full window is the device's, not the node's.
        let from = push.arrived.max(self.inflight.reopened());
        self.recheck_follows(&push.frame).await;
        if !self.write(push.frame).await {
            return ControlFlow::Break(End::Gone);
        }
        self.env.limits.realtime.record(from.elapsed());
        metrics::counter!("herald_deliveries_total", "kind" => "realtime").increment(1);
        ControlFlow::Continue(())
    }

    /// Reads and pushes backlog pages while they are due and the buckets allow: a read
    /// that pushed nothing (an empty page, a band check) leads straight to the next.
    pub(super) async fn read_backlog(&mut self) -> Flow {
        // Bounded, so a band that keeps changing cannot hold the loop.
        for _ in 0..8 {
            let read = self.read_backlog_once().await;
            if self.stalled {
                // A page write missed its deadline: the session ends now, not after a
                // deadline per frame of the page.
                return ControlFlow::Break(super::half_open());
            }
            match read {
                ControlFlow::Continue(true) => continue,
                ControlFlow::Continue(false) => return ControlFlow::Continue(()),
                ControlFlow::Break(end) => return ControlFlow::Break(end),
            }
        }
        ControlFlow::Continue(())
    }

    /// One read; `Continue(true)` when another may follow at once.
    async fn read_backlog_once(&mut self) -> ControlFlow<End, bool> {
        let now = Instant::now();
        let Some(request) = self.backlog.next_request(now, self.inflight.room()) else {
            return ControlFlow::Continue(false);
        };
        let want = match &request {
            PageRequest::Band { want, .. } | PageRequest::Set { want, .. } => Some(*want),
            PageRequest::CheckBand => None,
        };
        let reserved = match want.map(|want| self.pay_for_backlog(want)).transpose() {
            Ok(reserved) => reserved,
            Err(wait) => {
                metrics::counter!("herald_backlog_throttled_total").increment(1);
                self.backlog.pace_until(now + wait);
                return ControlFlow::Continue(false);
            }
        };
        // Boxed: this runs on every turn of the loop, whose resting state must stay small.
        let read = match request {
            PageRequest::CheckBand => Box::pin(self.check_band()).await,
            PageRequest::Band { band, after, advance_to, want } => {
                Box::pin(self.read_band(band, after, advance_to, want)).await
            }
            PageRequest::Set { after, want } => Box::pin(self.read_page(after, want)).await,
        };
        if let Some(reserved) = reserved {
            // The node's budget is charged what the read pushed.
            self.env.limits.backlog.settle(reserved, self.backlog.owed() as usize);
        }
        match read {
            Ok(()) => ControlFlow::Continue(true),
            Err(e) => {
                tracing::warn!(error = %e, "backlog read failed");
                ControlFlow::Break(End::Close(CloseCode::InternalError, "dependency unavailable"))
            }
        }
    }

    /// Pace, before a read of up to `want` messages: the device's bucket is paid for
    /// what the last pages pushed, then what the read is expected to push (a page when
    /// unknown) is reserved from the node's budget, so a storm's reads wait their turn;
    /// the read settles for what it pushed. A session with nothing waiting reserves
    /// nothing: a login storm of such sessions takes none of the node's budget. The
    /// reservation, or the wait when a bucket cannot pay yet.
    fn pay_for_backlog(&mut self, want: usize) -> Result<usize, Duration> {
        let owed = self.backlog.owed();
        if owed > 0 {
            crate::limits::take(&self.backlog_bucket, owed as usize)?;
            self.backlog.paid();
        }
        let reserved = self.backlog.reservation(want);
        if reserved > 0 {
            self.env.limits.backlog.take(reserved)?;
        }
        Ok(reserved)
    }

    async fn check_band(&mut self) -> Result<(), SessionError> {
        let band = self.env.recovery.band(&self.device).await?;
        self.backlog.band_checked(band);
        if self.backlog.is_finishing() {
            // `caught_up` promises the backlog is acked: only after the ZREM landed.
            self.flush_acks().await?;
            self.finish_backlog().await;
        }
        Ok(())
    }

    /// A page of the overflow band, from MySQL; the band's low end follows the acks.
    async fn read_band(
        &mut self,
        mut band: Band,
        after: MsgId,
        advance_to: Option<MsgId>,
        want: usize,
    ) -> Result<(), SessionError> {
        let recovery = self.env.recovery.clone();
        if let Some(low) = advance_to {
            if !recovery.advance(&self.device, &band, low).await? {
                self.backlog.band_changed();
                return Ok(());
            }
            band = band.moved_to(low);
            self.backlog.band_advanced(low);
        }
        let page = match self.take_first_band_page(after, band.high, want) {
            Some(page) => page,
            None => self.env.history.band(&self.device, after, band.high, want as u32).await?,
        };
        let ids: Vec<MsgId> = page.iter().map(|m| m.id).collect();
        self.backlog.band_read(&ids);
        if page.is_empty() {
            // Passed: the band goes (unless a fan-out widened it meanwhile).
            if recovery.advance(&self.device, &band, MsgId(band.high.0 + 1)).await? {
                self.backlog.band_done();
            } else {
                self.backlog.band_changed();
            }
            return Ok(());
        }
        let now = Instant::now();
        for m in page {
            let frame: Utf8Bytes = msg_frame(&m).into();
            if self.inflight.insert(m.id, now, &frame) {
                self.backlog.pushed(m.id);
                self.recheck_follows(&frame).await;
                if !self.write(frame).await {
                    return Ok(());
                }
                metrics::counter!("herald_deliveries_total", "kind" => "backlog").increment(1);
            }
        }
        Ok(())
    }

    /// A page of the pending set.
    async fn read_page(&mut self, after: Option<MsgId>, want: usize) -> Result<(), SessionError> {
        // Acked ids waiting to be removed would come back as entries: remove them first.
        self.flush_acks().await?;
        let (cursor, score) = match after {
            None => (String::new(), String::new()),
            Some(id) => (id.member(), id.score().to_string()),
        };
        let members: Vec<String> = scripts::PENDING_PAGE
            .call(self.env.redis.next(), vec![self.pending_key.clone()], vec![cursor, score, want.to_string()])
            .await?;
        let ids: Vec<MsgId> = members.iter().filter_map(|m| MsgId::from_member(m)).collect();
        self.backlog.read(&ids);
        if ids.is_empty() {
            return Ok(());
        }
        // Ids pushed in realtime and still unacked are awaited as they are.
        let fresh: Vec<MsgId> = ids.into_iter().filter(|id| !self.inflight.contains(*id)).collect();
        // Nothing is removed on a failed read: the session ends and the page is read again.
        let frames = self.env.history.frames(&fresh).await?;
        let now = Instant::now();
        for id in fresh {
            match frames.get(&id) {
                Some(frame) => {
                    let frame: Utf8Bytes = frame.clone().into();
                    self.inflight.insert(id, now, &frame);
                    self.backlog.pushed(id);
                    self.recheck_follows(&frame).await;
                    if !self.write(frame).await {
                        // Gone or stalled: the session ends; the page stays pending.
                        return Ok(());
                    }
                    metrics::counter!("herald_deliveries_total", "kind" => "backlog").increment(1);
                }
                None => {
                    // Not in Redis nor MySQL (a message that was never committed cannot
                    // be pending); drop the stale entry.
                    let _: Result<i64, _> = self.env.redis.next().zrem(&self.pending_key, id.member()).await;
                }
            }
        }
        Ok(())
    }

    /// Acks are applied to the session at once and to the pending set in batches: one
    /// ZREM per `ACK_LINGER` (or per `ACK_BATCH` ids) instead of one per ack frame.
    pub(super) async fn on_ack(&mut self, ids: Vec<MsgId>) -> Flow {
        if ids.is_empty() {
            return ControlFlow::Continue(());
        }
        let now_ms = now_ms();
        for id in &ids {
            let kind = if self.backlog.is_outstanding(*id) { "backlog" } else { "realtime" };
            if let Some(frame) = self.inflight.ack(*id) {
                // Commit (the id's own timestamp) to device ack.
                let secs = now_ms.saturating_sub(id.unix_ms()) as f64 / 1000.0;
                metrics::histogram!("herald_delivery_seconds", "kind" => kind).record(secs);
                self.delivered.note(&frame, &self.device.user);
            }
            self.backlog.acked(*id);
        }
        metrics::counter!("herald_acks_total").increment(ids.len() as u64);
        let full = self.acks.add(ids, Instant::now());
        let finishing = self.backlog.is_finishing();
        if finishing || full {
            if let Err(e) = self.flush_acks().await {
                return self.ack_not_recorded(e).await;
            }
        }
        if finishing {
            // `caught_up` promises the backlog is acked: only after the ZREM landed.
            self.finish_backlog().await;
        }
        ControlFlow::Continue(())
    }

    pub(super) async fn on_ack_due(&mut self) -> Flow {
        match self.flush_acks().await {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => self.ack_not_recorded(e).await,
        }
    }

    async fn ack_not_recorded(&mut self, e: fred::error::Error) -> Flow {
        tracing::warn!(error = %e, "acks could not be recorded");
        self.send_frame(ErrorFrame::new(ErrorCode::Unavailable, "ack not recorded; ack again")).await;
        ControlFlow::Continue(())
    }

    /// Removes the acked ids from the pending set; this is the only way they leave it.
    /// A removal that fails is kept and tried again, never forgotten.
    pub(super) async fn flush_acks(&mut self) -> Result<(), fred::error::Error> {
        let ids = self.acks.take();
        if ids.is_empty() {
            return Ok(());
        }
        let members: Vec<String> = ids.iter().map(|i| i.member()).collect();
        if let Err(e) = self.env.redis.next().zrem::<i64, _, _>(&self.pending_key, members).await {
            self.acks.restore(ids, Instant::now() + ACK_RETRY);
            return Err(e);
        }
        self.report_delivered();
        Ok(())
    }

    /// The acks still unrecorded when the session ends: the node retries them.
    pub(super) fn leave_acks(&mut self) {
        let ids = self.acks.take();
        self.env.leftover_acks.keep(self.pending_key.clone(), ids);
    }

    async fn finish_backlog(&mut self) {
        let delivered = self.backlog.finish();
        self.report_delivered();
        self.send_frame(CaughtUp { delivered }).await;
    }
}
