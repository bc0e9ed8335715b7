//! Token buckets (governor): backlog pacing per device and per node, sends per device,
//! and WebSocket admission per node.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use herald_shared::config::GatewayConfig;

use crate::sessions::DeviceKey;

fn nz(v: u32) -> NonZeroU32 {
    NonZeroU32::new(v.max(1)).expect("positive")
}

/// A bucket of `rate` per second holding up to `burst`.
pub fn bucket(rate: u32, burst: u32) -> DefaultDirectRateLimiter {
    DefaultDirectRateLimiter::direct(Quota::per_second(nz(rate)).allow_burst(nz(burst)))
}

/// Takes `n` tokens now, or says how long until they would be there (taking none).
pub fn take(limiter: &DefaultDirectRateLimiter, n: usize) -> Result<(), Duration> {
    let n = nz(n.min(u32::MAX as usize) as u32);
    match limiter.check_n(n) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(not_until)) => Err(not_until.wait_time_from(DefaultClock::default().now())),
        // More than the bucket ever holds: let it through rather than stall forever.
        Err(_) => Ok(()),
    }
}

/// The node-wide buckets.
#[derive(Debug)]
pub struct NodeLimits {
    pub backlog: DefaultDirectRateLimiter,
    pub admission: DefaultDirectRateLimiter,
    /// HTTP sends per device (WebSocket sessions keep their own bucket).
    pub http_sends: DefaultKeyedRateLimiter<DeviceKey>,
}

impl NodeLimits {
    pub fn new(cfg: &GatewayConfig) -> Self {
        NodeLimits {
            backlog: bucket(cfg.backlog_rate_node, cfg.backlog_rate_node / 10 + cfg.backlog_page_desktop as u32),
            admission: bucket(cfg.admission_rate, cfg.admission_burst),
            http_sends: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(nz(cfg.send_rate)).allow_burst(nz(cfg.send_burst)),
            ),
        }
    }

    /// Ok, or the wait before this device may send again.
    pub fn http_send(&self, key: &DeviceKey) -> Result<(), Duration> {
        self.http_sends.check_key(key).map_err(|nu| nu.wait_time_from(DefaultClock::default().now()))
    }
}

/// A retry hint spread out so that refused clients do not return together.
pub fn jittered(base: Duration) -> Duration {
    let base = base.max(Duration::from_millis(100));
    base + Duration::from_millis(rand::random::<u64>() % (base.as_millis() as u64 * 2 + 1))
}
