//! Where a pending set is incomplete, and device watermarks.
//!
//! A device's pending set is complete except for its *overflow band* (`ovf` field
//! `{device}` = "low high", fixed-width ids): messages in the band may be missing from
//! the set and are read from MySQL instead, in pages, before the set (the session's
//! backlog pager). A fan-out that trims a set over `pending_cap` widens the band over
//! what it dropped; a set not trusted in the current Redis epoch (its marker, `devs`
//! field `epoch:{device}`, names another: Redis lost its data) gets a band from its
//! watermark W to now. As the device acks the band's pages, the band's low end moves
//! up, and it goes once passed.
//!
//! W is flushed to MySQL from live sessions (see the watermark flusher): below the
//! oldest pending id and the band's low end, and at least `watermark_margin_ms` behind
//! now, so a band can only add repeats (which clients drop by id), never lose.

use std::sync::Arc;

use fred::interfaces::HashesInterface;
use fred::prelude::*;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::keys::{epoch_marker, DeviceKey, Keys};
use herald_shared::scripts;
use sqlx::mysql::MySqlPool;
use tokio::sync::Semaphore;

/// Why a pending set could not be made complete.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    /// The device has no row (it logged out, or was forgotten): its session must end,
    /// not page the whole history from watermark 0.
    #[error("the device is not registered (logged out)")]
    Unregistered,
}

/// A device's overflow band: ids in `low..=high` are read from MySQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Band {
    pub low: MsgId,
    pub high: MsgId,
    /// The stored value, compared when the band is moved.
    raw: String,
}

impl Band {
    /// Reads a stored band; a value of an older version holds only its low end, and
    /// then the band reaches up to now.
    pub fn parse(raw: &str) -> Option<Band> {
        let (low, high) = match raw.split_once(' ') {
            Some((l, h)) => (MsgId::from_member(l)?, MsgId::from_member(h)?),
            None => (MsgId::from_member(raw)?, MsgId::lowest_at(now_ms())),
        };
        Some(Band { low, high, raw: raw.to_owned() })
    }

    /// The band as stored once its low end moved to `low`.
    pub fn moved_to(&self, low: MsgId) -> Band {
        Band { low, high: self.high, raw: format!("{} {}", low.member(), self.high.member()) }
    }
}

/// Finds and moves overflow bands, marks sets trusted, computes watermarks.
#[derive(Clone, Debug)]
pub struct Recovery {
    pub db: MySqlPool,
    pub redis: Pool,
    pub keys: Keys,
    /// How far a watermark trails now.
    pub watermark_margin_ms: u64,
    /// Permits for a session start's MySQL reads (`gateway.start_db_reads`): its
    /// watermark here, its band's first page in the session's start.
    pub start_reads: Arc<Semaphore>,
}

impl Recovery {
    /// Makes the device's pending set trusted in `epoch`: when it was not (Redis lost its
    /// data, or the device is new to this Redis), everything above its watermark goes
    /// into its overflow band, to be read from MySQL. The watermark is `known` when the
    /// device's registration just read or wrote it, else read. Returns whether it had to.
    pub async fn ensure_pending(
        &self,
        d: &DeviceKey,
        epoch: &str,
        known: Option<MsgId>,
    ) -> Result<bool, RecoveryError> {
        let redis = self.redis.next();
        let devs = self.keys.devices(&d.tenant, &d.user);
        let trusted: Option<String> = redis.hget(&devs, epoch_marker(&d.device)).await?;
        if trusted.as_deref() == Some(epoch) {
            return Ok(false);
        }
        let watermark = match known {
            Some(w) => w.0,
            None => {
                let _turn = self.start_reads.acquire().await.expect("never closed");
                sqlx::query_scalar(
                    "SELECT watermark FROM devices WHERE tenant_id = ? AND user_id = ? AND device_id = ?",
                )
                .bind(&d.tenant)
                .bind(&d.user)
                .bind(&d.device)
                .fetch_optional(&self.db)
                .await?
                .ok_or(RecoveryError::Unregistered)?
            }
        };
        // Messages committed from now on are fanned out into the set itself.
        let (low, high) = (MsgId(watermark + 1), MsgId::lowest_at(now_ms()));
        let band: String = scripts::OVERFLOW_WIDEN
            .call(
                redis,
                vec![self.keys.overflow(&d.tenant, &d.user)],
                vec![d.device.clone(), low.member(), high.member()],
            )
            .await?;
        let _: i64 = redis.hset(&devs, (epoch_marker(&d.device), epoch)).await?;
        metrics::counter!("herald_pending_rebuilds_total").increment(1);
        // Every device's first session of an epoch comes here (every never-seen device,
        // every device after Redis lost its data): counted, and logged at debug only, or
        // a login storm writes a line per device. The epoch's change is a warning of its own.
        tracing::debug!(device = %d, band, watermark, "pending set not trusted in this epoch; its band is read from MySQL");
        Ok(true)
    }

    /// The device's overflow band, if it has one.
    pub async fn band(&self, d: &DeviceKey) -> Result<Option<Band>, Error> {
        let raw: Option<String> =
            self.redis.next().hget(self.keys.overflow(&d.tenant, &d.user), d.device.as_str()).await?;
        Ok(raw.as_deref().and_then(Band::parse))
    }

    /// Everything below `low` in the band is acked: move its low end there (or remove it
    /// when passed). False when the band changed since it was read.
    pub async fn advance(&self, d: &DeviceKey, band: &Band, low: MsgId) -> Result<bool, Error> {
        let key = self.keys.overflow(&d.tenant, &d.user);
        let moved: i64 = scripts::OVERFLOW_ADVANCE
            .call(self.redis.next(), vec![key], vec![d.device.clone(), band.raw.clone(), low.member()])
            .await?;
        Ok(moved == 1)
    }

    /// The watermark a session may report now, or `None` while its set is not trusted.
    pub async fn watermark(&self, d: &DeviceKey, epoch: &str) -> Result<Option<MsgId>, Error> {
        let keys = vec![
            self.keys.devices(&d.tenant, &d.user),
            self.keys.pending_of(d),
            self.keys.overflow(&d.tenant, &d.user),
        ];
        let oldest: Option<String> = scripts::OLDEST_IF_TRUSTED
            .call(self.redis.next(), keys, vec![epoch_marker(&d.device), epoch.to_string(), d.device.clone()])
            .await?;
        let Some(oldest) = oldest else { return Ok(None) };
        let floor = MsgId::lowest_at(now_ms().saturating_sub(self.watermark_margin_ms)).0.saturating_sub(1);
        let w = match MsgId::from_member(&oldest) {
            Some(id) => floor.min(id.0.saturating_sub(1)),
            None => floor,
        };
        Ok(Some(MsgId(w)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_parse_both_versions_and_refuse_garbage() {
        let (l, h) = (MsgId(1 << 50), MsgId((1 << 50) + 5));
        let b = Band::parse(&format!("{} {}", l.member(), h.member())).unwrap();
        assert_eq!((b.low, b.high), (l, h));
        let old = Band::parse(&l.member()).unwrap();
        assert_eq!(old.low, l);
        assert!(old.high > h, "an old mark reaches up to now");
        assert_eq!(Band::parse("12 x"), None);
        assert_eq!(Band::parse("5"), None, "members are fixed-width");
    }
}
