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
use herald_shared::redis::Batch;
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

/// What a session's start reads of its device's pending set.
#[derive(Debug, PartialEq, Eq)]
pub struct AtStart {
    /// Entries in the pending set.
    pub set: u64,
    /// The overflow band, if the device has one.
    pub band: Option<Band>,
    /// Entries of the set above the band (0 without one).
    pub above_band: u64,
}

impl Recovery {
    /// Makes the device's pending set trusted in `epoch`: when it was not (Redis lost its
    /// data, or the device is new to this Redis), everything above its watermark goes
    /// into its overflow band, to be read from MySQL. The watermark is `known` when the
    /// device's registration just read or wrote it, else read. A session's start gives
    /// its `platform` too, recorded in the user's device registry in the same write as
    /// the marker's read. Returns the band it made, when it had to.
    pub async fn ensure_pending(
        &self,
        d: &DeviceKey,
        epoch: &str,
        known: Option<MsgId>,
        platform: Option<&str>,
    ) -> Result<Option<Band>, RecoveryError> {
        let redis = self.redis.next();
        let devs = self.keys.devices(&d.tenant, &d.user);
        let marker = epoch_marker(&d.device);
        let mut batch = Batch::new();
        if let Some(platform) = platform {
            batch.push(redis.hset::<Value, _, _>(&devs, (d.device.as_str(), platform)));
        }
        batch.push(redis.hget::<Value, _, _>(&devs, &marker));
        let mut answers = batch.run().await.into_iter();
        let trusted: Option<String> = answers.next_back().expect("one answer per request")?.convert()?;
        for registered in answers {
            registered?;
        }
        if trusted.as_deref() == Some(epoch) {
            return Ok(None);
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
        // Messages committed from now on are fanned out into the set itself; the set is
        // marked trusted in the epoch by the same script, once its band covers the rest.
        let (low, high) = (MsgId(watermark + 1), MsgId::lowest_at(now_ms()));
        let band: String = scripts::OVERFLOW_WIDEN
            .call(
                redis,
                vec![self.keys.overflow(&d.tenant, &d.user), devs],
                vec![d.device.clone(), low.member(), high.member(), marker, epoch.to_owned()],
            )
            .await?;
        metrics::counter!("herald_pending_rebuilds_total").increment(1);
        // Every device's first session of an epoch comes here (every never-seen device,
        // every device after Redis lost its data): counted, and logged at debug only, or
        // a login storm writes a line per device. The epoch's change is a warning of its own.
        tracing::debug!(device = %d, band, watermark, "pending set not trusted in this epoch; its band is read from MySQL");
        Ok(Band::parse(&band))
    }

    /// The device's overflow band, if it has one.
    pub async fn band(&self, d: &DeviceKey) -> Result<Option<Band>, Error> {
        let raw: Option<String> =
            self.redis.next().hget(self.keys.overflow(&d.tenant, &d.user), d.device.as_str()).await?;
        Ok(raw.as_deref().and_then(Band::parse))
    }

    /// The pending set's size and the overflow band at a session's start, in one round
    /// trip (two when a band is read and found): `made` is the band the start's rebuild
    /// just made, else it is read.
    pub async fn at_start(&self, d: &DeviceKey, made: Option<Band>) -> Result<AtStart, Error> {
        let redis = self.redis.next();
        let pending = self.keys.pending_of(d);
        let above = |band: &Band| band.high.score().next_up();
        let mut batch = Batch::new();
        batch.push(redis.zcard::<Value, _>(&pending));
        match &made {
            Some(band) => batch.push(redis.zcount::<Value, _>(&pending, above(band), f64::INFINITY)),
            None => batch.push(redis.hget::<Value, _, _>(self.keys.overflow(&d.tenant, &d.user), d.device.as_str())),
        }
        let mut answers = batch.run().await.into_iter();
        let set: u64 = answers.next().expect("one answer per request")?.convert()?;
        let second = answers.next().expect("one answer per request")?;
        let (band, above_band) = match made {
            Some(band) => (Some(band), second.convert()?),
            None => match second.convert::<Option<String>>()?.as_deref().and_then(Band::parse) {
                Some(band) => {
                    let n: u64 = redis.zcount(&pending, above(&band), f64::INFINITY).await?;
                    (Some(band), n)
                }
                None => (None, 0),
            },
        };
        Ok(AtStart { set, band, above_band })
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

    async fn recovery() -> Recovery {
        let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        Recovery {
            // Unreachable: a watermark not given cannot be read.
            db: herald_shared::db::pool("mysql://nobody@127.0.0.1:1/none", 1, None).expect("lazy pool"),
            redis: herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis"),
            keys: Keys::new(format!("ut-recovery-{:08x}", rand::random::<u32>())),
            watermark_margin_ms: 0,
            start_reads: Arc::new(Semaphore::new(1)),
        }
    }

    /// A device new to the epoch: its registry entry and its marker's read in one
    /// write, then its band from the watermark to now with the set marked trusted by
    /// the same script; trusted, a second start rebuilds nothing. What the start counts
    /// is the set, the band and the set's entries above the band, from the band made or
    /// read.
    #[tokio::test]
    async fn a_new_devices_start_gets_its_band_its_mark_and_its_counts() {
        let r = recovery().await;
        let d = DeviceKey::new("t", "alice", "phone");
        let watermark = MsgId::lowest_at(now_ms() - 60_000);
        let made = r.ensure_pending(&d, "e1", Some(watermark), Some("ios")).await.expect("rebuilt").expect("a band");
        assert_eq!(made.low, MsgId(watermark.0 + 1));
        assert!(made.high > made.low);
        let client = r.redis.next();
        let devs = r.keys.devices("t", "alice");
        let (platform, marker): (Option<String>, Option<String>) =
            (client.hget(&devs, "phone").await.unwrap(), client.hget(&devs, epoch_marker("phone")).await.unwrap());
        assert_eq!(platform.as_deref(), Some("ios"), "the registry entry");
        assert_eq!(marker.as_deref(), Some("e1"), "trusted in the epoch, with its band");
        assert_eq!(r.band(&d).await.unwrap(), Some(made.clone()), "the band made is the band stored");
        assert_eq!(r.ensure_pending(&d, "e1", Some(watermark), Some("ios")).await.expect("trusted"), None);

        // Two entries below the band's top, three above it (scores are f64: apart by
        // more than their precision at these ids).
        let pending = r.keys.pending_of(&d);
        let step = 1 << 12;
        for id in [
            made.high.0 - 2 * step,
            made.high.0 - step,
            made.high.0 + step,
            made.high.0 + 2 * step,
            made.high.0 + 3 * step,
        ] {
            let _: i64 =
                client.zadd(&pending, None, None, false, false, (MsgId(id).score(), MsgId(id).member())).await.unwrap();
        }
        let expected = AtStart { set: 5, band: Some(made.clone()), above_band: 3 };
        assert_eq!(r.at_start(&d, Some(made.clone())).await.unwrap(), expected, "from the band made");
        assert_eq!(r.at_start(&d, None).await.unwrap(), expected, "from the band read");
        let other = DeviceKey::new("t", "alice", "laptop");
        assert_eq!(r.at_start(&other, None).await.unwrap(), AtStart { set: 0, band: None, above_band: 0 });

        // A new epoch (Redis lost its data): the band widens, the mark moves.
        let again = r.ensure_pending(&d, "e2", Some(MsgId(watermark.0 - 1000)), None).await.unwrap().expect("a band");
        assert_eq!(again.low, MsgId(watermark.0 - 999));
        assert!(again.high >= made.high);
        let marker: Option<String> = client.hget(&devs, epoch_marker("phone")).await.unwrap();
        assert_eq!(marker.as_deref(), Some("e2"));
        let _: i64 = client.del(vec![devs, pending, r.keys.overflow("t", "alice")]).await.unwrap();
    }

    /// A device whose watermark cannot be read (MySQL down) gets no band, and its set is
    /// not marked trusted: its next start tries again instead of trusting a set that
    /// may lack messages. Its registry entry is written all the same.
    #[tokio::test]
    async fn a_set_is_not_trusted_when_its_watermark_cannot_be_read() {
        let r = recovery().await;
        let d = DeviceKey::new("t", "bob", "phone");
        let failed = r.ensure_pending(&d, "e1", None, Some("web")).await;
        assert!(matches!(failed, Err(RecoveryError::Db(_))), "{failed:?}");
        let client = r.redis.next();
        let devs = r.keys.devices("t", "bob");
        let (platform, marker): (Option<String>, Option<String>) =
            (client.hget(&devs, "phone").await.unwrap(), client.hget(&devs, epoch_marker("phone")).await.unwrap());
        assert_eq!(platform.as_deref(), Some("web"));
        assert_eq!(marker, None, "not trusted");
        assert_eq!(r.band(&d).await.unwrap(), None, "no band");
        let _: i64 = client.del(devs).await.unwrap();
    }
}
