//! OpenTelemetry traces of sends (`otel.*`, issue 30): a sampled send is one trace from
//! the gateway's `herald.send` through the worker's `herald.commit` and `herald.fanout`
//! to `herald.push`, exported over OTLP/HTTP to a collector, here a local receiver that
//! records what is POSTed to `/v1/traces`. An HTTP send continues its `traceparent`; a
//! WebSocket send starts a trace of its own, also inside a gateway's pack. No body,
//! token or push token is ever in a span. A stopping process flushes its spans. With no
//! endpoint nothing is posted.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use herald_tests::faults::{signal, terminate_gateway};
use herald_tests::{entries_added, eventually, AutoDevice, Cluster, TENANT};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

const PUSH_SECRET: &str = "push-secret-0123456789";
/// The collector's API key, as `otel.headers` sends it.
const COLLECTOR_KEY: &str = "collector-key-0123";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// What one POST carried.
#[derive(Clone)]
struct Post {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// A local collector (every POST, whatever its path) and push webhook, on one address.
#[derive(Clone, Default)]
struct Receiver {
    posts: Arc<Mutex<Vec<Post>>>,
    pushes: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Receiver {
    async fn start() -> (Receiver, SocketAddr) {
        let r = Receiver::default();
        let app = axum::Router::new().route("/hook", axum::routing::post(push)).fallback(collect).with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (r, addr)
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    /// Every span received, with its process's `service.name`.
    fn spans(&self) -> Vec<(String, Span)> {
        let mut out = Vec::new();
        for post in self.posts() {
            let request = ExportTraceServiceRequest::decode(post.body).expect("an OTLP protobuf export");
            for resource in request.resource_spans {
                let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
                let service = text(&attributes, "service.name").unwrap_or_default();
                for scope in resource.scope_spans {
                    out.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
                }
            }
        }
        out
    }
}

async fn collect(State(r): State<Receiver>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    r.posts.lock().unwrap().push(Post { path: uri.path().to_owned(), headers, body });
    StatusCode::OK
}

async fn push(State(r): State<Receiver>, body: Bytes) -> StatusCode {
    r.pushes.lock().unwrap().push(serde_json::from_slice(&body).unwrap_or_default());
    StatusCode::OK
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(attributes: &[KeyValue], key: &str) -> Option<AnyValue> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.clone()).and_then(|v| v.value)
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value(attributes, key)? {
        AnyValue::StringValue(s) => Some(s),
        _ => None,
    }
}

fn number(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match value(attributes, key)? {
        AnyValue::IntValue(n) => Some(n),
        _ => None,
    }
}

/// A cluster tracing to `collector`, pushing the tenant's notifications to it, on one
/// ingress shard (so a session's burst packs); a worker and two gateways.
async fn cluster(name: &str, collector: SocketAddr, otel: &[(&str, &str)]) -> Cluster {
    let mut c = Cluster::new(name);
    c.set("HERALD_INGRESS__SHARDS", "1")
        .set("HERALD_GATEWAY__SEND_RATE", "10000")
        .set("HERALD_GATEWAY__SEND_BURST", "10000")
        .set("HERALD_PUSH__TENANT_WEBHOOKS", &format!("{TENANT}=http://{collector}/hook"))
        .set("HERALD_PUSH__WEBHOOK_SECRET", PUSH_SECRET)
        .set("HERALD_PUSH__TENANT_PREVIEWS", &format!("{TENANT}=text"))
        .set("HERALD_PUSH__DELAY_MS", "500")
        .set("HERALD_PUSH__POLL_MS", "100");
    for (k, v) in otel {
        c.set(k, v);
    }
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    c
}

/// `POST /v1/messages` with a `traceparent` header; the answer's status.
async fn send_traced(c: &Cluster, gw: usize, cmid: &str, body: &serde_json::Value, traceparent: &str) -> u16 {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", c.gateways[gw].base_url()))
        .bearer_auth(c.token("alice", "a1"))
        .header("traceparent", traceparent)
        .json(&json!({"cmid": cmid, "conv": "ab", "body": body}))
        .send()
        .await
        .expect("the gateway answers");
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_send_is_one_trace_from_the_gateway_to_the_push() {
    let (receiver, addr) = Receiver::start().await;
    let endpoint = format!("http://{addr}");
    let headers = format!("x-collector-key={COLLECTOR_KEY}");
    let otel = [
        ("HERALD_OTEL__ENDPOINT", endpoint.as_str()),
        ("HERALD_OTEL__BATCH_DELAY_MS", "100"),
        ("HERALD_OTEL__HEADERS", headers.as_str()),
    ];
    let c = cluster("otel-trace", addr, &otel).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    // Bob has a push token and never connects: he is pushed.
    c.client(0, "bob", "b1").register_push("fcm", "bob-push-token-zz").await.unwrap();

    let secret_text = format!("body-text-{:08x}", rand::random::<u32>());
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    assert_eq!(send_traced(&c, 1, "m1", &json!({ "text": secret_text }), &caller).await, 200);
    eventually(Duration::from_secs(20), "bob's push notification", || async {
        (!receiver.pushes.lock().unwrap().is_empty()).then_some(())
    })
    .await;

    let names = ["herald.send", "herald.commit", "herald.fanout", "herald.push"];
    let spans: HashMap<String, (String, Span)> =
        eventually(Duration::from_secs(20), "the four spans of the trace", || async {
            let of_trace: HashMap<String, (String, Span)> = receiver
                .spans()
                .into_iter()
                .filter(|(_, s)| hex(&s.trace_id) == TRACE_ID)
                .map(|(service, s)| (s.name.clone(), (service, s)))
                .collect();
            names.iter().all(|n| of_trace.contains_key(*n)).then_some(of_trace)
        })
        .await;
    let span = |name: &str| &spans[name].1;
    let (send, commit, fanout, push) = (span(names[0]), span(names[1]), span(names[2]), span(names[3]));

    // One chain: the caller's span, the gateway's, the commit, the fan-out, the push.
    assert_eq!(hex(&send.parent_span_id), CALLER_SPAN, "the send continues the caller's trace");
    assert_eq!(commit.parent_span_id, send.span_id, "the commit is the send's child");
    assert_eq!(fanout.parent_span_id, commit.span_id, "the fan-out is the commit's child");
    assert_eq!(push.parent_span_id, fanout.span_id, "the push is the fan-out's child");
    assert_eq!(spans["herald.send"].0, "herald-gateway");
    for name in &names[1..] {
        assert_eq!(spans[*name].0, "herald-worker", "{name}");
    }

    assert_eq!(text(&send.attributes, "herald.tenant").as_deref(), Some(TENANT));
    assert_eq!(text(&send.attributes, "herald.conv").as_deref(), Some("ab"));
    assert_eq!(text(&send.attributes, "herald.cmid").as_deref(), Some("m1"));
    assert_eq!(text(&send.attributes, "herald.transport").as_deref(), Some("http"));
    assert_eq!(text(&send.attributes, "herald.result").as_deref(), Some("ok"));
    let msg_id = text(&send.attributes, "herald.msg_id").expect("the send's message id");
    assert_eq!(text(&commit.attributes, "herald.msg_id"), Some(msg_id.clone()));
    assert_eq!(number(&commit.attributes, "herald.seq"), Some(1));
    assert!(number(&commit.attributes, "herald.batch_size").is_some_and(|n| n >= 1));
    assert_eq!(number(&fanout.attributes, "herald.devices"), Some(1), "bob's one device");
    assert_eq!(text(&push.attributes, "herald.msg_id"), Some(msg_id));
    assert_eq!(number(&push.attributes, "herald.push_messages"), Some(1));
    assert_eq!(text(&push.attributes, "herald.result").as_deref(), Some("sent"));

    // What a span never holds; the collector's key went in a header, where it belongs.
    let token = c.token("alice", "a1");
    for post in receiver.posts() {
        assert_eq!(post.path, "/v1/traces");
        assert_eq!(post.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/x-protobuf"));
        assert_eq!(post.headers.get("x-collector-key").and_then(|v| v.to_str().ok()), Some(COLLECTOR_KEY));
        let body = String::from_utf8_lossy(&post.body);
        for secret in [secret_text.as_str(), token.as_str(), "bob-push-token-zz", PUSH_SECRET, COLLECTOR_KEY] {
            assert!(!body.contains(secret), "a span holds {secret:?}");
        }
    }
}

/// A WebSocket burst packs into shared stream entries, each send with its context in
/// its row: every send is the root of a trace of its own, and its commit its child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_sends_packed_together_each_start_a_trace_their_commits_continue() {
    let (receiver, addr) = Receiver::start().await;
    let endpoint = format!("http://{addr}");
    let otel = [("HERALD_OTEL__ENDPOINT", endpoint.as_str()), ("HERALD_OTEL__BATCH_DELAY_MS", "100")];
    let c = cluster("otel-packs", addr, &otel).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let gw = c.gateways[0].admin_url();
    eventually(Duration::from_secs(20), "the gateway packs", || async {
        (herald_tests::drill::metric(&gw, "herald_ingress_packing").await == 1.0).then_some(())
    })
    .await;
    let dev = AutoDevice::connect(&c.gateways[0].base_url(), &c.token("alice", "a1"), "alice", "a1").await;
    dev.send("first", "ab", json!("first")).await;
    eventually(Duration::from_secs(20), "the first send answered", || async {
        dev.sent.lock().unwrap().contains_key("first").then_some(())
    })
    .await;
    let redis = c.redis().await;
    let stream = c.keys().ingress(0);
    let before = entries_added(&redis, &stream).await;
    let n = 40;
    for k in 0..n {
        dev.send(&format!("w{k}"), "ab", json!({ "k": k })).await;
    }
    eventually(Duration::from_secs(30), "every send answered", || async {
        let sent = dev.sent.lock().unwrap();
        (0..n).all(|k| sent.contains_key(&format!("w{k}"))).then_some(())
    })
    .await;
    let added = entries_added(&redis, &stream).await - before;
    assert!(added < n as u64, "{n} sends took {added} entries: the burst did not pack");

    let cmids: HashSet<String> = (0..n).map(|k| format!("w{k}")).collect();
    eventually(Duration::from_secs(20), "a send and a commit span per send", || async {
        let spans = receiver.spans();
        let sends: HashMap<Vec<u8>, &Span> = spans
            .iter()
            .filter(|(_, s)| {
                s.name == "herald.send" && text(&s.attributes, "herald.cmid").is_some_and(|m| cmids.contains(&m))
            })
            .map(|(_, s)| (s.span_id.clone(), s))
            .collect();
        let commits: Vec<&Span> = spans.iter().map(|(_, s)| s).filter(|s| s.name == "herald.commit").collect();
        if sends.len() < n || commits.iter().filter(|s| sends.contains_key(&s.parent_span_id)).count() < n {
            return None;
        }
        for send in sends.values() {
            assert!(send.parent_span_id.is_empty(), "a WebSocket send is a trace's root");
            assert_eq!(text(&send.attributes, "herald.transport").as_deref(), Some("ws"));
            let commit = commits.iter().find(|s| s.parent_span_id == send.span_id).expect("its commit");
            assert_eq!(commit.trace_id, send.trace_id);
            assert_eq!(text(&commit.attributes, "herald.cmid"), text(&send.attributes, "herald.cmid"));
        }
        let traces: HashSet<&Vec<u8>> = sends.values().map(|s| &s.trace_id).collect();
        assert_eq!(traces.len(), n, "a trace per send");
        Some(())
    })
    .await;
}

/// Spans still queued when a process stops are flushed on its way out: with a batch
/// delay far beyond the test, only the flush at shutdown can deliver them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_are_flushed_when_a_process_stops() {
    let (receiver, addr) = Receiver::start().await;
    let endpoint = format!("http://{addr}");
    let mut c = Cluster::new("otel-flush");
    c.set("HERALD_OTEL__ENDPOINT", &endpoint)
        .set("HERALD_OTEL__BATCH_DELAY_MS", "60000")
        .set("HERALD_GATEWAY__DRAIN_MS", "1000");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    assert_eq!(send_traced(&c, 0, "m1", &json!("hello"), &caller).await, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.posts().is_empty(), "nothing is exported before the batch delay");

    signal(c.workers[0].pid(), "-TERM");
    let worker = tokio::time::timeout(Duration::from_secs(30), c.workers[0].child.wait()).await;
    assert!(matches!(worker, Ok(Ok(_))), "the worker stops within 30 s of SIGTERM");
    terminate_gateway(&mut c, 0, Duration::from_secs(30)).await;
    let names: HashSet<String> =
        receiver.spans().into_iter().filter(|(_, s)| hex(&s.trace_id) == TRACE_ID).map(|(_, s)| s.name).collect();
    for name in ["herald.send", "herald.commit", "herald.fanout"] {
        assert!(names.contains(name), "{name} flushed at shutdown: {names:?}");
    }
}

/// Off by default: with no endpoint nothing is posted, even with the OpenTelemetry
/// SDK's own endpoint variable pointing at the collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_endpoint_nothing_is_posted() {
    let (receiver, addr) = Receiver::start().await;
    let sdk_endpoint = format!("http://{addr}");
    let mut c = Cluster::new("otel-off");
    c.set("HERALD_PUSH__TENANT_WEBHOOKS", &format!("{TENANT}=http://{addr}/hook"))
        .set("HERALD_PUSH__WEBHOOK_SECRET", PUSH_SECRET)
        .set("HERALD_PUSH__DELAY_MS", "500")
        .set("HERALD_PUSH__POLL_MS", "100")
        .set("OTEL_EXPORTER_OTLP_ENDPOINT", &sdk_endpoint)
        .set("OTEL_BSP_SCHEDULE_DELAY", "100");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.client(0, "alice", "a1").create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.unwrap();
    c.client(0, "bob", "b1").register_push("fcm", "bob-token").await.unwrap();
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    assert_eq!(send_traced(&c, 0, "m1", &json!("hello"), &caller).await, 200);
    eventually(Duration::from_secs(20), "bob's push notification", || async {
        (!receiver.pushes.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.posts().len(), 0, "tracing is off: nothing is exported");
}
