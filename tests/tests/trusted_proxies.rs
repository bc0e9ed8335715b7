//! The client address behind a proxy: `X-Forwarded-For` names the client (for the
//! per-IP session limit) only when the socket peer is in `gateway.trusted_proxies`.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use herald_shared::error::ErrorCode;
use herald_shared::protocol::ServerFrame;
use herald_tests::Cluster;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(5);

/// How the gateway answered a WebSocket upgrade.
#[derive(Debug, PartialEq)]
enum Answer {
    Hello,
    RefusedForTheAddress,
}

/// Opens a session from the local address `from` with an `X-Forwarded-For` header and
/// returns the gateway's first frame, and the socket to keep the session open.
async fn connect(gw: SocketAddr, token: &str, from: &str, forwarded: &str) -> (Answer, impl Sized) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.parse().unwrap(), 0)).unwrap();
    let stream = socket.connect(gw).await.unwrap();
    let mut req = format!("ws://{gw}/v1/ws?access_token={token}").into_client_request().unwrap();
    req.headers_mut().insert("x-forwarded-for", forwarded.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(req, stream).await.expect("upgrade");
    let first = loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("a first frame") {
            Some(Ok(Message::Text(t))) => break ServerFrame::parse(t.as_str()).expect("a server frame"),
            Some(Ok(_)) => continue,
            other => panic!("closed before a first frame: {other:?}"),
        }
    };
    let answer = match first {
        ServerFrame::Hello(_) => Answer::Hello,
        ServerFrame::Error(e) if e.code == ErrorCode::RateLimited && e.message.contains("address") => {
            Answer::RefusedForTheAddress
        }
        other => panic!("unexpected first frame {other:?}"),
    };
    (answer, ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_clients_get_their_own_limit_only_through_trusted_proxies() {
    let mut c = Cluster::new("trusted-proxies");
    c.start_worker(&[]).await;
    c.start_gateway(&[
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "1"),
        ("HERALD_GATEWAY__TRUSTED_PROXIES", "127.0.0.2/32, 10.0.0.0/8"),
    ])
    .await;
    let gw = c.gateways[0].listen();
    let mut open = Vec::new();
    let mut check = |answer: Answer, ws, expected: Answer, what: &str| {
        assert_eq!(answer, expected, "{what}");
        open.push(ws);
    };

    // Through the trusted proxy 127.0.0.2: each forwarded client has its own slot.
    let (a, ws) = connect(gw, &c.token("ann", "a1"), "127.0.0.2", "203.0.113.1").await;
    check(a, ws, Answer::Hello, "the first client behind the proxy");
    let (a, ws) = connect(gw, &c.token("bea", "b1"), "127.0.0.2", "203.0.113.2").await;
    check(a, ws, Answer::Hello, "another client behind the same proxy");
    // A client that forges an address to the left is still itself (the right-most
    // address not trusted), and its slot is taken.
    let (a, ws) = connect(gw, &c.token("cid", "c1"), "127.0.0.2", "198.51.100.7, 203.0.113.1").await;
    check(a, ws, Answer::RefusedForTheAddress, "a second session of 203.0.113.1, forged prefix or not");
    // A chain through a second trusted proxy names the client before it.
    let (a, ws) = connect(gw, &c.token("dot", "d1"), "127.0.0.2", "203.0.113.3, 10.1.2.3").await;
    check(a, ws, Answer::Hello, "a client behind two trusted proxies");

    // From an untrusted peer the header is ignored: the peer is the client.
    let (a, ws) = connect(gw, &c.token("eve", "e1"), "127.0.0.3", "203.0.113.50").await;
    check(a, ws, Answer::Hello, "the first session of the untrusted peer");
    let (a, ws) = connect(gw, &c.token("fay", "f1"), "127.0.0.3", "203.0.113.51").await;
    check(a, ws, Answer::RefusedForTheAddress, "another forwarded address from the untrusted peer");
}
