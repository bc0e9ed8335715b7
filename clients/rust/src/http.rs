//! Herald's HTTP API (docs/protocol.md section 2) for one device.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use herald_shared::error::{ErrorBody, ErrorCode};
use herald_shared::ids::MsgId;
use herald_shared::protocol::SendResult;

/// What went wrong with a call: the protocol's error, or the transport.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{status} {code:?}: {message}")]
    Api { status: u16, code: ErrorCode, message: String },
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("unexpected answer {status}: {body}")]
    Unexpected { status: u16, body: String },
}

impl ClientError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// One device's view of the HTTP API.
#[derive(Clone, Debug)]
pub struct HttpClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl HttpClient {
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build()
            .expect("http client");
        HttpClient { http, base: base.into(), token: token.into() }
    }

    /// Shares one connection pool among many devices.
    pub fn with_http(http: reqwest::Client, base: impl Into<String>, token: impl Into<String>) -> Self {
        HttpClient { http, base: base.into(), token: token.into() }
    }

    async fn call<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<(u16, T), ClientError> {
        let resp = req.bearer_auth(&self.token).send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes)
                .map(|v| (status, v))
                .map_err(|_| ClientError::Unexpected { status, body: String::from_utf8_lossy(&bytes).into() });
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Err(ClientError::Api { status, code: e.error.code, message: e.error.message }),
            Err(_) => Err(ClientError::Unexpected { status, body: String::from_utf8_lossy(&bytes).into() }),
        }
    }

    pub async fn register_device(&self) -> Result<Value, ClientError> {
        Ok(self.call(self.http.post(format!("{}/v1/devices", self.base)).json(&json!({}))).await?.1)
    }

    /// Registers (or replaces) this device's push token (docs/protocol.md section 2.12).
    pub async fn register_push(&self, platform: &str, token: &str) -> Result<Value, ClientError> {
        let body = json!({"platform": platform, "token": token});
        Ok(self.call(self.http.put(format!("{}/v1/devices/me/push", self.base)).json(&body)).await?.1)
    }

    /// Removes this device's push token: no more push notifications.
    pub async fn unregister_push(&self) -> Result<(), ClientError> {
        self.delete_no_content("/v1/devices/me/push").await
    }

    /// Logs this device out (`DELETE /v1/devices/me`, docs/protocol.md section 2.10): no more messages
    /// reach it, and its sessions end.
    pub async fn logout(&self) -> Result<(), ClientError> {
        self.delete_no_content("/v1/devices/me").await
    }

    /// A `DELETE` answered 204 on success.
    async fn delete_no_content(&self, path: &str) -> Result<(), ClientError> {
        let resp = self.http.delete(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await?;
        let status = resp.status().as_u16();
        if status == 204 {
            return Ok(());
        }
        let bytes = resp.bytes().await?;
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Err(ClientError::Api { status, code: e.error.code, message: e.error.message }),
            Err(_) => Err(ClientError::Unexpected { status, body: String::from_utf8_lossy(&bytes).into() }),
        }
    }

    /// Creates a conversation; returns the status (201 or 200) and the conversation.
    pub async fn create_conversation(
        &self,
        id: Option<&str>,
        kind: &str,
        members: &[&str],
    ) -> Result<(u16, Value), ClientError> {
        let mut body = json!({"kind": kind, "members": members});
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        self.call(self.http.post(format!("{}/v1/conversations", self.base)).json(&body)).await
    }

    pub async fn change_members(&self, conv: &str, add: &[&str], remove: &[&str]) -> Result<Value, ClientError> {
        let body = json!({"add": add, "remove": remove});
        Ok(self.call(self.http.post(format!("{}/v1/conversations/{conv}/members", self.base)).json(&body)).await?.1)
    }

    /// Sets or removes the title of a group (docs/protocol.md section 2.13).
    pub async fn change_title(&self, conv: &str, title: Option<&str>) -> Result<Value, ClientError> {
        let body = json!({ "title": title });
        Ok(self.call(self.http.post(format!("{}/v1/conversations/{conv}/title", self.base)).json(&body)).await?.1)
    }

    /// Gives a member of a group a role: `owner`, `admin` or `member` (section 2.14).
    pub async fn change_role(&self, conv: &str, user: &str, role: &str) -> Result<Value, ClientError> {
        let body = json!({ "user": user, "role": role });
        Ok(self.call(self.http.post(format!("{}/v1/conversations/{conv}/roles", self.base)).json(&body)).await?.1)
    }

    /// Recalls a message under the idempotency key `cmid`: the recall's event (section 2.15).
    pub async fn recall(&self, id: MsgId, cmid: &str) -> Result<SendResult, ClientError> {
        let body = json!({ "cmid": cmid });
        Ok(self.call(self.http.post(format!("{}/v1/messages/{id}/recall", self.base)).json(&body)).await?.1)
    }

    /// Edits a message under the idempotency key `cmid`: the edit's event (section 2.16).
    pub async fn edit(&self, id: MsgId, cmid: &str, new_body: &Value) -> Result<SendResult, ClientError> {
        let body = json!({ "cmid": cmid, "body": new_body });
        Ok(self.call(self.http.post(format!("{}/v1/messages/{id}/edit", self.base)).json(&body)).await?.1)
    }

    pub async fn list_conversations(&self, limit: u32, cursor: Option<&str>) -> Result<Value, ClientError> {
        let mut url = format!("{}/v1/conversations?limit={limit}", self.base);
        if let Some(c) = cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        Ok(self.call(self.http.get(url)).await?.1)
    }

    pub async fn send(&self, cmid: &str, conv: &str, body: &Value) -> Result<SendResult, ClientError> {
        let req = json!({"cmid": cmid, "conv": conv, "body": body});
        Ok(self.call(self.http.post(format!("{}/v1/messages", self.base)).json(&req)).await?.1)
    }

    /// Sends, retrying with the same `cmid` while the server says `unavailable` or
    /// `rate_limited` (docs/protocol.md section 4, rule 1).
    pub async fn send_until_committed(
        &self,
        cmid: &str,
        conv: &str,
        body: &Value,
        attempts: u32,
    ) -> Result<SendResult, ClientError> {
        let mut last = None;
        for attempt in 0..attempts {
            match self.send(cmid, conv, body).await {
                Ok(r) => return Ok(r),
                Err(e)
                    if matches!(e.code(), Some(ErrorCode::Unavailable) | Some(ErrorCode::RateLimited))
                        || matches!(e, ClientError::Transport(_)) =>
                {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt + 1).min(10))).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// GETs a path; the status and the JSON body, whatever the status.
    pub async fn get_raw(&self, path: &str) -> Result<(u16, Value), ClientError> {
        let resp = self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token).send().await?;
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, v))
    }

    /// Posts raw bytes to a path (for tests of malformed input).
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> Result<(u16, Value), ClientError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, v))
    }
}
