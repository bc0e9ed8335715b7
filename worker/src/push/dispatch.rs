//! The dispatcher: every `push.poll_ms` (or when the scheduler wrote rows) it claims due
//! notifications, drops those whose device acked meanwhile or unregistered its token,
//! and POSTs the rest with their badge and preview; 2xx is SENT, anything else FAILED
//! with backoff, DEAD after `push.max_attempts` failed retries.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use herald_shared::config::PreviewPolicy;
use herald_shared::ids::now_ms;
use herald_shared::keys::Keys;
use herald_shared::otel::Tracer;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::store::{Claimed, PushStore, Registration};
use super::traces::PushTraces;
use super::webhook::{Notification, Preview, WebhookClient};
use super::Webhooks;

/// Webhook calls in flight at once per worker.
pub const CONCURRENCY: usize = 16;

#[derive(Clone, Debug)]
pub struct PushDispatcher {
    pub store: Arc<PushStore>,
    pub redis: fred::prelude::Pool,
    pub keys: Keys,
    pub webhooks: Arc<Webhooks>,
    pub client: WebhookClient,
    pub poll: Duration,
    pub sent_retention_ms: u64,
    /// Rung by the scheduler when it wrote rows.
    pub wake: Arc<Notify>,
    /// The spans of traced notifications' webhook calls (`super::traces`).
    pub tracer: Tracer,
    pub traces: Arc<PushTraces>,
}

impl PushDispatcher {
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.poll) => {}
                _ = self.wake.notified() => {}
            }
            if let Err(e) = self.round().await {
                metrics::counter!("herald_push_errors_total", "stage" => "dispatch").increment(1);
                tracing::warn!(error = %e, source = "mysql", "push dispatcher round failed");
            }
            if let Err(e) = self.store.purge(self.sent_retention_ms).await {
                tracing::warn!(error = %e, source = "mysql", "push purge failed");
            }
        }
    }

    async fn round(&self) -> Result<(), sqlx::Error> {
        loop {
            let claimed = self.store.claim().await?;
            let full = claimed.len() as u32 >= self.store.claim_batch;
            self.send(claimed).await?;
            if !full {
                return Ok(());
            }
        }
    }

    async fn send(&self, claimed: Vec<Claimed>) -> Result<(), sqlx::Error> {
        if claimed.is_empty() {
            return Ok(());
        }
        // Quiet: acked since (the device came online), or no token any more.
        let checks: Vec<_> =
            claimed.iter().map(|c| (c.tenant.as_str(), c.user.as_str(), c.device.as_str(), c.msg.id)).collect();
        let unacked = super::unacked(&self.redis, &self.keys, &checks).await;
        let registrations = self.store.registrations(&claimed).await?;
        let mut due = Vec::with_capacity(claimed.len());
        for (c, unacked) in claimed.into_iter().zip(unacked) {
            let target = (c.tenant.clone(), c.user.clone(), c.device.clone());
            match registrations.get(&target) {
                Some(r) if unacked && self.webhooks.url(&c.tenant).is_some() => due.push((c, r.clone())),
                _ => {
                    metrics::counter!("herald_push_quiet_total").increment(1);
                    self.store.quiet(&c).await?;
                }
            }
        }
        if due.is_empty() {
            return Ok(());
        }
        let users: BTreeSet<(&str, &str)> = due.iter().map(|(c, _)| (c.tenant.as_str(), c.user.as_str())).collect();
        let badges = self.store.badges(&users.into_iter().collect::<Vec<_>>()).await?;
        let texts: Vec<_> = due
            .iter()
            .filter(|(c, _)| self.webhooks.preview(&c.tenant) == PreviewPolicy::Text)
            .map(|(c, _)| c.msg.id)
            .collect();
        let bodies = if texts.is_empty() { HashMap::new() } else { self.store.bodies(&texts).await? };

        let outcomes: Vec<(Claimed, Result<(), String>)> = stream::iter(due)
            .map(|(c, r)| {
                let badge = badges.get(&(c.tenant.clone(), c.user.clone())).copied().unwrap_or(0);
                let body = bodies.get(&c.msg.id).map(String::as_str);
                async move {
                    let mut span = self.traces.start(&self.tracer, &c);
                    let outcome = self.post(&c, &r, badge, body).await;
                    match &outcome {
                        Ok(()) => span.succeed("sent"),
                        Err(_) => span.fail("failed"),
                    }
                    span.end();
                    (c, outcome)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (c, outcome) in outcomes {
            match outcome {
                Ok(()) => {
                    metrics::counter!("herald_push_notifications_total", "outcome" => "sent").increment(1);
                    self.store.delivered(&c).await?;
                }
                Err(e) => {
                    let dead = self.store.failed(&c, &e).await?;
                    let outcome = if dead { "dead" } else { "failed" };
                    metrics::counter!("herald_push_notifications_total", "outcome" => outcome).increment(1);
                    if dead {
                        tracing::error!(notification = c.row, tenant = %c.tenant, error = %e,
                            "push notification is DEAD; see the admin API");
                    } else {
                        tracing::warn!(notification = c.row, tenant = %c.tenant, error = %e, "push webhook failed; will retry");
                    }
                }
            }
        }
        Ok(())
    }

    async fn post(&self, c: &Claimed, r: &Registration, badge: u64, body: Option<&str>) -> Result<(), String> {
        let url = self.webhooks.url(&c.tenant).ok_or("the tenant has no webhook")?;
        let n = Notification {
            id: c.key(),
            attempt: c.failures + 1,
            tenant: &c.tenant,
            user: &c.user,
            device: &c.device,
            platform: &r.platform,
            token: &r.token,
            conv: &c.conv,
            sender: &c.msg.sender,
            msg_id: c.msg.id.0.to_string(),
            count: c.msg.count,
            badge,
            preview: Preview::new(self.webhooks.preview(&c.tenant), &c.msg.sender, body),
            ts: now_ms(),
        };
        self.client.post(url, &n).await
    }
}
