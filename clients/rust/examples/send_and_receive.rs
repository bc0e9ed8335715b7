//! Two devices through a running Herald: Bob's device opens a WebSocket session, Alice
//! creates a direct conversation and sends over HTTP (answered once committed), Bob's
//! device shows the message and acks it.
//!
//! ```sh
//! scripts/run.sh        # a local Herald: MariaDB, Redis, one worker, two gateways
//! HERALD_JWT_SECRET=$(cat run/jwt-secret) cargo run -p herald-client --example send_and_receive
//! ```
//! `HERALD_URL` names another gateway (default `http://127.0.0.1:8080`), `HERALD_TENANT`
//! another tenant (default `acme`). Real apps get tokens from their login service; this
//! example signs its own with the gateways' secret.

use std::time::Duration;

use herald_client::{token, HttpClient, WsClient, WsEvent};
use herald_shared::auth::Platform;
use herald_shared::protocol::{AckFrame, ClientFrame, ServerFrame};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("HERALD_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let secret = std::env::var("HERALD_JWT_SECRET").map_err(|_| "set HERALD_JWT_SECRET to the gateways' secret")?;
    let tenant = std::env::var("HERALD_TENANT").unwrap_or_else(|_| "acme".into());

    let mut bob = WsClient::connect(&base, &token(&secret, &tenant, "bob", "phone", Platform::Ios)).await?;
    let alice = HttpClient::new(&base, token(&secret, &tenant, "alice", "laptop", Platform::Desktop));
    let (status, conv) = alice.create_conversation(None, "direct", &["alice", "bob"]).await?;
    let conv = conv["id"].as_str().ok_or(format!("no conversation id in the answer ({status})"))?.to_string();
    let sent = alice.send(&format!("example-{}", std::process::id()), &conv, &json!({"text": "hi Bob"})).await?;
    println!("alice: committed as {} (seq {} of {conv})", sent.id, sent.seq);

    loop {
        match bob.next(Duration::from_secs(10)).await {
            Some(WsEvent::Frame(ServerFrame::Msg(m))) if m.id == sent.id => {
                println!("bob: {} from {} (seq {}): {}", m.id, m.from, m.seq, m.body.get());
                bob.send(&ClientFrame::Ack(AckFrame { ids: vec![m.id] })).await?;
                break;
            }
            Some(WsEvent::Closed(code)) => return Err(format!("the session closed ({code:?})").into()),
            Some(_) => continue, // the session's other frames (hello, backlog, ...)
            None => return Err("no message within 10 s".into()),
        }
    }
    bob.close().await;
    Ok(())
}
