//! Offline push (issue 18): a message a device with a push token has not acked within
//! `push.delay_ms` goes to the tenant's webhook, signed, collapsed per conversation,
//! retried with backoff and dead-lettered; a device that acks in time gets nothing.
//! The webhook is a local receiver that checks every signature.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use herald_tests::{eventually, AutoDevice, Cluster, ADMIN_TOKEN, TENANT};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

const PUSH_SECRET: &str = "push-secret-0123456789";
/// Long enough that a loaded machine sends three messages, or reconnects a device, within it.
const DELAY_MS: u64 = 2_000;

/// One request the receiver took.
#[derive(Clone, Debug)]
struct Hit {
    body: Value,
    signed: bool,
    answered: u16,
}

/// A webhook that verifies signatures, records every request, and answers each
/// conversation's n-th request with its script's n-th status (then 200).
#[derive(Clone, Default)]
struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
    script: Arc<Mutex<HashMap<String, Vec<u16>>>>,
    /// Requests of these conversations are answered only after this long.
    hold: Arc<Mutex<HashMap<String, Duration>>>,
}

impl Receiver {
    async fn start(script: &[(&str, &[u16])]) -> (Receiver, SocketAddr) {
        let r = Receiver::default();
        r.script.lock().unwrap().extend(script.iter().map(|(conv, s)| (conv.to_string(), s.to_vec())));
        let app = axum::Router::new().route("/hook", axum::routing::post(take)).with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (r, addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    fn of(&self, conv: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.body["conv"] == conv).collect()
    }
}

fn verify(headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (Some(ts), Some(sig)) = (header("x-herald-timestamp"), header("x-herald-signature")) else {
        return false;
    };
    let Some(hex) = sig.strip_prefix("sha256=") else { return false };
    let given: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect();
    let Some(given) = given else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(PUSH_SECRET.as_bytes()).unwrap();
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

async fn take(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let signed = verify(&headers, &body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let conv = body["conv"].as_str().unwrap_or_default().to_owned();
    let answered = {
        let mut hits = r.hits.lock().unwrap();
        let nth = hits.iter().filter(|h| h.body["conv"] == conv.as_str()).count();
        let answered = r.script.lock().unwrap().get(&conv).and_then(|s| s.get(nth).copied()).unwrap_or(200);
        hits.push(Hit { body, signed, answered });
        answered
    };
    let hold = r.hold.lock().unwrap().get(&conv).copied();
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    StatusCode::from_u16(answered).unwrap()
}

/// A cluster whose tenant's notifications go to `hook`, with quick retries.
async fn cluster(name: &str, hook: SocketAddr) -> Cluster {
    cluster_with(name, hook, &[]).await
}

/// [`cluster`] with settings of its own for the worker.
async fn cluster_with(name: &str, hook: SocketAddr, worker: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_PUSH__TENANT_WEBHOOKS", &format!("{TENANT}=http://{hook}/hook"))
        .set("HERALD_PUSH__WEBHOOK_SECRET", PUSH_SECRET)
        .set("HERALD_PUSH__TENANT_PREVIEWS", &format!("{TENANT}=text"))
        .set("HERALD_PUSH__DELAY_MS", &DELAY_MS.to_string())
        .set("HERALD_PUSH__POLL_MS", "100")
        .set("HERALD_PUSH__BACKOFF_MS", "300")
        .set("HERALD_PUSH__MAX_ATTEMPTS", "2");
    c.start_worker(worker).await;
    c.start_gateway(&[]).await;
    c
}

/// Waits out the delay and a few dispatcher rounds: what has not come by then does not.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(DELAY_MS * 2 + 1_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_to_an_offline_device_collapse_into_one_signed_notification() {
    let (hook, addr) = Receiver::start(&[]).await;
    let c = cluster("push-collapse", addr).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("other"), "direct", &["alice", "bob"]).await.unwrap();
    // Alice's other device has a token too: her own messages never notify her.
    c.client(0, "alice", "a2").register_push("apns", "alice-token").await.unwrap();
    let b1 = c.client(0, "bob", "b1");
    let registered = b1.register_push("fcm", "bob-token").await.unwrap();
    assert_eq!((registered["platform"].as_str(), registered["token"].as_str()), (Some("fcm"), Some("bob-token")));
    c.client(0, "bob", "b2").register_device().await.unwrap(); // no token: never pushed

    let mut last = None;
    for n in 1..=3 {
        last = Some(alice.send(&format!("m{n}"), "ab", &json!({"text": format!("hello {n}")})).await.unwrap());
    }
    eventually(Duration::from_secs(15), "bob's notification", || async { (!hook.hits().is_empty()).then_some(()) })
        .await;
    settle().await;
    let hits = hook.hits();
    assert_eq!(hits.len(), 1, "three messages within the delay are one notification: {hits:?}");
    let n = &hits[0];
    assert!(n.signed, "the signature verifies");
    let b = &n.body;
    assert_eq!(
        (b["tenant"].as_str(), b["user"].as_str(), b["device"].as_str()),
        (Some(TENANT), Some("bob"), Some("b1"))
    );
    assert_eq!((b["platform"].as_str(), b["token"].as_str()), (Some("fcm"), Some("bob-token")));
    assert_eq!((b["conv"].as_str(), b["sender"].as_str()), (Some("ab"), Some("alice")));
    assert_eq!(b["count"], 3, "{b}");
    assert_eq!(b["badge"], 3, "bob's unread total: {b}");
    assert_eq!(b["msg_id"], json!(last.unwrap().id.to_string()), "names the latest message");
    assert_eq!(b["preview"], json!({"policy": "text", "sender": "alice", "text": "hello 3"}));
    assert_eq!(b["attempt"], 1);

    // The next message is a new notification, and the badge counts every conversation.
    alice.send("m4", "other", &json!({"text": "elsewhere"})).await.unwrap();
    let next =
        eventually(Duration::from_secs(15), "the second notification", || async { hook.of("other").first().cloned() })
            .await;
    assert_eq!((next.body["count"].clone(), next.body["badge"].clone()), (json!(1), json!(4)), "{}", next.body);

    // Another tenant has no webhook: its devices' messages cost nothing and go nowhere.
    let x = c.client_in(0, "globex", "carol", "c1");
    x.create_conversation(Some("ab"), "direct", &["carol", "dave"]).await.unwrap();
    c.client_in(0, "globex", "dave", "d1").register_push("apns", "dave-token").await.unwrap();
    x.send("x1", "ab", &json!({"text": "secret"})).await.unwrap();
    settle().await;
    assert_eq!(hook.hits().len(), 2, "nothing for a tenant without a webhook: {:?}", hook.hits());
    assert!(hook.hits().iter().all(|h| h.body["user"] == "bob"), "alice's own messages never notify her");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_acks_within_the_delay_gets_no_notification() {
    let (hook, addr) = Receiver::start(&[]).await;
    let c = cluster("push-quiet", addr).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("apns", "bob-token").await.unwrap();
    let base = c.gateways[0].base_url();

    // Online: it acks at once.
    let b1 = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    alice.send("m1", "ab", &json!({"text": "online"})).await.unwrap();
    eventually(Duration::from_secs(10), "b1 gets m1", || async { (b1.ids().len() == 1).then_some(()) }).await;
    settle().await;
    assert!(hook.hits().is_empty(), "an online device that acked is not pushed: {:?}", hook.hits());
    b1.stop().await;

    // Offline, then back within the delay: its session delivers and it acks.
    alice.send("m2", "ab", &json!({"text": "while away"})).await.unwrap();
    let b1 = AutoDevice::connect(&base, &c.token("bob", "b1"), "bob", "b1").await;
    eventually(Duration::from_secs(10), "b1 gets m2", || async { (b1.ids().len() == 1).then_some(()) }).await;
    settle().await;
    assert!(hook.hits().is_empty(), "a device back within the delay is not pushed: {:?}", hook.hits());
    b1.stop().await;

    // Offline and staying away: pushed (the receiver works in this test).
    alice.send("m3", "ab", &json!({"text": "gone"})).await.unwrap();
    let hit = eventually(Duration::from_secs(15), "the notification", || async { hook.hits().first().cloned() }).await;
    assert_eq!(hit.body["count"], 1, "only the unacked message: {}", hit.body);

    // Unregistered: nothing more.
    c.client(0, "bob", "b1").unregister_push().await.unwrap();
    alice.send("m4", "ab", &json!({"text": "unregistered"})).await.unwrap();
    settle().await;
    assert_eq!(hook.hits().len(), 1, "no token, no push: {:?}", hook.hits());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_is_retried_with_backoff_and_dead_lettered() {
    let (hook, addr) = Receiver::start(&[("flaky", &[500, 503]), ("down", &[500; 10])]).await;
    let c = cluster("push-retry", addr).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("flaky"), "direct", &["alice", "bob"]).await.unwrap();
    alice.create_conversation(Some("down"), "direct", &["alice", "carol"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("fcm", "bob-token").await.unwrap();
    c.client(0, "carol", "c1").register_push("fcm", "carol-token").await.unwrap();
    alice.send("f1", "flaky", &json!({"text": "one"})).await.unwrap();
    alice.send("d1", "down", &json!({"text": "two"})).await.unwrap();

    // 500, 503, then 200: delivered once, on the third attempt, with the same id.
    let flaky = eventually(Duration::from_secs(20), "the flaky webhook takes it", || async {
        let hits = hook.of("flaky");
        hits.iter().any(|h| h.answered == 200).then_some(hits)
    })
    .await;
    assert_eq!(flaky.iter().map(|h| h.answered).collect::<Vec<_>>(), [500, 503, 200]);
    assert_eq!(flaky.iter().map(|h| h.body["attempt"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(flaky.iter().all(|h| h.signed && h.body["id"] == flaky[0].body["id"]), "{flaky:?}");
    let db = c.db().await;
    let row: (String, u32, u32) = sqlx::query_as(
        "SELECT CAST(status AS CHAR), retry_count, count FROM push_notifications WHERE conv_id = 'flaky'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(row, ("SENT".into(), 2, 1), "delivered after two failed attempts");

    // Always 500: the first try and max_attempts (2) retries, then DEAD, listed for operators.
    let dead = eventually(Duration::from_secs(20), "the notification is DEAD", || async {
        let (code, page) = c.admin(0).get("/admin/push?status=DEAD", Some(ADMIN_TOKEN)).await;
        assert_eq!(code, 200, "{page}");
        page["items"].as_array().and_then(|items| items.first().cloned())
    })
    .await;
    assert_eq!((dead["conv"].as_str(), dead["user"].as_str()), (Some("down"), Some("carol")), "{dead}");
    assert_eq!(dead["retry_count"], 3, "{dead}");
    assert!(dead["last_error"].as_str().unwrap().contains("500"), "{dead}");
    settle().await;
    assert_eq!(hook.of("down").len(), 3, "no attempt after DEAD: {:?}", hook.of("down"));
    assert_eq!(hook.of("flaky").len(), 3, "nothing after delivery");

    // An operator's retry: due again now, and the webhook (now answering 200) takes it.
    let id = dead["id"].as_u64().unwrap();
    let (code, _) = c.admin(0).post(&format!("/admin/push/{id}/retry"), Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 200);
    hook.script.lock().unwrap().insert("down".into(), Vec::new());
    eventually(Duration::from_secs(10), "the retried notification is delivered", || async {
        hook.of("down").iter().any(|h| h.answered == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_comes_online_stops_the_retries() {
    let (hook, addr) = Receiver::start(&[("ab", &[500; 10])]).await;
    let c = cluster_with("push-online", addr, &[("HERALD_PUSH__BACKOFF_MS", "5000")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("apns", "bob-token").await.unwrap();
    alice.send("m1", "ab", &json!({"text": "are you there"})).await.unwrap();
    eventually(Duration::from_secs(15), "the first attempt", || async { hook.hits().first().cloned() }).await;

    // Bob comes online before the retry is due and acks: the retry is dropped.
    let b1 = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("bob", "b1"), "bob", "b1").await;
    eventually(Duration::from_secs(10), "b1 gets m1", || async { (b1.ids().len() == 1).then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(5_000 + 1_500)).await;
    assert_eq!(hook.hits().len(), 1, "no retry once the device acked: {:?}", hook.hits());
    let db = c.db().await;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM push_notifications").fetch_one(&db).await.unwrap();
    assert_eq!(left, 0, "the notification is gone, not DEAD");
    b1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_while_a_notification_waits_for_its_retry_joins_it() {
    let (hook, addr) = Receiver::start(&[("ab", &[500])]).await;
    let c = cluster_with("push-join", addr, &[("HERALD_PUSH__BACKOFF_MS", "5000")]).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("fcm", "bob-token").await.unwrap();
    alice.send("m1", "ab", &json!({"text": "first"})).await.unwrap();
    eventually(Duration::from_secs(15), "the first attempt", || async { hook.hits().first().cloned() }).await;

    // The retry is 5 s away; the second message waits its 2 s and joins the row.
    let second = alice.send("m2", "ab", &json!({"text": "second"})).await.unwrap();
    let retry = eventually(Duration::from_secs(15), "the retry", || async { hook.hits().get(1).cloned() }).await;
    assert_eq!(retry.answered, 200);
    assert_eq!((retry.body["count"].clone(), retry.body["attempt"].clone()), (json!(2), json!(2)), "{}", retry.body);
    assert_eq!(retry.body["msg_id"], json!(second.id.to_string()), "names the latest message");
    assert_eq!(retry.body["preview"]["text"], "second");
    assert_eq!(retry.body["id"], hook.hits()[0].body["id"], "the same notification");
    settle().await;
    assert_eq!(hook.hits().len(), 2, "one notification for both: {:?}", hook.hits());

    // Delivered: the next message is a new notification, with an id of its own.
    alice.send("m3", "ab", &json!({"text": "third"})).await.unwrap();
    let next =
        eventually(Duration::from_secs(15), "the next notification", || async { hook.hits().get(2).cloned() }).await;
    assert_eq!((next.body["count"].clone(), next.body["attempt"].clone()), (json!(1), json!(1)), "{}", next.body);
    assert_ne!(next.body["id"], retry.body["id"], "a receiver deduplicating by id must not drop it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_joining_a_notification_in_flight_is_told_under_an_id_of_its_own() {
    let (hook, addr) = Receiver::start(&[]).await;
    // The first request is answered 200 after 3.5 s (within push.timeout_ms): the
    // second message waits its 2 s and joins the row while the first is in flight.
    hook.hold.lock().unwrap().insert("ab".into(), Duration::from_millis(3_500));
    let c = cluster("push-follow-up", addr).await;
    let alice = c.client(0, "alice", "a1");
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("fcm", "bob-token").await.unwrap();
    alice.send("m1", "ab", &json!({"text": "first"})).await.unwrap();
    eventually(Duration::from_secs(15), "the first notification", || async { hook.hits().first().cloned() }).await;
    let second = alice.send("m2", "ab", &json!({"text": "second"})).await.unwrap();
    hook.hold.lock().unwrap().clear();

    let follow_up =
        eventually(Duration::from_secs(15), "the follow-up", || async { hook.hits().get(1).cloned() }).await;
    let first = hook.hits()[0].clone();
    assert_eq!(first.answered, 200, "the first notification was taken");
    assert_eq!(follow_up.body["msg_id"], json!(second.id.to_string()), "{}", follow_up.body);
    assert_eq!((follow_up.body["count"].clone(), follow_up.body["attempt"].clone()), (json!(1), json!(1)));
    assert_ne!(
        follow_up.body["id"], first.body["id"],
        "the follow-up is another notification: a receiver deduplicating by id must not drop it"
    );
    settle().await;
    assert_eq!(hook.hits().len(), 2, "one follow-up: {:?}", hook.hits());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_registration_refuses_bad_input_with_the_protocols_codes() {
    let (_hook, addr) = Receiver::start(&[]).await;
    let c = cluster("push-register", addr).await;
    let url = format!("{}/v1/devices/me/push", c.gateways[0].base_url());
    let http = reqwest::Client::new();
    let put = |body: &'static str, token: Option<String>| {
        let mut req = http.put(&url).header("content-type", "application/json").body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let token = || Some(c.token("bob", "b1"));
    let long = Box::leak(format!(r#"{{"platform":"fcm","token":"{}"}}"#, "x".repeat(4097)).into_boxed_str());
    for (body, what) in [
        (r#"{"platform":"sms","token":"t"}"#, "an unknown platform"),
        (r#"{"platform":"apns","token":""}"#, "an empty token"),
        (r#"{"platform":"apns","token":"a\nb"}"#, "a control character"),
        (r#"{"platform":"apns"}"#, "no token"),
        (r#"{"platform":"apns","token":"t","extra":1}"#, "an unknown field"),
        (r#"{"platform":"apns","token":7}"#, "a token that is not a string"),
        (r#"{"platform":"apns","#, "malformed JSON"),
        (&*long, "a token over 4096 bytes"),
    ] {
        let (status, body) = put(body, token()).await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{what}: {body}");
    }
    let (status, body) = put(r#"{"platform":"apns","token":"t"}"#, None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")));

    let (status, body) =
        put(r#"{"platform":"webpush","token":"{\"endpoint\":\"https://p.example/x\"}"}"#, token()).await;
    assert_eq!(status, 200, "{body}");
    let db = c.db().await;
    let stored: (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT CAST(push_platform AS CHAR), CAST(push_token AS CHAR) FROM devices \
             WHERE user_id = 'bob' AND device_id = 'b1'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(stored, (Some("webpush".into()), Some(r#"{"endpoint":"https://p.example/x"}"#.into())));
    c.client(0, "bob", "b1").unregister_push().await.unwrap();
    c.client(0, "bob", "b1").unregister_push().await.expect("unregistering twice is fine");
    let stored: (Option<String>,) =
        sqlx::query_as("SELECT CAST(push_token AS CHAR) FROM devices WHERE user_id = 'bob' AND device_id = 'b1'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(stored.0, None);
}
