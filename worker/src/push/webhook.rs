//! The webhook call: the notification's JSON body, signed with HMAC-SHA256 over
//! `{timestamp}.{body}` (docs/protocol.md section 4.10), POSTed to the tenant's URL.

use std::time::Duration;

use herald_shared::config::PreviewPolicy;
use herald_shared::ids::now_ms;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

/// Longest text preview, in characters.
pub const PREVIEW_CHARS: usize = 100;

/// What the notification shown on the device may contain, as the tenant's policy allows.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct Preview {
    pub policy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Preview {
    /// The preview of a message from `sender` with the JSON `body`: its `text` field,
    /// when it has one, cut to [`PREVIEW_CHARS`].
    pub fn new(policy: PreviewPolicy, sender: &str, body: Option<&str>) -> Preview {
        let text = || {
            let body: serde_json::Value = serde_json::from_str(body?).ok()?;
            Some(body.get("text")?.as_str()?.chars().take(PREVIEW_CHARS).collect())
        };
        match policy {
            PreviewPolicy::None => Preview { policy: policy.name(), sender: None, text: None },
            PreviewPolicy::Sender => Preview { policy: policy.name(), sender: Some(sender.into()), text: None },
            PreviewPolicy::Text => Preview { policy: policy.name(), sender: Some(sender.into()), text: text() },
        }
    }
}

/// The webhook's body.
#[derive(Debug, Serialize)]
pub struct Notification<'a> {
    /// The notification's id: the same across its retries (deduplicate by it), a new
    /// one for the next notification of the device and conversation.
    pub id: String,
    /// 1 for the first try.
    pub attempt: u32,
    pub tenant: &'a str,
    pub user: &'a str,
    pub device: &'a str,
    pub platform: &'a str,
    pub token: &'a str,
    pub conv: &'a str,
    /// The sender of the latest message.
    pub sender: &'a str,
    /// The latest message's id, a decimal string.
    pub msg_id: String,
    /// Messages of the conversation this notification stands for.
    pub count: u32,
    /// The user's unread total over all conversations.
    pub badge: u64,
    pub preview: Preview,
    pub ts: u64,
}

/// `sha256=<hex>`: the HMAC-SHA256 of `{timestamp}.{body}` under `secret`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// POSTs signed notifications.
#[derive(Clone, Debug)]
pub struct WebhookClient {
    http: reqwest::Client,
    secret: Vec<u8>,
}

impl WebhookClient {
    pub fn new(secret: &[u8], timeout: Duration) -> WebhookClient {
        let http = reqwest::Client::builder().timeout(timeout).pool_max_idle_per_host(16).build().expect("http client");
        WebhookClient { http, secret: secret.to_vec() }
    }

    /// Sends one notification; a 2xx answer is delivered, anything else an error to
    /// record and retry.
    pub async fn post(&self, url: &str, n: &Notification<'_>) -> Result<(), String> {
        let body = serde_json::to_vec(n).expect("notification serializes");
        let ts = now_ms();
        let started = std::time::Instant::now();
        let sent = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("x-herald-timestamp", ts.to_string())
            .header("x-herald-signature", signature(&self.secret, ts, &body))
            .body(body)
            .send()
            .await;
        metrics::histogram!("herald_push_webhook_seconds").record(started.elapsed().as_secs_f64());
        match sent {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("webhook answered {}", r.status().as_u16())),
            Err(e) if e.is_timeout() => Err("webhook timed out".into()),
            Err(e) => Err(format!("webhook unreachable: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        let sig = signature(b"Jefe", 0, b"what do ya want for nothing?");
        assert_ne!(sig, signature(b"Jefe", 1, b"what do ya want for nothing?"), "the timestamp is signed");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"0.what do ya want for nothing?");
        mac.verify_slice(&hex(&sig["sha256=".len()..])).expect("a receiver's check passes");
        assert_eq!(sig.len(), "sha256=".len() + 64, "{sig}");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn previews_show_what_the_policy_allows() {
        let body = Some(r#"{"text": "hello there"}"#);
        assert_eq!(
            Preview::new(PreviewPolicy::None, "alice", body),
            Preview { policy: "none", sender: None, text: None }
        );
        assert_eq!(Preview::new(PreviewPolicy::Sender, "alice", body).text, None);
        assert_eq!(Preview::new(PreviewPolicy::Text, "alice", body).text.as_deref(), Some("hello there"));
        assert_eq!(Preview::new(PreviewPolicy::Text, "alice", Some(r#"{"img": 1}"#)).text, None, "no text field");
        let long = format!(r#"{{"text": "{}"}}"#, "é".repeat(300));
        assert_eq!(Preview::new(PreviewPolicy::Text, "a", Some(&long)).text.unwrap().chars().count(), PREVIEW_CHARS);
    }
}
