//! The Rust client library: Herald's HTTP API for the load-test and the tests.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::auth::{sign, Claims, Platform};
use crate::error::{ErrorBody, ErrorCode};
use crate::ids::now_ms;
use crate::protocol::SendResult;

/// Mints a token for a device, valid for a day.
pub fn token(secret: &str, tenant: &str, user: &str, device: &str, plat: Platform) -> String {
    let claims =
        Claims { tid: tenant.into(), sub: user.into(), dev: device.into(), plat, exp: now_ms() / 1000 + 86_400 };
    sign(&claims, secret.as_bytes())
}

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
    /// `rate_limited` (PROTOCOL.md section 4.1).
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

/// What a WebSocket client sees next.
#[derive(Debug, Clone, PartialEq)]
pub enum WsEvent {
    /// A JSON text frame.
    Frame(Value),
    /// The server closed, with its close code.
    Closed(Option<u16>),
}

/// A device's WebSocket session (`GET /v1/ws`).
pub struct WsClient {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
}

impl std::fmt::Debug for WsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WsClient")
    }
}

impl WsClient {
    /// Connects with the token in the query string (as browsers must).
    pub async fn connect(base: &str, token: &str) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
        let url = format!("{}/v1/ws?access_token={token}", base.replacen("http", "ws", 1));
        let (ws, _) = tokio_tungstenite::connect_async(url).await?;
        Ok(WsClient { ws })
    }

    /// Like [`WsClient::connect`], from a chosen local address (many loopback addresses
    /// give a load-test more source ports than one address has).
    pub async fn connect_from(
        base: &str,
        token: &str,
        local: Option<std::net::IpAddr>,
    ) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
        let Some(local) = local else { return Self::connect(base, token).await };
        let url = format!("{}/v1/ws?access_token={token}", base.replacen("http", "ws", 1));
        let host = base.split("://").nth(1).unwrap_or(base).trim_end_matches('/');
        let remote = tokio::net::lookup_host(host)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} does not resolve")))?;
        let socket = if remote.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.bind(std::net::SocketAddr::new(local, 0))?;
        let stream = socket.connect(remote).await?;
        stream.set_nodelay(true)?;
        let (ws, _) = tokio_tungstenite::client_async(url, tokio_tungstenite::MaybeTlsStream::Plain(stream)).await?;
        Ok(WsClient { ws })
    }

    pub async fn send(&mut self, frame: &Value) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        use futures::SinkExt;
        self.ws.send(tokio_tungstenite::tungstenite::Message::text(frame.to_string())).await
    }

    /// Sends raw text (for tests of malformed frames).
    pub async fn send_text(&mut self, text: &str) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        use futures::SinkExt;
        self.ws.send(tokio_tungstenite::tungstenite::Message::text(text.to_owned())).await
    }

    /// The next frame or close, within `timeout`; `None` on timeout.
    pub async fn next(&mut self, timeout: Duration) -> Option<WsEvent> {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next()).await.ok()?;
            match msg {
                Some(Ok(Message::Text(t))) => {
                    return Some(WsEvent::Frame(
                        serde_json::from_str(t.as_str()).unwrap_or(Value::String(t.to_string())),
                    ))
                }
                Some(Ok(Message::Close(c))) => return Some(WsEvent::Closed(c.map(|c| u16::from(c.code)))),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Some(WsEvent::Closed(None)),
            }
        }
    }

    /// The next frame of type `t`, skipping others; `None` on timeout or close.
    pub async fn next_of(&mut self, t: &str, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                WsEvent::Frame(f) if f["t"] == t => return Some(f),
                WsEvent::Frame(_) => continue,
                WsEvent::Closed(_) => return None,
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}
