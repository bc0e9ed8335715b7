//! Offline push: a message that a device with a push token has not acked within
//! `push.delay_ms` is handed to its tenant's webhook as a signed notification.
//!
//! The fan-out hands the messages for such devices to the [`PushScheduler`] through a
//! bounded queue (no MySQL on the send path). The scheduler keeps them in memory for the
//! delay, collapsed per device and conversation, then checks in one Redis pipeline which
//! are still in their device's pending set: an acked message (the device was or came
//! online) costs nothing more; the rest are written, collapsed again, to
//! `push_notifications` in one statement. The [`PushDispatcher`] sends due rows to the
//! webhook and retries failures with backoff, DEAD after `push.max_attempts`, the way
//! the outbox treats fan-outs.
//!
//! # Layout
//! - [`schedule`]: the waiting room and the scheduler loop.
//! - [`store`]: the `push_notifications` table (upsert, claim, finish, purge, admin).
//! - [`webhook`]: the notification's body, its signature and the HTTP call.
//! - [`dispatch`]: the dispatcher loop.
//! - [`traces`]: traced notifications' contexts, scheduler to dispatcher, and their spans.

pub mod dispatch;
pub mod schedule;
pub mod store;
pub mod traces;
pub mod webhook;

use std::collections::HashMap;

use fred::prelude::*;
use fred::types::Value;
use herald_shared::config::{PreviewPolicy, PushConfig};
use herald_shared::ids::MsgId;
use herald_shared::keys::Keys;

pub use dispatch::PushDispatcher;
pub use schedule::PushScheduler;
pub use store::PushStore;

/// Where each tenant's notifications go and what they may show (`[push]`).
#[derive(Clone, Debug)]
pub struct Webhooks {
    default_url: Option<String>,
    by_tenant: HashMap<String, String>,
    default_preview: PreviewPolicy,
    previews: HashMap<String, PreviewPolicy>,
}

impl Webhooks {
    /// From a validated configuration.
    pub fn new(cfg: &PushConfig) -> Webhooks {
        Webhooks {
            default_url: Some(cfg.webhook_url.clone()).filter(|u| !u.is_empty()),
            by_tenant: cfg.webhooks_by_tenant().unwrap_or_default().into_iter().collect(),
            default_preview: cfg.default_preview().unwrap_or(PreviewPolicy::Sender),
            previews: cfg.previews_by_tenant().unwrap_or_default().into_iter().collect(),
        }
    }

    /// The tenant's webhook; none: its devices get no notifications.
    pub fn url(&self, tenant: &str) -> Option<&str> {
        self.by_tenant.get(tenant).or(self.default_url.as_ref()).map(String::as_str)
    }

    pub fn preview(&self, tenant: &str) -> PreviewPolicy {
        self.previews.get(tenant).copied().unwrap_or(self.default_preview)
    }
}

/// One device's message to check: (tenant, user, device, message).
pub type AckCheck<'a> = (&'a str, &'a str, &'a str, MsgId);

/// Which of the messages are still in their device's pending set (not acked), in one
/// pipeline. A Redis error counts as not acked: a needless notification is better than
/// a missing one.
pub async fn unacked(redis: &Pool, keys: &Keys, checks: &[AckCheck<'_>]) -> Vec<bool> {
    if checks.is_empty() {
        return Vec::new();
    }
    let pipe = redis.next().pipeline();
    for (tenant, user, device, id) in checks {
        let queued: Result<(), _> = pipe.zscore(keys.pending(tenant, user, device), id.member()).await;
        if queued.is_err() {
            return vec![true; checks.len()];
        }
    }
    let results = pipe.try_all::<Value>().await;
    if results.len() != checks.len() {
        metrics::counter!("herald_push_errors_total", "stage" => "ack_check").increment(1);
        return vec![true; checks.len()];
    }
    results.into_iter().map(|r| !matches!(r, Ok(Value::Null))).collect()
}
