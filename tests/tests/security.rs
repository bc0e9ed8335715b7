//! The security matrix: every HTTP API and every client frame, tried by callers who
//! must not get through (another tenant, a non-member, a removed member, an expired
//! token, a bad signature) and by a member of another tenant aiming at a foreign id.
//! Each answer must carry the protocol's code, and nothing the caller sees may contain
//! the other conversation's text or member names.
//!
//! Driven by one table: a new API is one more row in `apis()`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use herald_client::{WsClient, WsEvent};
use herald_shared::auth::{sign, Claims, Platform};
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{
    ClientFrame, ErrorFrame, FrameKind, History, PingFrame, Pong, ReadFrame, Sent, ServerFrame, SyncFrame,
};
use herald_tests::{ack_frame, pending_ids, send_frame, Cluster, SECRET};
use serde_json::{json, Value};

const ACME: &str = "acme";
const GLOBEX: &str = "globex";
/// acme's group: owner, member, and a member removed before the last message.
const ROOM: &str = "acme-room-1";
const OWNER: &str = "amber_owner";
const MEMBER: &str = "basil_member";
const REMOVED: &str = "cyrus_removed";
const OUTSIDER: &str = "dmitri_outsider";
const EARLY_TEXT: &str = "EARLY-words-before-the-removal";
const LATE_TEXT: &str = "LATE-secret-after-the-removal";
/// globex's conversation.
const FOREIGN_ROOM: &str = "globex-room-9";
const FOREIGN_USER: &str = "gina_globex";
const FOREIGN_MEMBER: &str = "hal_globex";
const FOREIGN_TEXT: &str = "GLOBEX-confidential-text";

/// Who is calling, and at which conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// A globex user aiming at acme's conversation id.
    OtherTenant,
    /// An acme user who never belonged to the conversation.
    NonMember,
    /// An acme user removed from the conversation.
    Removed,
    /// The owner, with an expired token.
    Expired,
    /// The owner, with a token signed by another secret.
    BadSignature,
    /// The acme owner aiming at globex's conversation id.
    ForeignId,
}

const WHO: [Who; 6] = [Who::OtherTenant, Who::NonMember, Who::Removed, Who::Expired, Who::BadSignature, Who::ForeignId];

impl Who {
    fn tenant_user(self) -> (&'static str, &'static str) {
        match self {
            Who::OtherTenant => (GLOBEX, FOREIGN_USER),
            Who::NonMember => (ACME, OUTSIDER),
            Who::Removed => (ACME, REMOVED),
            Who::Expired | Who::BadSignature | Who::ForeignId => (ACME, OWNER),
        }
    }

    fn token(self) -> String {
        let (tid, sub) = self.tenant_user();
        let exp = match self {
            Who::Expired => now_ms() / 1000 - 10,
            _ => now_ms() / 1000 + 3600,
        };
        let claims =
            Claims { tid: tid.into(), sub: sub.into(), dev: "sec-dev".into(), plat: Platform::Web, exp, iat: None };
        let secret = if self == Who::BadSignature { "another-secret-0123456789" } else { SECRET };
        sign(&claims, secret.as_bytes())
    }

    fn target(self) -> &'static str {
        if self == Who::ForeignId {
            FOREIGN_ROOM
        } else {
            ROOM
        }
    }

    /// Strings that must never reach this caller.
    fn must_not_see(self) -> Vec<&'static str> {
        match self {
            // A removed member saw the early part; nothing after its removal.
            Who::Removed => vec![LATE_TEXT, FOREIGN_TEXT, FOREIGN_MEMBER],
            // The owner, in its own tenant, aiming at globex's conversation.
            Who::ForeignId => vec![FOREIGN_TEXT, FOREIGN_MEMBER, FOREIGN_USER],
            // A globex user sees its own tenant's data, none of acme's.
            Who::OtherTenant => vec![EARLY_TEXT, LATE_TEXT, OWNER, MEMBER, REMOVED],
            _ => vec![EARLY_TEXT, LATE_TEXT, OWNER, MEMBER, REMOVED, FOREIGN_TEXT, FOREIGN_MEMBER, FOREIGN_USER],
        }
    }
}

/// What one row expects of one caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Refused with this protocol code.
    Refused(&'static str),
    /// Served (the caller's own view); the leak check still applies.
    Served,
}

use Expect::{Refused, Served};

/// What a caller got: the error code (`None` when served) and every byte it saw.
#[derive(Debug)]
struct Outcome {
    code: Option<String>,
    seen: String,
}

type Call = for<'a> fn(&'a Ctx, Who) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

struct Api {
    name: &'static str,
    call: Call,
    /// In the order of [`WHO`].
    expect: [Expect; 6],
}

const NF: Expect = Refused("not_found");
const FB: Expect = Refused("forbidden");
const UA: Expect = Refused("unauthorized");

fn apis() -> Vec<Api> {
    //                                    other tenant, non-member, removed, expired, bad sig, foreign id
    vec![
        Api {
            name: "POST /v1/conversations/{id}/members",
            call: |c, w| {
                Box::pin(c.http(
                    "POST",
                    format!("/v1/conversations/{}/members", w.target()),
                    Some(json!({"add": ["zz_intruder"]})),
                    w,
                ))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "POST /v1/conversations/{id}/title",
            call: |c, w| {
                let path = format!("/v1/conversations/{}/title", w.target());
                Box::pin(c.http("POST", path, Some(json!({"title": "zz_intruder"})), w))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "POST /v1/conversations/{id}/roles",
            call: |c, w| {
                let path = format!("/v1/conversations/{}/roles", w.target());
                Box::pin(c.http("POST", path, Some(json!({"user": w.tenant_user().1, "role": "owner"})), w))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "POST /v1/messages/{id}/recall",
            call: |c, w| {
                let path = format!("/v1/messages/{}/recall", c.message(w));
                Box::pin(c.http("POST", path, Some(json!({"cmid": format!("sec-r-{w:?}")})), w))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "POST /v1/messages/{id}/edit",
            call: |c, w| {
                let path = format!("/v1/messages/{}/edit", c.message(w));
                Box::pin(c.http("POST", path, Some(json!({"cmid": format!("sec-e-{w:?}"), "body": {"x": 1}})), w))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "GET /v1/conversations/{id}/messages",
            call: |c, w| {
                Box::pin(c.http(
                    "GET",
                    format!("/v1/conversations/{}/messages?after_seq=0&limit=100", w.target()),
                    None,
                    w,
                ))
            },
            // A removed member reads up to its removal (docs/protocol.md section 2).
            expect: [NF, FB, Served, UA, UA, NF],
        },
        Api {
            name: "POST /v1/messages",
            call: |c, w| {
                Box::pin(c.http(
                    "POST",
                    "/v1/messages".into(),
                    Some(json!({"cmid": format!("sec-{w:?}"), "conv": w.target(), "body": {"x": 1}})),
                    w,
                ))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "POST /v1/conversations/{id}/read",
            call: |c, w| {
                Box::pin(c.http("POST", format!("/v1/conversations/{}/read", w.target()), Some(json!({"seq": 1})), w))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "GET /v1/conversations",
            call: |c, w| Box::pin(c.http("GET", "/v1/conversations?limit=200".into(), None, w)),
            expect: [Served, Served, Served, UA, UA, Served],
        },
        Api {
            name: "GET /v1/sync",
            call: |c, w| Box::pin(c.http("GET", "/v1/sync?limit=1000".into(), None, w)),
            expect: [Served, Served, Served, UA, UA, Served],
        },
        Api {
            name: "POST /v1/devices",
            call: |c, w| Box::pin(c.http("POST", "/v1/devices".into(), Some(json!({})), w)),
            expect: [Served, Served, Served, UA, UA, Served],
        },
        Api {
            name: "ws send",
            call: |c, w| {
                Box::pin(c.ws(
                    w,
                    send_frame(&format!("ws-{w:?}"), w.target(), &json!({"x": 1})),
                    &[Sent::T, ErrorFrame::T],
                ))
            },
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            name: "ws sync",
            call: |c, w| {
                let sync =
                    SyncFrame { conv: w.target().into(), after_seq: 0, limit: Some(100), reference: Some("s1".into()) };
                Box::pin(c.ws(w, ClientFrame::Sync(sync), &[History::T, ErrorFrame::T]))
            },
            expect: [NF, FB, Served, UA, UA, NF],
        },
        Api {
            name: "ws read",
            call: |c, w| Box::pin(c.ws(w, ClientFrame::Read(ReadFrame { conv: w.target().into(), seq: 1 }), &[])),
            expect: [NF, FB, FB, UA, UA, NF],
        },
        Api {
            // Acks of another device's messages are accepted (acks are idempotent) and
            // touch only the caller's own pending set: checked after the matrix.
            name: "ws ack (another device's message ids)",
            call: |c, w| Box::pin(c.ws(w, ack_frame(c.ids.clone()), &[])),
            expect: [Served, Served, Served, UA, UA, Served],
        },
        Api {
            name: "ws ping",
            call: |c, w| Box::pin(c.ws(w, ClientFrame::Ping(PingFrame { ts: Some(1) }), &[Pong::T, ErrorFrame::T])),
            expect: [Served, Served, Served, UA, UA, Served],
        },
        Api {
            // Last: a create in the caller's own tenant succeeds and would change the rows
            // above. An existing id of the tenant is a conflict, never its contents.
            name: "POST /v1/conversations (an existing id)",
            call: |c, w| {
                let me = w.tenant_user().1;
                Box::pin(c.http(
                    "POST",
                    "/v1/conversations".into(),
                    Some(json!({"id": w.target(), "kind": "group", "members": [me, "zz_new"]})),
                    w,
                ))
            },
            expect: [Served, Refused("conflict"), Refused("conflict"), UA, UA, Served],
        },
    ]
}

struct Ctx {
    base: String,
    http: reqwest::Client,
    /// Ids of acme's messages (pending for the member's device).
    ids: Vec<MsgId>,
    /// The id of globex's message.
    foreign: MsgId,
}

impl Ctx {
    /// The message a caller aims at: acme's latest, or globex's for [`Who::ForeignId`].
    fn message(&self, who: Who) -> MsgId {
        if who == Who::ForeignId {
            self.foreign
        } else {
            self.ids[1]
        }
    }

    async fn http(&self, method: &str, path: String, body: Option<Value>, who: Who) -> Outcome {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(url),
            _ => self.http.post(url).json(&body.unwrap_or(json!({}))),
        };
        let resp = req.bearer_auth(who.token()).send().await.expect("gateway reachable");
        let status = resp.status().as_u16();
        let seen = resp.text().await.unwrap_or_default();
        if (200..300).contains(&status) {
            return Outcome { code: None, seen };
        }
        let v: Value = serde_json::from_str(&seen).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("<no protocol error body>").to_owned();
        let want = herald_shared::ops::error_response(
            serde_json::from_value(json!(code)).unwrap_or(herald_shared::error::ErrorCode::Internal),
            "",
        )
        .status()
        .as_u16();
        Outcome { code: Some(if want == status { code } else { format!("{code} with status {status}") }), seen }
    }

    /// Connects, sends `frame` and waits for a frame of one of the kinds `answers` (none: a
    /// success has no frame; an `error` within a second and a half is the answer).
    async fn ws(&self, who: Who, frame: ClientFrame, answers: &[&str]) -> Outcome {
        let mut ws = WsClient::connect(&self.base, &who.token()).await.expect("upgrade");
        let mut seen = String::new();
        match ws.next(Duration::from_secs(5)).await {
            Some(WsEvent::Closed(Some(4001))) => return Outcome { code: Some("unauthorized".into()), seen },
            Some(WsEvent::Frame(f @ ServerFrame::Hello(_))) => seen.push_str(&f.to_json()),
            other => return Outcome { code: Some(format!("no hello: {other:?}")), seen },
        }
        ws.send(&frame).await.expect("frame sent");
        let wait = if answers.is_empty() { Duration::from_millis(1_500) } else { Duration::from_secs(10) };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match ws.next(left).await {
                None if answers.is_empty() => break,
                None => return Outcome { code: Some(format!("no answer within {wait:?}")), seen },
                Some(WsEvent::Closed(code)) => return Outcome { code: Some(format!("closed {code:?}")), seen },
                Some(WsEvent::Other(text)) => seen.push_str(&text),
                Some(WsEvent::Frame(f)) => {
                    seen.push_str(&f.to_json());
                    if let ServerFrame::Error(e) = f {
                        ws.close().await;
                        return Outcome { code: Some(e.code.as_str().to_owned()), seen };
                    }
                    if answers.contains(&f.kind()) {
                        break;
                    }
                }
            }
        }
        ws.close().await;
        Outcome { code: None, seen }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_refuses_callers_outside_the_conversation_without_leaking_it() {
    let mut c = Cluster::new("security");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let client = |tenant: &str, user: &str, dev: &str| c.client_in(0, tenant, user, dev);

    let owner = client(ACME, OWNER, "a1");
    let member = client(ACME, MEMBER, "b1");
    let removed = client(ACME, REMOVED, "sec-dev");
    // Registered before the sends, so the messages are pending for these devices.
    member.register_device().await.unwrap();
    removed.register_device().await.unwrap();
    client(ACME, OUTSIDER, "sec-dev").register_device().await.unwrap();
    owner.create_conversation(Some(ROOM), "group", &[OWNER, MEMBER, REMOVED]).await.unwrap();
    let early = owner.send("early", ROOM, &json!({"text": EARLY_TEXT})).await.unwrap();
    owner.change_members(ROOM, &[], &[REMOVED]).await.unwrap();
    let late = owner.send("late", ROOM, &json!({"text": LATE_TEXT})).await.unwrap();
    let gina = client(GLOBEX, FOREIGN_USER, "g1");
    gina.create_conversation(Some(FOREIGN_ROOM), "direct", &[FOREIGN_USER, FOREIGN_MEMBER]).await.unwrap();
    let foreign = gina.send("g", FOREIGN_ROOM, &json!({"text": FOREIGN_TEXT})).await.unwrap().id;

    // The member's pending set holds both messages before anyone else acks them.
    let (redis, keys) = (c.redis().await, c.keys());
    let want: std::collections::BTreeSet<u64> = [early.id.0, late.id.0].into();
    herald_tests::eventually(Duration::from_secs(10), "both messages pending for the member", || {
        let (redis, keys, want) = (redis.clone(), keys.clone(), want.clone());
        async move { pending_ids(&redis, &keys, MEMBER, "b1").await.is_superset(&want).then_some(()) }
    })
    .await;

    let ctx =
        Ctx { base: c.gateways[0].base_url(), http: reqwest::Client::new(), ids: vec![early.id, late.id], foreign };
    let mut failures = Vec::new();
    for api in apis() {
        for (who, expect) in WHO.iter().zip(api.expect) {
            let out = (api.call)(&ctx, *who).await;
            let got = match out.code.as_deref() {
                None => "served".to_string(),
                Some(code) => code.to_string(),
            };
            let wanted = match expect {
                Served => "served".to_string(),
                Refused(code) => code.to_string(),
            };
            if got != wanted {
                failures.push(format!("{} as {who:?}: expected {wanted}, got {got}: {}", api.name, out.seen));
            }
            for secret in who.must_not_see() {
                if out.seen.contains(secret) {
                    failures.push(format!("{} as {who:?}: the answer reveals {secret:?}: {}", api.name, out.seen));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of the matrix failed:\n{}", failures.len(), failures.join("\n"));

    // Nothing the outsiders did touched the member's pending set or the conversation.
    assert!(pending_ids(&redis, &keys, MEMBER, "b1").await.is_superset(&want), "foreign acks removed pending ids");
    let history = client(ACME, MEMBER, "b1").list_conversations(50, None).await.unwrap();
    let room =
        history["items"].as_array().unwrap().iter().find(|i| i["id"] == ROOM).expect("the member sees it").clone();
    // early (1), the removal (2), late (3).
    assert_eq!(room["last_seq"], 3, "no outsider's send or change landed: {room}");
    let members =
        client(ACME, OWNER, "a1").change_members(ROOM, &[], &[]).await.expect("the owner may still change members");
    assert_eq!(members["members"], json!([OWNER, MEMBER]), "no outsider changed the members");
}
