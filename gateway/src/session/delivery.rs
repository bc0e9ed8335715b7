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

/// Realtime pushes written out together at most.
const PUSHES_PER_WRITE: usize = 64;
/// How soon acks the node's ack writer did not take are handed over again.
const ACK_RETRY: Duration = Duration::from_secs(1);
/// How long a session waits for its acks' removals before it reads a backlog page or
/// says `caught_up`; past it the removals go on in the writer, and the read fails.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// How long past its expected turn a session waiting in the node budget's line looks
/// again by itself: the budget's controller serves the line every 10 ms and wakes it
/// first, unless the controller is late or the rate was cut.
const TURN_FALLBACK: Duration = Duration::from_millis(100);
/// The longest a session waiting in that line sleeps before it looks again: a turn is
/// served sooner than expected when the rate is raised or sessions ahead leave.
const TURN_LOOK_EVERY: Duration = Duration::from_secs(1);

/// The acks a session handed over are not recorded (yet).
#[derive(Debug, thiserror::Error)]
pub enum AcksNotRecorded {
    #[error("the node's ack queue is full")]
    QueueFull,
    #[error("the acks' removal did not land within {ACK_WAIT:?}")]
    Late,
}
use crate::acks::QueueFull;
use crate::mailbox::Mailbox;
use crate::meters;
use crate::recovery::Band;
use crate::sessions::Push;

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// A realtime push from the node channel, with the pushes queued behind it (up to
    /// [`PUSHES_PER_WRITE`], while the window has room): their frames go out in one
    /// socket write, not one each.
    pub(super) async fn on_push(&mut self, first: Push, mailbox: &Mailbox) -> Flow {
        // Where each written push's latency starts: in the (boxed) future itself, not
        // an allocation of its own per wake-up.
        let mut written = [Instant::now(); PUSHES_PER_WRITE];
        let mut count = 0;
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(push) = next.take() {
            taken += 1;
            if self.inflight.insert(push.id, Instant::now(), &push.frame) {
                // Time the push waited for room in a full window is the device's, not
                // the node's.
                written[count] = push.arrived.max(self.inflight.reopened());
                count += 1;
                self.recheck_follows(&push.frame).await;
                if !self.feed(push.frame).await {
                    return ControlFlow::Break(End::Gone);
                }
            }
            if taken < PUSHES_PER_WRITE && self.inflight.has_room() {
                next = mailbox.try_push();
            }
        }
        if count == 0 {
            return ControlFlow::Continue(());
        }
        if !self.flush().await {
            return ControlFlow::Break(End::Gone);
        }
        for from in &written[..count] {
            self.env.limits.realtime.record(from.elapsed());
        }
        meters::REALTIME_DELIVERIES.increment(count as u64);
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
    /// unknown) is reserved from the node's budget, so a storm's reads wait their turn
    /// in its line; the read settles for what it pushed. A session with nothing waiting
    /// reserves nothing: a login storm of such sessions takes none of the node's budget.
    /// The reservation, or the wait when a bucket cannot pay yet (for the node's budget,
    /// a fallback: the session is woken when its turn is served).
    fn pay_for_backlog(&mut self, want: usize) -> Result<usize, Duration> {
        let owed = self.backlog.owed();
        if owed > 0 {
            crate::limits::take(&self.backlog_bucket, owed as usize)?;
            self.backlog.paid();
        }
        // A turn in the node budget's line: its tokens are taken once it is served (the
        // session is woken then); until then the read waits on.
        if let Some(turn) = self.budget_turn.take() {
            if turn.is_served() {
                return Ok(turn.tokens());
            }
            self.budget_turn = Some(turn);
            return Err(self.env.limits.backlog.line_wait().min(TURN_LOOK_EVERY) + TURN_FALLBACK);
        }
        let reserved = self.backlog.reservation(want);
        if reserved > 0 {
            if let Err((turn, wait)) = self.env.limits.backlog.take_or_wait(reserved) {
                self.budget_turn = Some(turn);
                return Err(wait.min(TURN_LOOK_EVERY) + TURN_FALLBACK);
            }
        }
        Ok(reserved)
    }

    async fn check_band(&mut self) -> Result<(), SessionError> {
        let band = self.env.recovery.band(&self.device).await?;
        self.backlog.band_checked(band);
        if self.backlog.is_finishing() {
            // `caught_up` promises the backlog is acked: only after the ZREM landed.
            self.acks_recorded().await?;
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
        // The page's frames go out in one socket write.
        let now = Instant::now();
        let mut fed = 0;
        for m in page {
            let frame: Utf8Bytes = msg_frame(&m).into();
            if self.inflight.insert(m.id, now, &frame) {
                self.backlog.pushed(m.id);
                self.recheck_follows(&frame).await;
                if !self.feed(frame).await {
                    return Ok(());
                }
                fed += 1;
            }
        }
        self.flush_page(fed).await;
        Ok(())
    }

    /// A page of the pending set.
    async fn read_page(&mut self, after: Option<MsgId>, want: usize) -> Result<(), SessionError> {
        // Acked ids waiting to be removed would come back as entries: removed first.
        self.acks_recorded().await?;
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
        // The page's frames go out in one socket write.
        let now = Instant::now();
        let mut fed = 0;
        for id in fresh {
            match frames.get(&id) {
                Some(frame) => {
                    let frame: Utf8Bytes = frame.clone().into();
                    self.inflight.insert(id, now, &frame);
                    self.backlog.pushed(id);
                    self.recheck_follows(&frame).await;
                    if !self.feed(frame).await {
                        // Gone or stalled: the session ends; the page stays pending.
                        return Ok(());
                    }
                    fed += 1;
                }
                None => {
                    // Not in Redis nor MySQL (a message that was never committed cannot
                    // be pending); drop the stale entry.
                    let _: Result<i64, _> = self.env.redis.next().zrem(&self.pending_key, id.member()).await;
                }
            }
        }
        self.flush_page(fed).await;
        Ok(())
    }

    /// Writes out a backlog page's `fed` frames. A failed write needs nothing here: the
    /// session is gone or stalled, so it ends, and the page stays pending.
    async fn flush_page(&mut self, fed: u64) {
        if fed > 0 && self.flush().await {
            metrics::counter!("herald_deliveries_total", "kind" => "backlog").increment(fed);
        }
    }

    /// Acks are applied to the session at once and handed to the node's ack writer,
    /// which removes them from the pending set together with other sessions' acks.
    pub(super) async fn on_ack(&mut self, ids: Vec<MsgId>) -> Flow {
        if ids.is_empty() {
            return ControlFlow::Continue(());
        }
        let now_ms = now_ms();
        for id in &ids {
            let latency = if self.backlog.is_outstanding(*id) {
                &meters::BACKLOG_DELIVERY_SECONDS
            } else {
                &meters::REALTIME_DELIVERY_SECONDS
            };
            if let Some(frame) = self.inflight.ack(*id) {
                // Commit (the id's own timestamp) to device ack.
                let secs = now_ms.saturating_sub(id.unix_ms()) as f64 / 1000.0;
                latency.record(secs);
                self.delivered.note(&frame, &self.device.user);
            }
            self.backlog.acked(*id);
        }
        meters::ACKS.increment(ids.len() as u64);
        self.acks.add(ids);
        if self.backlog.is_finishing() {
            // `caught_up` promises the backlog is acked: only once the removals landed.
            if let Err(e) = self.acks_recorded().await {
                return self.ack_not_recorded(e).await;
            }
            self.finish_backlog().await;
        } else if let Err(e) = self.hand_acks() {
            return self.ack_not_recorded(e).await;
        }
        ControlFlow::Continue(())
    }

    pub(super) async fn on_ack_due(&mut self) -> Flow {
        match self.hand_acks() {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => self.ack_not_recorded(e).await,
        }
    }

    async fn ack_not_recorded(&mut self, e: AcksNotRecorded) -> Flow {
        tracing::warn!(error = %e, "acks could not be recorded");
        self.send_frame(ErrorFrame::new(ErrorCode::Unavailable, "ack not recorded; ack again")).await;
        ControlFlow::Continue(())
    }

    /// Hands the acked ids to the node's ack writer, the only way they leave the
    /// pending set, and reports the delivered positions they move. Ids the writer's
    /// queue does not take are kept and handed over again, never forgotten.
    pub(super) fn hand_acks(&mut self) -> Result<(), AcksNotRecorded> {
        let ids = self.acks.take();
        if ids.is_empty() {
            return Ok(());
        }
        if let Err(QueueFull(ids)) = self.env.acks.remove(&self.pending_key, ids, &self.ack_tally) {
            self.acks.restore(ids, Instant::now() + ACK_RETRY);
            return Err(AcksNotRecorded::QueueFull);
        }
        self.report_delivered();
        Ok(())
    }

    /// Hands the acked ids over and waits until every removal of this session has
    /// landed (at most [`ACK_WAIT`]): before a backlog page is read (it would return
    /// them again) and before `caught_up`.
    pub(super) async fn acks_recorded(&mut self) -> Result<(), AcksNotRecorded> {
        self.hand_acks()?;
        tokio::time::timeout(ACK_WAIT, self.ack_tally.cleared()).await.map_err(|_| AcksNotRecorded::Late)
    }

    async fn finish_backlog(&mut self) {
        let delivered = self.backlog.finish();
        self.report_delivered();
        self.send_frame(CaughtUp { delivered }).await;
    }
}
