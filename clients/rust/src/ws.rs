//! A device's WebSocket session (`GET /v1/ws`), frames typed both ways.

use std::time::Duration;

use herald_shared::protocol::{ClientFrame, FrameKind, ServerFrame};

use crate::tls::Tls;

/// What a WebSocket client sees next.
#[derive(Debug, Clone, PartialEq)]
pub enum WsEvent {
    /// A server frame.
    Frame(ServerFrame),
    /// A text frame that is no server frame this build knows (a newer server's): clients
    /// skip it.
    Other(String),
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

/// Frames are small: a read buffer of 4 KiB, not tungstenite's 128 KiB, which it
/// zeroes on every read (a third of a load-test's CPU with thousands of sessions).
fn config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(4 * 1024)
}

/// How a session is opened: where the token goes, which subprotocols are offered, from
/// which address, whom to trust.
#[derive(Clone, Copy, Debug, Default)]
pub struct Upgrade<'a> {
    /// The token in the query string (`?access_token=`); `None`: the session's first
    /// frame must be `auth` (docs/protocol.md section 3.1).
    pub query_token: Option<&'a str>,
    /// Offered in `Sec-WebSocket-Protocol`; the handshake fails unless the server
    /// chooses one of them (none offered: none may be chosen).
    pub protocols: &'a [&'a str],
    /// Local address to connect from (many loopback addresses give a load-test more
    /// source ports than one address has).
    pub local: Option<std::net::IpAddr>,
    /// Whom to trust for an `https://` gateway (the system's roots when `None`).
    pub tls: Option<&'a Tls>,
    /// Optional frames asked for (`?features=`, docs/protocol.md section 3.1), such as
    /// `delivered`; gateways ignore names they do not know.
    pub features: &'a [&'a str],
}

impl WsClient {
    /// Connects with the token in the query string; an `https://` base connects with
    /// `wss://`, trusting the system's roots.
    pub async fn connect(base: &str, token: &str) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
        Self::connect_with(base, token, None, &Tls::system()).await
    }

    /// Like [`WsClient::connect`], from a chosen local address.
    pub async fn connect_from(
        base: &str,
        token: &str,
        local: Option<std::net::IpAddr>,
    ) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
        Self::connect_with(base, token, local, &Tls::system()).await
    }

    /// Like [`WsClient::connect_from`], trusting `tls` when the gateway is `https://`.
    pub async fn connect_with(
        base: &str,
        token: &str,
        local: Option<std::net::IpAddr>,
        tls: &Tls,
    ) -> Result<WsClient, tokio_tungstenite::tungstenite::Error> {
        let upgrade = Upgrade { query_token: Some(token), local, tls: Some(tls), ..Upgrade::default() };
        Ok(Self::open(base, &upgrade).await?.0)
    }

    /// Connects with the token in the query string when given (else the first frame must
    /// be `auth`), offering these subprotocols; also returns the one the server chose.
    pub async fn connect_offering(
        base: &str,
        token: Option<&str>,
        protocols: &[&str],
    ) -> Result<(WsClient, Option<String>), tokio_tungstenite::tungstenite::Error> {
        Self::open(base, &Upgrade { query_token: token, protocols, ..Upgrade::default() }).await
    }

    /// Opens a session as `upgrade` says; also returns the subprotocol the server chose.
    pub async fn open(
        base: &str,
        upgrade: &Upgrade<'_>,
    ) -> Result<(WsClient, Option<String>), tokio_tungstenite::tungstenite::Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut params: Vec<String> = upgrade.query_token.map(|t| format!("access_token={t}")).into_iter().collect();
        if !upgrade.features.is_empty() {
            params.push(format!("features={}", upgrade.features.join(",")));
        }
        let query = if params.is_empty() { String::new() } else { format!("?{}", params.join("&")) };
        let mut request = format!("{}/v1/ws{query}", base.replacen("http", "ws", 1)).into_client_request()?;
        if !upgrade.protocols.is_empty() {
            let offer =
                upgrade.protocols.join(", ").parse().map_err(tokio_tungstenite::tungstenite::http::Error::from)?;
            request.headers_mut().insert("sec-websocket-protocol", offer);
        }
        let stream = tcp(base, upgrade.local).await?;
        let system;
        let tls = match upgrade.tls {
            Some(tls) => tls,
            None => {
                system = Tls::system();
                &system
            }
        };
        let (ws, response) =
            tokio_tungstenite::client_async_tls_with_config(request, stream, Some(config()), Some(tls.connector()))
                .await?;
        let chosen = response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok((WsClient { ws }, chosen))
    }

    pub async fn send(&mut self, frame: &ClientFrame) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        self.send_text(&frame.to_json()).await
    }

    /// Sends any JSON value (for tests of frames a well-behaved client never sends).
    pub async fn send_json(&mut self, frame: &serde_json::Value) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        self.send_text(&frame.to_string()).await
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
                    return Some(match ServerFrame::parse(t.as_str()) {
                        Ok(f) => WsEvent::Frame(f),
                        Err(_) => WsEvent::Other(t.to_string()),
                    })
                }
                Some(Ok(Message::Close(c))) => return Some(WsEvent::Closed(c.map(|c| u16::from(c.code)))),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Some(WsEvent::Closed(None)),
            }
        }
    }

    /// The next frame of kind `T` (`ws.next_of::<Hello>(..)`), skipping others; `None`
    /// on timeout or close.
    pub async fn next_of<T: FrameKind>(&mut self, timeout: Duration) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                WsEvent::Frame(f) => {
                    if let Some(f) = T::from_frame(f) {
                        return Some(f);
                    }
                }
                WsEvent::Other(_) => continue,
                WsEvent::Closed(_) => return None,
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// A TCP connection to the gateway of `base` (`http://host:port`, `https://host`),
/// from `local` when given, without Nagle's delay (frames are small and latency counts).
async fn tcp(base: &str, local: Option<std::net::IpAddr>) -> std::io::Result<tokio::net::TcpStream> {
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let host = rest.split('/').next().unwrap_or(rest);
    let has_port = host.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let host = if has_port { host.to_owned() } else { format!("{host}:{}", if scheme == "https" { 443 } else { 80 }) };
    let remote = tokio::net::lookup_host(&host)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} does not resolve")))?;
    let socket = if remote.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    if let Some(local) = local {
        socket.bind(std::net::SocketAddr::new(local, 0))?;
    }
    let stream = socket.connect(remote).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}
