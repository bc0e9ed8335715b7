//! The Rust client library's `Device` follows docs/client.md: it sends its token as the
//! first frame and offers `herald.v1` (section 1). What it puts on the wire is read
//! through a recording proxy.

use std::time::Duration;

use herald_client::device::{DeviceSpec, TokenIn};
use herald_shared::protocol::{ClientFrame, SUBPROTOCOL};
use herald_tests::{eventually, AutoDevice, Cluster, WireTap};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_authenticates_by_its_first_frame_offering_herald_v1() {
    let mut c = Cluster::new("rdevauth");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let tap = WireTap::start(c.gateways[0].listen()).await;
    let token = c.token("alice", "a1");
    let alice = AutoDevice::connect(&tap.url(), &token, "alice", "a1").await;
    let bob = c.client(0, "bob", "b1");
    bob.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    bob.send("m-1", "ab", &json!("hi")).await.unwrap();
    eventually(WAIT, "the session delivers", || async { (!alice.ids().is_empty()).then_some(()) }).await;

    let wire = tap.connections();
    assert_eq!(wire.len(), 1, "one session");
    let (request, response) = (wire[0].request_head().to_lowercase(), wire[0].response_head().to_lowercase());
    assert!(request.starts_with("get /v1/ws http/1.1\r\n"), "no token in the URL: {request}");
    assert!(!request.contains(&token.to_lowercase()), "the token is nowhere in the request head: {request}");
    assert!(request.contains(&format!("\r\nsec-websocket-protocol: {SUBPROTOCOL}")), "herald.v1 offered: {request}");
    assert!(response.contains(&format!("\r\nsec-websocket-protocol: {SUBPROTOCOL}")), "and chosen: {response}");
    let first = wire[0].first_client_text().expect("a first text frame");
    match ClientFrame::parse(&first) {
        Ok(ClientFrame::Auth(f)) => assert_eq!(f.token, token, "the device's token"),
        other => panic!("the first frame is not auth: {first}: {other:?}"),
    }
    alice.stop().await;

    // The query string and no subprotocol remain available, for gateways older than both.
    let spec = DeviceSpec {
        token_in: TokenIn::Query,
        offer_subprotocol: false,
        ..AutoDevice::spec(&tap.url(), &token, "alice", "a1")
    };
    let old_style = AutoDevice::start(spec).await.expect("hello with the token in the URL");
    let wire = tap.connections();
    let request = wire[1].request_head().to_lowercase();
    assert!(request.starts_with("get /v1/ws?access_token="), "{request}");
    assert!(!request.contains("sec-websocket-protocol"), "{request}");
    assert!(wire[1].first_client_text().is_none_or(|t| !t.contains("\"auth\"")), "no auth frame");
    old_style.stop().await;
}
