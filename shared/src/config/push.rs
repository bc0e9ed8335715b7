//! `[push]`: the offline push hand-off: the webhook each tenant's notifications go to,
//! what they may show, how long a message waits for its ack, and the retries.

use super::table::{section, WORKER};
use super::{Problems, Secret};

section! {
    /// `[push]`: how the worker hands notifications for unacked messages to a push provider.
    pub struct PushConfig in "push", read by WORKER;
    {
        /// Webhook of every tenant without its own in `push.tenant_webhooks`; empty: none.
        ///
        /// An `http://` or `https://` URL. A tenant with no webhook gets no push
        /// notifications, and its sends cost nothing for push.
        pub webhook_url: String = "",
        /// Webhooks of particular tenants, `tenant=url` comma-separated (over `push.webhook_url`).
        pub tenant_webhooks: String = "",
        /// HMAC-SHA256 key signing every webhook request; required (16 bytes or more) with a webhook.
        pub webhook_secret: Secret = "",
        /// What a notification may show: `none`, `sender` (who wrote) or `text` (who and what).
        pub preview: String = "sender",
        /// Preview policy of particular tenants, `tenant=policy` comma-separated.
        pub tenant_previews: String = "",
        /// How long a message waits for the device's ack before it is pushed.
        ///
        /// Messages of one conversation arriving for a device meanwhile collapse into
        /// one notification; a device that acks within it (it was or came online) gets
        /// none.
        pub delay_ms: u64 = "3000",
        /// Period of the push dispatcher (due notifications are sent every this often).
        pub poll_ms: u64 = "500",
        /// Longest wait for a webhook's answer; past it the attempt failed.
        pub timeout_ms: u64 = "5000",
        /// Delay before webhook retry n, comma-separated (the last value repeats).
        pub backoff_ms: Vec<u64> = "5000,30000,120000,600000",
        /// Failed retries before a notification is DEAD (listed by the admin API).
        pub max_attempts: u32 = "5",
        /// Notifications claimed per dispatcher round.
        pub claim_batch: u32 = "100",
        /// Messages waiting for their ack delay per worker; past it new ones get no push.
        pub max_waiting: usize = "100000",
        /// Delivered notifications are kept this long for the admin API, then purged (1 hour).
        pub sent_retention_s: u64 = "3600",
    }
}

/// What a notification may show (`push.preview`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreviewPolicy {
    /// Nothing but that there is something new.
    None,
    /// Who wrote.
    Sender,
    /// Who wrote, and the start of the text.
    Text,
}

impl std::str::FromStr for PreviewPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(PreviewPolicy::None),
            "sender" => Ok(PreviewPolicy::Sender),
            "text" => Ok(PreviewPolicy::Text),
            other => Err(format!("expected none, sender or text, got {other:?}")),
        }
    }
}

impl PreviewPolicy {
    pub fn name(self) -> &'static str {
        match self {
            PreviewPolicy::None => "none",
            PreviewPolicy::Sender => "sender",
            PreviewPolicy::Text => "text",
        }
    }
}

/// `tenant=value` pairs, comma-separated, each value checked by `value`.
fn per_tenant<T>(text: &str, value: impl Fn(&str) -> Result<T, String>) -> Result<Vec<(String, T)>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((tenant, v)) = part.split_once('=') else {
            return Err(format!("expected tenant=value, comma-separated; got {part:?}"));
        };
        let tenant = tenant.trim();
        if !crate::auth::is_valid_tenant(tenant) {
            return Err(format!("{tenant:?} is not a tenant id"));
        }
        out.push((tenant.to_owned(), value(v.trim())?));
    }
    Ok(out)
}

fn webhook(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !url.contains(char::is_whitespace) => Ok(url.to_owned()),
        _ => Err(format!("expected an http:// or https:// URL, got {url:?}")),
    }
}

impl PushConfig {
    /// `push.tenant_webhooks` as (tenant, URL).
    pub fn webhooks_by_tenant(&self) -> Result<Vec<(String, String)>, String> {
        per_tenant(&self.tenant_webhooks, webhook)
    }

    /// `push.tenant_previews` as (tenant, policy).
    pub fn previews_by_tenant(&self) -> Result<Vec<(String, PreviewPolicy)>, String> {
        per_tenant(&self.tenant_previews, str::parse)
    }

    /// `push.preview`.
    pub fn default_preview(&self) -> Result<PreviewPolicy, String> {
        self.preview.parse()
    }

    /// Whether any tenant has a webhook (else the worker runs no push at all).
    pub fn enabled(&self) -> bool {
        !self.webhook_url.is_empty() || !self.tenant_webhooks.trim().is_empty()
    }

    pub(super) fn validate(&self, bad: &mut Problems) {
        if !self.webhook_url.is_empty() {
            if let Err(e) = webhook(&self.webhook_url) {
                bad.push("push.webhook_url", &e);
            }
        }
        if let Err(e) = self.webhooks_by_tenant() {
            bad.push("push.tenant_webhooks", &e);
        }
        if let Err(e) = self.default_preview() {
            bad.push("push.preview", &e);
        }
        if let Err(e) = self.previews_by_tenant() {
            bad.push("push.tenant_previews", &e);
        }
        if self.enabled() && self.webhook_secret.0.len() < 16 {
            bad.push("push.webhook_secret", "required with a webhook, at least 16 bytes (HERALD_PUSH__WEBHOOK_SECRET)");
        }
        if self.backoff_ms.is_empty() {
            bad.push("push.backoff_ms", "needs at least one delay");
        }
        if self.poll_ms == 0 || self.claim_batch == 0 || self.max_waiting == 0 {
            bad.push("push.poll_ms", "poll_ms, claim_batch and max_waiting must be positive");
        }
        if !(100..=60_000).contains(&self.timeout_ms) {
            bad.push("push.timeout_ms", "must be 100..=60000");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{env, SECRET};
    use super::super::{load, Role};
    use super::PreviewPolicy;

    fn push(pairs: &[(&str, &str)]) -> Result<super::PushConfig, String> {
        let mut all = vec![SECRET];
        all.extend_from_slice(pairs);
        load(Role::Worker, &[], &env(&all)).map(|(cfg, _)| cfg.push).map_err(|e| e.to_string())
    }

    #[test]
    fn push_is_off_by_default_and_needs_a_secret_with_a_webhook() {
        assert!(!push(&[]).unwrap().enabled());
        let err = push(&[("HERALD_PUSH__WEBHOOK_URL", "http://push.internal/hook")]).unwrap_err();
        assert!(err.contains("push.webhook_secret: required with a webhook"), "{err}");
        let on = push(&[
            ("HERALD_PUSH__WEBHOOK_URL", "http://push.internal/hook"),
            ("HERALD_PUSH__WEBHOOK_SECRET", "0123456789abcdef"),
        ])
        .unwrap();
        assert!(on.enabled());
        assert_eq!(format!("{:?}", on.webhook_secret), "<redacted>", "the key never shows in logs");
    }

    #[test]
    fn per_tenant_webhooks_and_previews_are_checked() {
        let secret = ("HERALD_PUSH__WEBHOOK_SECRET", "0123456789abcdef");
        let cfg = push(&[
            ("HERALD_PUSH__TENANT_WEBHOOKS", "acme=https://a.example/push, beta=http://b:8080/p"),
            ("HERALD_PUSH__TENANT_PREVIEWS", "acme=text,beta=none"),
            secret,
        ])
        .unwrap();
        assert_eq!(cfg.webhooks_by_tenant().unwrap()[1], ("beta".into(), "http://b:8080/p".into()));
        assert_eq!(cfg.previews_by_tenant().unwrap()[0], ("acme".into(), PreviewPolicy::Text));
        assert_eq!(cfg.default_preview(), Ok(PreviewPolicy::Sender));

        let err = push(&[("HERALD_PUSH__TENANT_WEBHOOKS", "acme=ftp://a"), secret]).unwrap_err();
        assert!(err.contains("push.tenant_webhooks: expected an http:// or https:// URL"), "{err}");
        let err = push(&[("HERALD_PUSH__TENANT_PREVIEWS", "acme=everything")]).unwrap_err();
        assert!(err.contains("push.tenant_previews: expected none, sender or text"), "{err}");
        let err = push(&[("HERALD_PUSH__PREVIEW", "all")]).unwrap_err();
        assert!(err.contains("push.preview: expected none, sender or text"), "{err}");
        let err = push(&[("HERALD_PUSH__TENANT_WEBHOOKS", "Not A Tenant=http://x"), secret]).unwrap_err();
        assert!(err.contains("is not a tenant id"), "{err}");
    }
}
