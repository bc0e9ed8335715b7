//! A session's start: presence (replacing a session elsewhere), a complete pending set,
//! `hello` with what is pending, and the read positions waiting for the device.
//!
//! A device new to this Redis (a first session, or a set lost with Redis's data) has an
//! overflow band read from MySQL. The start reads the band's first page once, for both
//! `hello.pending` and the pager's first page: a band that fits in a page (every
//! never-seen device's: the minute before it registered) costs one query, not a count
//! and then a read; a longer one is counted too.

use axum::extract::ws::Message;
use futures::{Sink, Stream};
use herald_shared::ids::MsgId;
use herald_shared::protocol::{Hello, Message as MsgFrame};

use super::presence::Claim;
use super::{Session, SessionError};
use crate::epoch::EpochSeen;
use crate::recovery::{Band, RecoveryError};

/// `hello.pending` counts an overflow band's messages up to this many.
const BAND_COUNT_MAX: u32 = 100_000;

/// The band's first page, as the start read it: messages with ids in `after+1..=high`.
#[derive(Debug)]
pub(super) struct FirstPage {
    after: MsgId,
    high: MsgId,
    page: Vec<MsgFrame>,
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    pub(super) async fn start(&mut self) -> Result<(), SessionError> {
        let redis = self.env.redis.next().clone();
        let new_device = match self.presence.claim(&redis, &self.env.keys).await? {
            Claim::Held(new_device) => new_device,
            // Its claim came late: a session of the device admitted after it holds the
            // presence, and stays.
            Claim::Superseded => return Err(SessionError::Superseded),
        };
        // Replaced here while claiming (the newer session's claim can reach Redis first):
        // the presence goes to the newer one, which a kick from another node must find.
        if let Some((newer, statuses)) = self.env.directory.successor(&self.device, &self.id) {
            self.presence.give_up(&redis, Some((&newer, statuses))).await;
        } else if new_device {
            // Its user's followers hear it came online when this is its only device.
            self.env.roster.connected(&self.device.tenant, &self.device.user);
        }
        // The device registry in Redis (MySQL's devices table stays the truth), written
        // with the read of the set's epoch marker.
        self.epoch = EpochSeen::new(&self.env.epoch);
        let watermark = self.registered_watermark.take();
        let platform = Some(self.claims.plat.as_str());
        let recovery = &self.env.recovery;
        let made = match recovery.ensure_pending(&self.device, &self.epoch.epoch, watermark, platform).await {
            // The device logged out through another gateway, whose word this one's
            // registry missed: it came back, so it is registered again, now, and gets
            // every message from here on.
            Err(RecoveryError::Unregistered) => {
                let again = self.env.devices.register_again(&self.claims).await;
                let watermark = again.map_err(|e| SessionError::Register(e.message))?;
                recovery.ensure_pending(&self.device, &self.epoch.epoch, Some(watermark), platform).await?
            }
            done => done?,
        };
        // With a band: its messages (the set may hold some of them too) and the set's
        // above it, or the set's size if that is more.
        let at_start = recovery.at_start(&self.device, made).await?;
        let mut pending = at_start.set;
        if let Some(band) = at_start.band {
            pending = pending.max(self.count_band(band).await? + at_start.above_band);
        }
        metrics::histogram!("herald_pending_at_connect").record(pending as f64);
        self.backlog.expect(pending);
        let hello = Hello { session: self.id.clone(), hb_ms: self.env.cfg.gateway.heartbeat_ms, pending };
        self.send_frame(hello).await;
        self.send_stored_reads().await
    }

    /// How many messages the band holds (up to `BAND_COUNT_MAX`), its first page kept
    /// for the pager.
    async fn count_band(&mut self, band: Band) -> Result<u64, SessionError> {
        let page_size = self.backlog.page_size();
        let after = MsgId(band.low.0.saturating_sub(1));
        let _turn = self.env.recovery.start_reads.acquire().await.expect("never closed");
        let history = &self.env.history;
        let page = if history.band_may_hold(&self.device, after).await? {
            history.band(&self.device, after, band.high, page_size as u32).await?
        } else {
            Vec::new()
        };
        let in_band = if page.len() < page_size {
            page.len() as u64
        } else {
            self.env.history.band_count(&self.device, band.low, band.high, BAND_COUNT_MAX).await?
        };
        self.first_band_page = Some(Box::new(FirstPage { after, high: band.high, page }));
        Ok(in_band)
    }

    /// The band's first page if the start read this very page: the first `want`
    /// messages after `after` up to `high` (`want` is at most a page: the read was
    /// either a full page, or all there is).
    pub(super) fn take_first_band_page(&mut self, after: MsgId, high: MsgId, want: usize) -> Option<Vec<MsgFrame>> {
        let first = self.first_band_page.take()?;
        if first.after != after || first.high != high {
            return None;
        }
        let mut page = first.page;
        page.truncate(want);
        Some(page)
    }
}
