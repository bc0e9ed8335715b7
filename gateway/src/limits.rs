//! Token buckets (governor): backlog pacing per device, sends per device and per
//! tenant, and WebSocket admission per node; the node's adaptive backlog budget
//! ([`crate::budget`]); counts of WebSocket sessions per user and per IP address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use herald_shared::config::GatewayConfig;

use herald_shared::keys::DeviceKey;

use crate::budget::{BacklogBudget, RealtimeLatency};

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
    /// Backlog messages per second of all sessions together, set by the budget controller.
    pub backlog: Arc<BacklogBudget>,
    /// The realtime pushes' latency, one of the budget controller's signals.
    pub realtime: Arc<RealtimeLatency>,
    pub admission: DefaultDirectRateLimiter,
    /// HTTP sends, read receipts, syncs and history pages per device, from one bucket
    /// like a WebSocket session's (which keeps its own).
    pub http_sends: DefaultKeyedRateLimiter<DeviceKey>,
    /// Sends per tenant, HTTP and WebSocket together: one noisy tenant cannot take the
    /// node's whole commit capacity.
    pub tenant_sends: DefaultKeyedRateLimiter<String>,
    pub connections: Arc<ConnectionLimits>,
}

impl NodeLimits {
    pub fn new(cfg: &GatewayConfig) -> Self {
        NodeLimits {
            backlog: Arc::new(BacklogBudget::new(cfg.backlog_rate_node, cfg.backlog_page_desktop as u32)),
            realtime: Arc::new(RealtimeLatency::new(Duration::from_millis(cfg.backlog_realtime_target_ms))),
            admission: bucket(cfg.admission_rate, cfg.admission_burst),
            http_sends: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(nz(cfg.send_rate)).allow_burst(nz(cfg.send_burst)),
            ),
            tenant_sends: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(nz(cfg.tenant_send_rate)).allow_burst(nz(cfg.tenant_send_burst)),
            ),
            connections: Arc::new(ConnectionLimits::new(cfg.max_connections_per_user, cfg.max_connections_per_ip)),
        }
    }

    /// Ok, or the wait before this tenant may send again.
    pub fn tenant_send(&self, tenant: &str) -> Result<(), Duration> {
        self.tenant_sends.check_key(&tenant.to_owned()).map_err(|nu| nu.wait_time_from(DefaultClock::default().now()))
    }

    /// Forgets idle keys (called periodically).
    pub fn retain_recent(&self) {
        self.http_sends.retain_recent();
        self.tenant_sends.retain_recent();
    }

    /// Ok, or the wait before this device may send again.
    pub fn http_send(&self, key: &DeviceKey) -> Result<(), Duration> {
        self.http_sends.check_key(key).map_err(|nu| nu.wait_time_from(DefaultClock::default().now()))
    }

    /// An HTTP `read`, sync or history request (`what`) of this device takes from its
    /// send bucket, as the WebSocket's `read` and `sync` frames do: each costs a MySQL
    /// read or a stream entry. Counted when refused.
    pub fn http_request(&self, key: &DeviceKey, what: &'static str) -> Result<(), Duration> {
        self.http_send(key).inspect_err(|_| {
            metrics::counter!("herald_rate_limited_total", "what" => what).increment(1);
        })
    }
}

/// A retry hint spread out so that refused clients do not return together.
pub fn jittered(base: Duration) -> Duration {
    let base = base.max(Duration::from_millis(100));
    base + Duration::from_millis(rand::random::<u64>() % (base.as_millis() as u64 * 2 + 1))
}

/// Which limit refused a WebSocket session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionRefused {
    User,
    Ip,
}

/// Live WebSocket sessions of this node by user and by IP address. A session holds a
/// [`ConnectionPermit`]; dropping it (the session task ending) gives the slot back.
#[derive(Debug)]
pub struct ConnectionLimits {
    max_per_user: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// (tenant, user) -> device -> sessions (2 while a replacing session starts).
    users: HashMap<(String, String), HashMap<String, u32>>,
    ips: HashMap<IpAddr, usize>,
}

impl ConnectionLimits {
    pub fn new(max_per_user: usize, max_per_ip: usize) -> Self {
        ConnectionLimits { max_per_user, max_per_ip, counts: Mutex::new(Counts::default()) }
    }

    /// Takes a slot for one session of `device`, or says which limit is full. A device
    /// that already has a session here is let in: its new session replaces the old one.
    pub fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        tenant: &str,
        user: &str,
        device: &str,
    ) -> Result<ConnectionPermit, ConnectionRefused> {
        let mut c = self.counts.lock().expect("connection counts");
        if let Some(ip) = ip {
            if c.ips.get(&ip).copied().unwrap_or(0) >= self.max_per_ip {
                return Err(ConnectionRefused::Ip);
            }
        }
        let user_key = (tenant.to_owned(), user.to_owned());
        let devices = c.users.get(&user_key);
        let known = devices.is_some_and(|d| d.contains_key(device));
        if !known && devices.map_or(0, HashMap::len) >= self.max_per_user {
            return Err(ConnectionRefused::User);
        }
        *c.users.entry(user_key.clone()).or_default().entry(device.to_owned()).or_insert(0) += 1;
        if let Some(ip) = ip {
            *c.ips.entry(ip).or_insert(0) += 1;
        }
        Ok(ConnectionPermit { limits: self.clone(), ip, user: user_key, device: device.to_owned() })
    }

    fn release(&self, p: &ConnectionPermit) {
        let mut c = self.counts.lock().expect("connection counts");
        if let Some(ip) = p.ip {
            if let Some(n) = c.ips.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    c.ips.remove(&ip);
                }
            }
        }
        if let Some(devices) = c.users.get_mut(&p.user) {
            if let Some(n) = devices.get_mut(&p.device) {
                *n -= 1;
                if *n == 0 {
                    devices.remove(&p.device);
                }
            }
            if devices.is_empty() {
                c.users.remove(&p.user);
            }
        }
    }
}

/// One session's slot in [`ConnectionLimits`], given back on drop.
#[derive(Debug)]
pub struct ConnectionPermit {
    limits: Arc<ConnectionLimits>,
    ip: Option<IpAddr>,
    user: (String, String),
    device: String,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.limits.release(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_per_user_by_device_and_per_ip() {
        let l = Arc::new(ConnectionLimits::new(2, 3));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = l.admit(Some(ip), "t", "u", "d1").unwrap();
        let _b = l.admit(Some(ip), "t", "u", "d2").unwrap();
        assert_eq!(l.admit(None, "t", "u", "d3").unwrap_err(), ConnectionRefused::User);
        // The same device again replaces its session: let in.
        let _a2 = l.admit(Some(ip), "t", "u", "d1").unwrap();
        assert_eq!(l.admit(Some(ip), "t", "v", "d1").unwrap_err(), ConnectionRefused::Ip);
        // Another tenant's user of the same name is another user.
        let _other = l.admit(None, "t2", "u", "d3").unwrap();
        drop(a);
        assert_eq!(l.admit(None, "t", "u", "d3").unwrap_err(), ConnectionRefused::User, "d1 still has a session");
        drop(_a2);
        let _c = l.admit(Some(ip), "t", "u", "d3").unwrap();
        drop((_b, _c, _other));
        let c = l.counts.lock().unwrap();
        assert!(c.users.is_empty() && c.ips.is_empty(), "{c:?}");
    }
}
