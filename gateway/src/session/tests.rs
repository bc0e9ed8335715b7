//! A session driven over channels instead of a WebSocket, against the real Redis the
//! tests use (`IT_REDIS_URL`, default the local one): its frames, backlog, acks,
//! realtime pushes and close codes, without a gateway process.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use fred::interfaces::{HashesInterface, KeysInterface, SortedSetsInterface};
use fred::prelude::*;
use futures::{Sink, Stream};
use herald_shared::auth::{Claims, Platform};
use herald_shared::config::{Config, Role};
use herald_shared::ids::MsgId;
use herald_shared::keys::{epoch_marker, DeviceKey, Keys};
use herald_shared::protocol::{ClientFrame, Message as Msg, ServerFrame};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Admission, Session, SessionEnv};
use crate::epoch::EpochWatch;
use crate::history::History;
use crate::ingress::Ingress;
use crate::recovery::Recovery;
use crate::sessions::{Push, SessionRegistry};

/// The client's end of a session: what the server wrote, and a way to write to it.
struct Peer {
    to_server: mpsc::UnboundedSender<Message>,
    from_server: mpsc::UnboundedReceiver<Message>,
    /// The server's socket writes so far.
    writes: Arc<AtomicUsize>,
}

/// The server's end: a `Stream` of what the client wrote and a `Sink` for its frames,
/// which, like a WebSocket's, buffers what it is given until a flush writes it out.
struct ChannelSocket {
    rx: mpsc::UnboundedReceiver<Message>,
    tx: mpsc::UnboundedSender<Message>,
    buffered: Vec<Message>,
    /// Flushes that wrote something: the socket writes a real one would make.
    writes: Arc<AtomicUsize>,
}

impl Stream for ChannelSocket {
    type Item = Result<Message, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|m| m.map(Ok))
    }
}

impl Sink<Message> for ChannelSocket {
    type Error = mpsc::error::SendError<Message>;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        self.buffered.push(item);
        Ok(())
    }
    fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.buffered.is_empty() {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        for m in std::mem::take(&mut self.buffered) {
            self.tx.send(m)?;
        }
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_flush(cx)
    }
}

fn socket_pair() -> (ChannelSocket, Peer) {
    let (to_server, rx) = mpsc::unbounded_channel();
    let (tx, from_server) = mpsc::unbounded_channel();
    let writes = Arc::new(AtomicUsize::new(0));
    let socket = ChannelSocket { rx, tx, buffered: Vec::new(), writes: writes.clone() };
    (socket, Peer { to_server, from_server, writes })
}

impl Peer {
    /// The next text frame (skipping pings), or the close code.
    async fn next(&mut self) -> Result<ServerFrame, Option<u16>> {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.from_server.recv())
                .await
                .expect("the session answers within 10 s");
            match m {
                Some(Message::Text(t)) => return Ok(ServerFrame::parse(t.as_str()).expect("a server frame")),
                Some(Message::Close(c)) => return Err(c.map(|c| c.code)),
                Some(_) => continue,
                None => return Err(None),
            }
        }
    }

    fn send(&self, f: ClientFrame) {
        self.to_server.send(Message::Text(f.to_json().into())).expect("session running");
    }
}

struct Fixture {
    env: Arc<SessionEnv>,
    redis: Client,
    keys: Keys,
    claims: Claims,
}

async fn fixture(device: &str) -> Fixture {
    let url = std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let pool = herald_shared::redis::pool(&url, &Default::default(), 1).await.expect("the test Redis");
    let redis = pool.next().clone();
    let keys = Keys::new(format!("ut{:08x}", rand::random::<u32>()));
    let mut cfg = Config::defaults(Role::Gateway);
    cfg.node_id = "gw-test".into();
    cfg.gateway.backlog_page_desktop = 3;
    let cfg = Arc::new(cfg);
    // Never connected: this session's pending set is trusted, so MySQL is not asked.
    let db = herald_shared::db::pool("mysql://nobody@127.0.0.1:1/none", 1, None).expect("lazy pool");
    let epoch = "e1".to_string();
    let claims = Claims {
        tid: "t".into(),
        sub: "u".into(),
        dev: device.into(),
        plat: Platform::Desktop,
        exp: u64::MAX,
        iat: None,
    };
    let _: i64 = redis.hset(keys.devices("t", "u"), (epoch_marker(device), epoch.as_str())).await.unwrap();
    let (marks, _flusher) = crate::watermarks::channel(db.clone());
    let (acks, ack_writer) = crate::acks::channel(pool.clone());
    tokio::spawn(ack_writer.run(CancellationToken::new()));
    let (delivered, _delivered_flusher) = crate::delivered::channel(pool.clone(), keys.clone(), 8);
    let waiters = Arc::new(crate::waiters::SendWaiters::default());
    let (queue, writer) =
        crate::ingress_writer::channel(pool.clone(), keys.clone(), waiters.clone(), cfg.node_id.clone(), 256);
    tokio::spawn(writer.run(CancellationToken::new()));
    let roster = crate::roster::Roster {
        db: db.clone(),
        redis: pool.clone(),
        keys: keys.clone(),
        max_users: 10,
        seen_ttl_s: 60,
        announcements: crate::announcer::channel(pool.clone(), &keys).0,
    };
    let typing = Arc::new(crate::typing::TypingRelay::new(db.clone(), pool.clone(), keys.clone(), 6_000, 100));
    let devices = crate::devices::DeviceRegistry::new(
        db.clone(),
        pool.clone(),
        keys.clone(),
        Duration::from_secs(60),
        Duration::from_secs(3_600),
    );
    let identity = Arc::new(crate::identity::Identity::new(
        herald_shared::identity::KeySet::default(),
        crate::identity::Revocations::new(pool.clone(), keys.clone(), 60),
    ));
    let env = Arc::new(SessionEnv {
        identity,
        devices,
        roster,
        typing,
        watchers: Arc::default(),
        redis: pool.clone(),
        keys: keys.clone(),
        history: History {
            db: db.clone(),
            redis: pool.clone(),
            keys: keys.clone(),
            page_bytes: 1 << 20,
            settle_ms: 5_000,
        },
        ingress: Ingress {
            queue,
            waiters,
            node_id: cfg.node_id.clone(),
            shards: 1,
            send_timeout: Duration::from_secs(1),
            max_body_bytes: 1024,
            tracer: Default::default(),
        },
        recovery: Recovery {
            db,
            redis: pool.clone(),
            keys: keys.clone(),
            watermark_margin_ms: 1,
            start_reads: Arc::new(tokio::sync::Semaphore::new(2)),
        },
        marks,
        acks,
        delivered,
        epoch: EpochWatch::new(epoch),
        directory: Arc::new(SessionRegistry::default()),
        limits: Arc::new(crate::limits::NodeLimits::new(&cfg.gateway)),
        drain: CancellationToken::new(),
        cfg,
    });
    Fixture { env, redis, keys, claims }
}

fn frame_of(id: u64, seq: u64) -> String {
    let body = RawValue::from_string("{}".into()).unwrap();
    let m = Msg {
        id: MsgId(id),
        conv: "c".into(),
        seq,
        from: "x".into(),
        cmid: format!("m{seq}"),
        ts: 0,
        body,
        status: None,
        event: None,
        edited_seq: None,
        recalled_seq: None,
    };
    herald_shared::protocol::msg_frame(&m)
}

/// Ids above 2^62 (hundreds share a score), their frames stored as the worker does.
async fn fill(f: &Fixture, device: &str, ids: &[u64]) {
    let frames: HashMap<String, String> =
        ids.iter().enumerate().map(|(i, id)| (f.keys.message(MsgId(*id)), frame_of(*id, i as u64 + 1))).collect();
    let _: () = f.redis.mset(frames).await.unwrap();
    let pairs: Vec<(f64, String)> = ids.iter().map(|i| (MsgId(*i).score(), MsgId(*i).member())).collect();
    let _: i64 = f.redis.zadd(f.keys.pending("t", "u", device), None, None, false, false, pairs).await.unwrap();
}

#[tokio::test]
async fn a_session_over_channels_pages_its_backlog_takes_acks_and_pushes_in_realtime() {
    let f = fixture("d1").await;
    let ids: Vec<u64> = (0..7).map(|k| (1u64 << 62) + k).collect();
    fill(&f, "d1", &ids).await;
    let (socket, mut peer) = socket_pair();
    let session =
        tokio::spawn(Session::run(f.env.clone(), f.claims.clone(), admission(1), socket, super::Features::default()));

    let Ok(ServerFrame::Hello(hello)) = peer.next().await else { panic!("hello first") };
    assert_eq!((hello.pending, hello.hb_ms), (7, 25_000));
    assert!(hello.session.starts_with("gw-test-"));
    // Pages of 3, each acked before the next; every id once, in order.
    let mut seen = Vec::new();
    while seen.len() < ids.len() {
        let mut page = Vec::new();
        while page.len() < 3.min(ids.len() - seen.len()) {
            match peer.next().await {
                Ok(ServerFrame::Msg(m)) => page.push(m.id),
                other => panic!("expected a backlog msg, got {other:?}"),
            }
        }
        seen.extend(page.iter().map(|id| id.0));
        peer.send(ClientFrame::Ack(herald_shared::protocol::AckFrame { ids: page }));
    }
    assert_eq!(seen, ids);
    let Ok(ServerFrame::CaughtUp(c)) = peer.next().await else { panic!("caught_up after the last page's acks") };
    assert_eq!(c.delivered, 7);
    let left: u64 = f.redis.zcard(f.keys.pending("t", "u", "d1")).await.unwrap();
    assert_eq!(left, 0, "acks removed every entry before caught_up");

    // A realtime push through the node's directory, then a ping.
    let arrived = tokio::time::Instant::now();
    let push = Push { id: MsgId(ids[6] + 1), frame: Utf8Bytes::from(frame_of(ids[6] + 1, 8)), arrived };
    f.env.directory.push(&DeviceKey::of(&f.claims), push);
    let Ok(ServerFrame::Msg(m)) = peer.next().await else { panic!("the realtime push") };
    assert_eq!(m.seq, 8);
    peer.send(ClientFrame::Ping(herald_shared::protocol::PingFrame { ts: Some(42) }));
    let Ok(ServerFrame::Pong(p)) = peer.next().await else { panic!("pong") };
    assert_eq!(p.ts, 42);
    assert_eq!(f.env.limits.realtime.take().0, 1, "the push's latency is a signal of the backlog budget");

    // A malformed frame is answered, not fatal.
    peer.to_server.send(Message::Text("{nope".into())).unwrap();
    let Ok(ServerFrame::Error(e)) = peer.next().await else { panic!("an error frame") };
    assert_eq!(e.code, herald_shared::error::ErrorCode::BadRequest);

    // A newer session of the same device replaces this one: 4002.
    let (socket2, mut peer2) = socket_pair();
    let newer =
        tokio::spawn(Session::run(f.env.clone(), f.claims.clone(), admission(2), socket2, super::Features::default()));
    assert_eq!(peer.next().await.unwrap_err(), Some(4002));
    session.await.unwrap();
    assert!(matches!(peer2.next().await, Ok(ServerFrame::Hello(_))));
    let caught_up = peer2.next().await;
    assert!(matches!(caught_up, Ok(ServerFrame::CaughtUp(ref c)) if c.delivered == 0), "{caught_up:?}");
    // The node drains: `reconnect`, then 4003.
    f.env.drain.cancel();
    assert!(matches!(peer2.next().await, Ok(ServerFrame::Reconnect(_))));
    assert_eq!(peer2.next().await.unwrap_err(), Some(4003));
    newer.await.unwrap();
    let _: i64 = f.redis.del(vec![f.keys.devices("t", "u"), f.keys.presence("t", "u")]).await.unwrap();
}

/// A backlog page, and realtime pushes that queued together, go out in one socket write
/// each, not one per frame. Before: every frame was a write (a `sendto`) of its own.
#[tokio::test]
async fn a_page_and_pushes_queued_together_go_out_in_one_write_each() {
    let f = fixture("d1").await;
    let ids: Vec<u64> = (0..3).map(|k| (1u64 << 62) + k).collect();
    fill(&f, "d1", &ids).await;
    let (socket, mut peer) = socket_pair();
    let session =
        tokio::spawn(Session::run(f.env.clone(), f.claims.clone(), admission(1), socket, super::Features::default()));
    assert!(matches!(peer.next().await, Ok(ServerFrame::Hello(_))));
    let before_page = peer.writes.load(Ordering::SeqCst);
    let mut page = Vec::new();
    while page.len() < 3 {
        let Ok(ServerFrame::Msg(m)) = peer.next().await else { panic!("the backlog page") };
        page.push(m.id);
    }
    assert_eq!(page.iter().map(|id| id.0).collect::<Vec<_>>(), ids);
    assert_eq!(peer.writes.load(Ordering::SeqCst) - before_page, 1, "a page of 3 is one write");
    peer.send(ClientFrame::Ack(herald_shared::protocol::AckFrame { ids: page }));
    assert!(matches!(peer.next().await, Ok(ServerFrame::CaughtUp(_))));

    // Queued while the session waits (this test's runtime has one thread, so it cannot
    // run between them): written together, in order.
    let before_pushes = peer.writes.load(Ordering::SeqCst);
    for k in 0..5u64 {
        let id = ids[2] + 1 + k;
        let push =
            Push { id: MsgId(id), frame: Utf8Bytes::from(frame_of(id, 4 + k)), arrived: tokio::time::Instant::now() };
        f.env.directory.push(&DeviceKey::of(&f.claims), push);
    }
    for seq in 4..9 {
        let Ok(ServerFrame::Msg(m)) = peer.next().await else { panic!("the realtime pushes") };
        assert_eq!(m.seq, seq);
    }
    assert_eq!(peer.writes.load(Ordering::SeqCst) - before_pushes, 1, "5 queued pushes are one write");
    assert_eq!(f.env.limits.realtime.take().0, 5, "each push's latency is still recorded");
    drop(peer);
    session.await.unwrap();
    let _: i64 = f.redis.del(vec![f.keys.devices("t", "u"), f.keys.presence("t", "u")]).await.unwrap();
}

/// A session's admission with no watermark read and session epoch `epoch`.
fn admission(epoch: u64) -> Admission {
    Admission { watermark: None, epoch }
}

/// A node that drains applies the read positions a device sends, and answers its other
/// requests `unavailable`, instead of dropping them: while it waits for the acks of what
/// is in flight, and after its close frame (what the device sent before it saw it).
/// Before: only acks were read while draining; a session with nothing in flight closed
/// at once and never read the rest.
#[tokio::test]
async fn a_draining_session_applies_reads_and_refuses_sends() {
    let f = fixture("d1").await;
    let id = (1u64 << 62) + 1;
    fill(&f, "d1", &[id]).await;
    let (socket, mut peer) = socket_pair();
    let session =
        tokio::spawn(Session::run(f.env.clone(), f.claims.clone(), admission(1), socket, super::Features::default()));
    assert!(matches!(peer.next().await, Ok(ServerFrame::Hello(_))));
    assert!(matches!(peer.next().await, Ok(ServerFrame::Msg(_))), "one message in flight");
    f.env.drain.cancel();
    assert!(matches!(peer.next().await, Ok(ServerFrame::Reconnect(_))));
    // While the message is in flight: a send is refused, a read is applied.
    peer.to_server.send(Message::Text(r#"{"t":"send","cmid":"late","conv":"c","body":{}}"#.into())).unwrap();
    match peer.next().await {
        Ok(ServerFrame::Error(e)) => {
            assert_eq!((e.code, e.reference.as_deref()), (herald_shared::error::ErrorCode::Unavailable, Some("late")));
        }
        other => panic!("the send is refused, not dropped: {other:?}"),
    }
    peer.send(ClientFrame::Read(herald_shared::protocol::ReadFrame { conv: "c".into(), seq: 3 }));
    peer.send(ClientFrame::Ack(herald_shared::protocol::AckFrame { ids: vec![MsgId(id)] }));
    assert_eq!(peer.next().await.unwrap_err(), Some(4003));
    // Sent as the close frame was on its way: read before the session ends.
    peer.send(ClientFrame::Read(herald_shared::protocol::ReadFrame { conv: "c".into(), seq: 4 }));
    drop(peer);
    session.await.unwrap();
    let stream = f.keys.ingress(0);
    let entries: Vec<(String, HashMap<String, String>)> = f.redis.xrange(&stream, "-", "+", None).await.unwrap();
    let left: u64 = f.redis.zcard(f.keys.pending("t", "u", "d1")).await.unwrap();
    let _: i64 = f.redis.del(vec![stream, f.keys.devices("t", "u"), f.keys.presence("t", "u")]).await.unwrap();
    let field = |e: &HashMap<String, String>, k: &str| e.get(k).cloned().unwrap_or_default();
    let reads: Vec<(String, String, String)> =
        entries.iter().map(|(_, e)| (field(e, "k"), field(e, "conv"), field(e, "seq"))).collect();
    let reads: Vec<(&str, &str, &str)> = reads.iter().map(|(k, c, s)| (k.as_str(), c.as_str(), s.as_str())).collect();
    assert_eq!(reads, vec![("read", "c", "3"), ("read", "c", "4")], "both reads went to the worker, no send");
    assert_eq!(left, 0, "the ack was recorded");
}
