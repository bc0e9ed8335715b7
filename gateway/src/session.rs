//! One WebSocket session: a single loop over socket reads, realtime pushes, backlog
//! pages, the heartbeat tick and shutdown.
//!
//! Delivery rules (DESIGN.md section 4): realtime pushes go first (biased select);
//! backlog is read from the device's pending set in pages, each page acked before the
//! next; at most `inflight_window` pushes are unacked; an ack removes the ids from the
//! pending set (and nothing else does); an unacked push older than `ack_timeout_ms`
//! triggers a ping, and without a pong the connection is half-open and closed (4000).
//! A push dropped because this session's queue was full is re-read from the pending set.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use fred::interfaces::{HashesInterface, SortedSetsInterface};
use fred::prelude::*;
use herald_shared::auth::{Claims, Platform};
use herald_shared::error::ErrorCode;
use herald_shared::ids::{now_ms, MsgId};
use herald_shared::protocol::{ClientFrame, SendResult};
use herald_shared::scripts;
use serde_json::json;

use crate::sessions::{Control, DeviceKey, Push};
use crate::AppState;
use herald_shared::protocol::CloseCode;

/// Sets the device's presence, returning what was there before.
const PRESENCE_SET_LUA: &str = "local old = redis.call('HGET', KEYS[1], ARGV[1]) \
     redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) redis.call('PEXPIRE', KEYS[1], ARGV[3]) return old";
/// Keeps the device's presence alive; sets it again when it is missing (Redis lost its
/// data, or the key expired while Redis was unreachable), but never over another
/// session's. Returns 1 when it had to set it.
const PRESENCE_KEEP_LUA: &str = "local set = 0 \
     if not redis.call('HGET', KEYS[1], ARGV[1]) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) set = 1 end \
     redis.call('PEXPIRE', KEYS[1], ARGV[3]) return set";
/// Clears the device's presence if it is still this session's.
const PRESENCE_CLEAR_LUA: &str =
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0";

/// Protocol errors tolerated before the connection is closed with 4009.
const MAX_PROTOCOL_ERRORS: u32 = 10;

/// Where the backlog stands.
#[derive(Debug, Default)]
struct Backlog {
    /// The highest id read from the pending set so far.
    cursor: MsgId,
    /// Ids of the current page not yet acked.
    outstanding: HashSet<MsgId>,
    done: bool,
    delivered: u64,
}

pub struct Session {
    state: AppState,
    claims: Claims,
    key: DeviceKey,
    id: String,
    socket: WebSocket,
    inflight: HashMap<MsgId, Instant>,
    backlog: Backlog,
    page_size: usize,
    last_seen: Instant,
    last_ping: Instant,
    probe: Option<Instant>,
    protocol_errors: u32,
    /// The Redis epoch this session's pending set was checked against, and the gateway's
    /// epoch generation when it was.
    epoch: String,
    epoch_generation: u64,
    last_mark: Instant,
    backlog_bucket: governor::DefaultDirectRateLimiter,
    send_bucket: governor::DefaultDirectRateLimiter,
    /// The backlog waits for tokens until then; realtime keeps flowing meanwhile.
    backlog_resume: Option<tokio::time::Instant>,
    rate_limited: u32,
    /// Read positions written but not yet confirmed by a pong: (field, seq).
    unconfirmed_reads: Vec<(String, u64)>,
    /// Acked ids not yet removed from the pending set, and when they will be.
    acks: Vec<MsgId>,
    ack_flush_at: Option<tokio::time::Instant>,
}

/// How long acks wait to be removed together; a crash in between only repeats pushes.
const ACK_FLUSH: Duration = Duration::from_millis(5);
const ACK_BATCH: usize = 512;

/// Rate-limited requests tolerated before the connection is closed with 4008.
const MAX_RATE_LIMITED: u32 = 100;

enum Step {
    Continue,
    Close(CloseCode, &'static str),
}

impl Session {
    pub async fn run(state: AppState, claims: Claims, socket: WebSocket) {
        let id = format!("{}-{:016x}", state.cfg.node_id, rand::random::<u64>());
        let key = DeviceKey::of(&claims);
        let g = &state.cfg.gateway;
        let (page_size, backlog_rate) = match claims.plat {
            Platform::Ios | Platform::Android => (g.backlog_page_mobile, g.backlog_rate_mobile),
            _ => (g.backlog_page_desktop, g.backlog_rate_desktop),
        };
        let backlog_bucket = crate::limits::bucket(backlog_rate, (page_size as u32).max(backlog_rate / 10));
        let send_bucket = crate::limits::bucket(g.send_rate, g.send_burst);
        let span = tracing::debug_span!("session", tenant = %claims.tid, user = %claims.sub, device = %claims.dev, session = %id);
        let _enter = span.enter();
        let now = Instant::now();
        let mut session = Session {
            state,
            claims,
            key,
            id,
            socket,
            inflight: HashMap::new(),
            backlog: Backlog::default(),
            page_size,
            last_seen: now,
            last_ping: now,
            probe: None,
            protocol_errors: 0,
            epoch: String::new(),
            epoch_generation: 0,
            last_mark: now,
            backlog_bucket,
            send_bucket,
            backlog_resume: None,
            rate_limited: 0,
            acks: Vec::new(),
            ack_flush_at: None,
            unconfirmed_reads: Vec::new(),
        };
        session.serve().await;
    }

    async fn serve(&mut self) {
        let st = self.state.clone();
        let reg = st.sessions.register(self.key.clone(), self.id.clone(), st.cfg.gateway.realtime_queue);
        let (mut pushes, mut control, control_tx, lagged) = (reg.pushes, reg.control, reg.control_tx, reg.lagged);
        let outcome = match self.start().await {
            Ok(()) => self.event_loop(&mut pushes, &mut control, &control_tx, &lagged).await,
            Err(e) => {
                tracing::warn!(error = %e, "session start failed");
                Step::Close(CloseCode::InternalError, "dependency unavailable")
            }
        };
        if let Step::Close(code, reason) = outcome {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                self.socket.send(Message::Close(Some(CloseFrame { code: code.code(), reason: reason.into() }))),
            )
            .await;
        }
        st.sessions.unregister(&self.key, &self.id);
        if let Err(e) = self.flush_acks().await {
            tracing::warn!(error = %e, "final acks could not be recorded; those messages will be pushed again");
        }
        self.report_watermark().await;
        let presence = st.keys.presence(&self.claims.tid, &self.claims.sub);
        let value = format!("{}|{}", st.cfg.node_id, self.id);
        let _: Result<i64, _> =
            st.redis.next().eval(PRESENCE_CLEAR_LUA, vec![presence], vec![self.claims.dev.clone(), value]).await;
    }

    /// Presence (replacing a session elsewhere) and the `hello` frame.
    async fn start(&mut self) -> Result<(), fred::error::Error> {
        let st = self.state.clone();
        let presence = st.keys.presence(&self.claims.tid, &self.claims.sub);
        let value = format!("{}|{}", st.cfg.node_id, self.id);
        let ttl = (st.cfg.gateway.heartbeat_ms * 3).to_string();
        let old: Option<String> =
            st.redis.next().eval(PRESENCE_SET_LUA, vec![presence], vec![self.claims.dev.clone(), value, ttl]).await?;
        if let Some((node, session)) = old.as_deref().and_then(|o| o.split_once('|')) {
            if node != st.cfg.node_id {
                let kick = herald_shared::protocol::NodeEnvelope {
                    kick: vec![herald_shared::protocol::Kick {
                        tenant: self.claims.tid.clone(),
                        user: self.claims.sub.clone(),
                        device: self.claims.dev.clone(),
                        session: session.to_string(),
                    }],
                    ..Default::default()
                };
                let _: () = st
                    .redis
                    .next()
                    .publish(st.keys.node_channel(node), serde_json::to_string(&kick).expect("serializes"))
                    .await?;
            }
        }
        // The device registry in Redis (MySQL's devices table stays the truth).
        let _: i64 = st
            .redis
            .next()
            .hset(
                st.keys.devices(&self.claims.tid, &self.claims.sub),
                (self.claims.dev.as_str(), self.claims.plat.as_str()),
            )
            .await?;
        // The generation first: an epoch change after this read is noticed at the next tick.
        self.epoch_generation = st.epoch_generation.load(std::sync::atomic::Ordering::Acquire);
        self.epoch = st.epoch();
        if let Err(e) = crate::recovery::ensure_pending(&st, &self.claims, &self.epoch).await {
            tracing::warn!(error = %e, "pending set rebuild failed");
            return Err(fred::error::Error::new(fred::error::ErrorKind::Unknown, "pending set rebuild failed"));
        }
        let pending: u64 = st.redis.next().zcard(self.pending_key()).await?;
        metrics::histogram!("herald_pending_at_connect").record(pending as f64);
        self.write(
            json!({"t": "hello", "session": self.id, "hb_ms": st.cfg.gateway.heartbeat_ms, "pending": pending})
                .to_string(),
        )
        .await;
        self.send_stored_reads().await?;
        Ok(())
    }

    fn pending_key(&self) -> String {
        self.state.keys.pending(&self.claims.tid, &self.claims.sub, &self.claims.dev)
    }

    async fn write(&mut self, text: impl Into<axum::extract::ws::Utf8Bytes>) -> bool {
        metrics::counter!("herald_frames_out_total").increment(1);
        self.socket.send(Message::Text(text.into())).await.is_ok()
    }

    async fn event_loop(
        &mut self,
        pushes: &mut tokio::sync::mpsc::Receiver<Push>,
        control: &mut tokio::sync::mpsc::Receiver<Control>,
        control_tx: &tokio::sync::mpsc::Sender<Control>,
        lagged: &std::sync::atomic::AtomicBool,
    ) -> Step {
        let cfg = self.state.cfg.gateway.clone();
        let shutdown = self.state.shutdown.clone();
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.heartbeat_ms.min(1_000)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if lagged.swap(false, Ordering::AcqRel) {
                // Dropped pushes are still pending in Redis: read the set again.
                self.backlog = Backlog { delivered: self.backlog.delivered, ..Backlog::default() };
            }
            let paced = self.backlog_resume.is_some_and(|t| t > tokio::time::Instant::now());
            if !paced
                && !self.backlog.done
                && self.backlog.outstanding.is_empty()
                && self.inflight.len() < cfg.inflight_window
            {
                if let Err(e) = self.next_backlog_page(cfg.inflight_window - self.inflight.len()).await {
                    tracing::warn!(error = %e, "backlog read failed");
                    return Step::Close(CloseCode::InternalError, "dependency unavailable");
                }
            }
            let window_open = self.inflight.len() < cfg.inflight_window;
            let resume = self.backlog_resume.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return self.drain(cfg.drain_ms).await,
                Some(c) = control.recv() => match c {
                    Control::Frame(text) => { self.write(text).await; }
                    Control::Replaced => return Step::Close(CloseCode::Replaced, "replaced by a newer session"),
                    Control::Read { conv, user, seq } => {
                        self.write_read(conv, user, seq).await;
                        let _ = self.socket.send(Message::Ping(Default::default())).await;
                    }
                },
                Some(p) = pushes.recv(), if window_open => {
                    if self.inflight.contains_key(&p.id) {
                        continue;
                    }
                    self.inflight.insert(p.id, Instant::now());
                    if !self.write(p.frame).await {
                        return Step::Continue;
                    }
                    metrics::counter!("herald_deliveries_total", "kind" => "realtime").increment(1);
                }
                msg = self.socket.recv() => {
                    let Some(Ok(msg)) = msg else { return Step::Continue };
                    self.last_seen = Instant::now();
                    match msg {
                        Message::Text(t) => {
                            if let Step::Close(code, reason) = self.on_frame(t.as_str(), control_tx).await {
                                return Step::Close(code, reason);
                            }
                        }
                        Message::Pong(_) => {
                            self.on_pong();
                            self.confirm_reads().await;
                        }
                        Message::Close(_) => return Step::Continue,
                        Message::Binary(_) => {
                            if let Step::Close(c, r) = self.protocol_error(None, "binary frames are not supported").await {
                                return Step::Close(c, r);
                            }
                        }
                        Message::Ping(_) => {}
                    }
                }
                _ = tick.tick() => {
                    if let Step::Close(code, reason) = self.on_tick().await {
                        return Step::Close(code, reason);
                    }
                }
                _ = tokio::time::sleep_until(resume), if self.backlog_resume.is_some() => {
                    self.backlog_resume = None;
                }
                _ = tokio::time::sleep_until(self.ack_flush_at.unwrap_or(resume)), if self.ack_flush_at.is_some() => {
                    if let Err(e) = self.flush_acks().await {
                        tracing::warn!(error = %e, "acks could not be recorded");
                        self.error_frame(ErrorCode::Unavailable, "ack not recorded; ack again", None).await;
                    }
                }
            }
        }
    }

    async fn write_read(&mut self, conv: String, user: String, seq: u64) {
        let frame = json!({"t": "read", "conv": conv, "user": user, "seq": seq}).to_string();
        self.unconfirmed_reads.push((herald_shared::protocol::read_field(&conv, &user), seq));
        self.write(frame).await;
    }

    /// Read positions waiting in Redis since the device was last connected: the latest
    /// of each, followed by a ping whose pong confirms them.
    async fn send_stored_reads(&mut self) -> Result<(), fred::error::Error> {
        let key = self.state.keys.reads(&self.claims.tid, &self.claims.sub, &self.claims.dev);
        let stored: HashMap<String, u64> = self.state.redis.next().hgetall(key).await?;
        if stored.is_empty() {
            return Ok(());
        }
        for (field, seq) in stored {
            if let Some((conv, user)) = field.split_once(' ') {
                self.write_read(conv.to_owned(), user.to_owned(), seq).await;
            }
        }
        let _ = self.socket.send(Message::Ping(Default::default())).await;
        Ok(())
    }

    /// A pong comes after every frame written before its ping: the reads are shown.
    async fn confirm_reads(&mut self) {
        if self.unconfirmed_reads.is_empty() {
            return;
        }
        let key = self.state.keys.reads(&self.claims.tid, &self.claims.sub, &self.claims.dev);
        let args: Vec<String> = self.unconfirmed_reads.drain(..).flat_map(|(f, s)| [f, s.to_string()]).collect();
        let _: Result<i64, _> = scripts::READS_CONFIRM.call(self.state.redis.next(), vec![key], args).await;
    }

    fn on_pong(&mut self) {
        if self.probe.take().is_some() {
            // A slow device, not a dead one: give its pushes more time.
            let now = Instant::now();
            for t in self.inflight.values_mut() {
                *t = now;
            }
        }
    }

    /// Reports W for the MySQL flush (only while the pending set is trusted).
    async fn report_watermark(&mut self) {
        self.last_mark = Instant::now();
        if let Ok(Some(w)) = crate::recovery::watermark(&self.state, &self.claims, &self.epoch).await {
            let mark = crate::recovery::Mark {
                tenant: self.claims.tid.clone(),
                user: self.claims.sub.clone(),
                device: self.claims.dev.clone(),
                platform: self.claims.plat.as_str(),
                watermark: w,
            };
            let _ = self.state.marks.try_send(mark);
        }
    }

    async fn on_tick(&mut self) -> Step {
        // A counter compare per tick; the epoch string is read only when it changed.
        let generation = self.state.epoch_generation.load(std::sync::atomic::Ordering::Acquire);
        if generation != self.epoch_generation {
            let epoch = self.state.epoch();
            if epoch == self.epoch {
                self.epoch_generation = generation;
            } else {
                // Redis lost its data: restore the pending set from MySQL, read it again.
                match crate::recovery::ensure_pending(&self.state, &self.claims, &epoch).await {
                    Ok(_) => {
                        self.epoch = epoch;
                        self.epoch_generation = generation;
                        // The presence went with the data: restore it now, not at the next
                        // heartbeat (the backlog is read again just below anyway).
                        self.keep_presence().await;
                        self.backlog = Backlog { delivered: self.backlog.delivered, ..Backlog::default() };
                    }
                    Err(e) => tracing::warn!(error = %e, "pending set rebuild failed; retrying"),
                }
            }
        }
        if self.last_mark.elapsed() >= Duration::from_millis(self.state.cfg.gateway.watermark_flush_ms) {
            self.report_watermark().await;
        }
        let cfg = &self.state.cfg.gateway;
        let now = Instant::now();
        let idle_limit = Duration::from_millis(cfg.heartbeat_ms * 5 / 2);
        if now.duration_since(self.last_seen) > idle_limit {
            metrics::counter!("herald_heartbeat_timeouts_total").increment(1);
            return Step::Close(CloseCode::HeartbeatTimeout, "heartbeat timeout");
        }
        if let Some(probe) = self.probe {
            if now.duration_since(probe) > Duration::from_millis(cfg.ack_probe_ms) {
                metrics::counter!("herald_half_open_closes_total").increment(1);
                return Step::Close(CloseCode::HeartbeatTimeout, "unacked pushes and no pong: half-open");
            }
        } else if self.inflight.values().any(|t| now.duration_since(*t) > Duration::from_millis(cfg.ack_timeout_ms)) {
            metrics::counter!("herald_ack_timeouts_total").increment(1);
            self.probe = Some(now);
            let _ = self.socket.send(Message::Ping(Default::default())).await;
            self.last_ping = now;
        }
        if now.duration_since(self.last_ping) >= Duration::from_millis(cfg.heartbeat_ms) {
            self.last_ping = now;
            let _ = self.socket.send(Message::Ping(Default::default())).await;
            if self.keep_presence().await {
                // The presence expired (Redis paused) or went with the data of the user's
                // slot. In a Redis Cluster a master other than the epoch's can lose its
                // data with the epoch unchanged: the device's marker went too, and this
                // restores the pending set from MySQL (a no-op while the marker is there).
                if let Err(e) = crate::recovery::ensure_pending(&self.state, &self.claims, &self.epoch).await {
                    tracing::warn!(error = %e, "pending set rebuild failed");
                }
                // Workers skipped pushes to this device while it had no presence; they
                // are still in its pending set.
                self.backlog = Backlog { delivered: self.backlog.delivered, ..Backlog::default() };
            }
        }
        Step::Continue
    }

    /// Refreshes the presence's TTL, setting it again if it is missing; true when it was
    /// missing.
    async fn keep_presence(&mut self) -> bool {
        let st = &self.state;
        let presence = st.keys.presence(&self.claims.tid, &self.claims.sub);
        let value = format!("{}|{}", st.cfg.node_id, self.id);
        let ttl = (st.cfg.gateway.heartbeat_ms * 3).to_string();
        let set: Result<i64, _> =
            st.redis.next().eval(PRESENCE_KEEP_LUA, vec![presence], vec![self.claims.dev.clone(), value, ttl]).await;
        let was_missing = matches!(set, Ok(1));
        if was_missing {
            tracing::info!("presence was missing; set again and the pending set read again");
        }
        was_missing
    }

    async fn protocol_error(&mut self, reference: Option<String>, message: &str) -> Step {
        self.error_frame(ErrorCode::BadRequest, message, reference).await;
        self.count_protocol_error()
    }

    fn count_protocol_error(&mut self) -> Step {
        self.protocol_errors += 1;
        metrics::counter!("herald_protocol_errors_total").increment(1);
        if self.protocol_errors >= MAX_PROTOCOL_ERRORS {
            return Step::Close(CloseCode::Protocol, "too many malformed frames");
        }
        Step::Continue
    }

    async fn error_frame(&mut self, code: ErrorCode, message: &str, reference: Option<String>) {
        let mut f = json!({"t": "error", "code": code, "message": message});
        if let Some(r) = reference {
            f["ref"] = json!(r);
        }
        self.write(f.to_string()).await;
    }

    async fn on_frame(&mut self, text: &str, control_tx: &tokio::sync::mpsc::Sender<Control>) -> Step {
        let max_frame = self.state.cfg.gateway.max_body_bytes * 2 + 4096;
        if text.len() > max_frame {
            self.error_frame(
                ErrorCode::TooLarge,
                &format!("frame is {} bytes; the limit is {max_frame}", text.len()),
                None,
            )
            .await;
            return self.count_protocol_error();
        }
        let frame = match ClientFrame::parse(text) {
            Ok(f) => f,
            Err(e) => {
                metrics::counter!("herald_frames_in_total", "type" => "invalid").increment(1);
                return self.protocol_error(e.reference, &e.message).await;
            }
        };
        let kind = match &frame {
            ClientFrame::Send(_) => "send",
            ClientFrame::Ack(_) => "ack",
            ClientFrame::Read(_) => "read",
            ClientFrame::Sync(_) => "sync",
            ClientFrame::Ping(_) => "ping",
        };
        metrics::counter!("herald_frames_in_total", "type" => kind).increment(1);
        match frame {
            ClientFrame::Ping(p) => {
                let ts = p.ts.unwrap_or_else(now_ms);
                self.write(json!({"t": "pong", "ts": ts}).to_string()).await;
            }
            ClientFrame::Ack(a) => {
                if let Err(e) = self.on_ack(a.ids).await {
                    tracing::warn!(error = %e, "ack could not be recorded");
                    self.error_frame(ErrorCode::Unavailable, "ack not recorded; ack again", None).await;
                }
            }
            ClientFrame::Send(s) => {
                if let Err(e) = crate::messages::validate_send(&self.state, &s.cmid, &s.conv, &s.body) {
                    self.error_frame(e.code, &e.message, Some(s.cmid)).await;
                    return Step::Continue;
                }
                // The device's bucket, then the tenant's (gateway.tenant_send_rate).
                if let Err(wait) = crate::limits::take(&self.send_bucket, 1)
                    .and_then(|()| self.state.limits.tenant_send(&self.claims.tid))
                {
                    metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
                    let f = json!({"t": "error", "code": "rate_limited", "message": "too many sends; retry later",
                        "ref": s.cmid, "retry_after_ms": wait.as_millis().max(1) as u64});
                    self.write(f.to_string()).await;
                    self.rate_limited += 1;
                    if self.rate_limited >= MAX_RATE_LIMITED {
                        return Step::Close(CloseCode::Policy, "rate limits exceeded repeatedly");
                    }
                    return Step::Continue;
                }
                let started = Instant::now();
                // Enqueued here, in arrival order; the commit is awaited elsewhere.
                match crate::messages::enqueue(
                    &self.state,
                    &self.claims,
                    s.cmid.clone(),
                    s.conv,
                    s.body.get().to_owned(),
                )
                .await
                {
                    Err(e) => self.error_frame(e.code, &e.message, Some(s.cmid)).await,
                    Ok(waiter) => {
                        let (state, tx, cmid) = (self.state.clone(), control_tx.clone(), s.cmid);
                        tokio::spawn(async move {
                            let frame = match crate::messages::wait_committed(&state, waiter).await {
                                Ok(r) => sent_frame(&cmid, &r),
                                Err(e) => {
                                    json!({"t": "error", "code": e.code, "message": e.message, "ref": cmid}).to_string()
                                }
                            };
                            metrics::histogram!("herald_send_ack_seconds", "transport" => "ws")
                                .record(started.elapsed().as_secs_f64());
                            let _ = tx.send(Control::Frame(frame)).await;
                        });
                    }
                }
            }
            ClientFrame::Sync(s) => {
                let limit = s.limit.unwrap_or(100).clamp(1, 1_000);
                let (state, tx) = (self.state.clone(), control_tx.clone());
                let (tenant, user) = (self.claims.tid.clone(), self.claims.sub.clone());
                tokio::spawn(async move {
                    let frame = match crate::history::conversation(&state, &tenant, &user, &s.conv, s.after_seq, limit)
                        .await
                    {
                        Ok(p) => {
                            json!({"t": "history", "conv": s.conv, "items": p.items, "more": p.more, "ref": s.reference})
                        }
                        Err(e) => json!({"t": "error", "code": e.code, "message": e.message, "ref": s.reference}),
                    };
                    let _ = tx.send(Control::Frame(frame.to_string())).await;
                });
            }
            ClientFrame::Read(r) => match crate::messages::enqueue_read(&self.state, &self.claims, r.conv, r.seq).await
            {
                Err(e) => self.error_frame(e.code, &e.message, None).await,
                Ok(waiter) => {
                    let (state, tx) = (self.state.clone(), control_tx.clone());
                    tokio::spawn(async move {
                        // Success has no frame of its own (the other devices get `read`).
                        if let Err(e) = crate::messages::wait_outcome(&state, waiter).await {
                            let frame = json!({"t": "error", "code": e.code, "message": e.message});
                            let _ = tx.send(Control::Frame(frame.to_string())).await;
                        }
                    });
                }
            },
        }
        Step::Continue
    }

    /// Acked ids leave the pending set; this is the only way they leave it.
    /// Acks are applied to the session at once and to the pending set in batches: one
    /// ZREM per `ACK_FLUSH` (or per `ACK_BATCH` ids) instead of one per ack frame.
    async fn on_ack(&mut self, ids: Vec<MsgId>) -> Result<(), fred::error::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let now_ms = herald_shared::ids::now_ms();
        for id in &ids {
            if self.inflight.remove(id).is_some() {
                // Commit (the id's own timestamp) to device ack.
                let kind = if self.backlog.outstanding.contains(id) { "backlog" } else { "realtime" };
                let secs = now_ms.saturating_sub(id.unix_ms()) as f64 / 1000.0;
                metrics::histogram!("herald_delivery_seconds", "kind" => kind).record(secs);
            }
            if self.backlog.outstanding.remove(id) {
                self.backlog.delivered += 1;
            }
        }
        metrics::counter!("herald_acks_total").increment(ids.len() as u64);
        self.acks.extend(ids);
        let finishing =
            !self.backlog.done && self.backlog.outstanding.is_empty() && self.backlog.cursor == MsgId(u64::MAX);
        if finishing || self.acks.len() >= ACK_BATCH {
            self.flush_acks().await?;
        } else if self.ack_flush_at.is_none() {
            self.ack_flush_at = Some(tokio::time::Instant::now() + ACK_FLUSH);
        }
        if finishing {
            // `caught_up` promises the backlog is acked: only after the ZREM landed.
            self.finish_backlog().await;
        }
        Ok(())
    }

    /// Removes the acked ids from the pending set; this is the only way they leave it.
    async fn flush_acks(&mut self) -> Result<(), fred::error::Error> {
        self.ack_flush_at = None;
        if self.acks.is_empty() {
            return Ok(());
        }
        let members: Vec<String> = self.acks.drain(..).map(|i| i.member()).collect();
        let _: i64 = self.state.redis.next().zrem(self.pending_key(), members).await?;
        Ok(())
    }

    async fn finish_backlog(&mut self) {
        self.backlog.done = true;
        let delivered = self.backlog.delivered;
        self.write(json!({"t": "caught_up", "delivered": delivered}).to_string()).await;
    }

    /// Reads and sends the next page of the pending set after the cursor.
    async fn next_backlog_page(&mut self, room: usize) -> Result<(), fred::error::Error> {
        if self.backlog.cursor == MsgId(u64::MAX) {
            // Every page was read; caught_up follows the last ack.
            return Ok(());
        }
        let want = self.page_size.min(room).max(1);
        // Pace: the device's bucket, then the node's (a login storm must not starve it).
        let wait = crate::limits::take(&self.backlog_bucket, want)
            .err()
            .or_else(|| crate::limits::take(&self.state.limits.backlog, want).err());
        if let Some(wait) = wait {
            metrics::counter!("herald_backlog_throttled_total").increment(1);
            self.backlog_resume = Some(tokio::time::Instant::now() + wait);
            return Ok(());
        }
        // Exact after the cursor however many ids share its score (see the script).
        let (cursor, score) = match self.backlog.cursor {
            MsgId(0) => (String::new(), String::new()),
            c => (c.member(), c.score().to_string()),
        };
        let members: Vec<String> = self
            .state
            .redis
            .next()
            .eval(scripts::PENDING_PAGE.source(), vec![self.pending_key()], vec![cursor, score, want.to_string()])
            .await?;
        let ids: Vec<MsgId> = members.iter().filter_map(|m| MsgId::from_member(m)).collect();
        let Some(last) = ids.last().copied() else {
            self.backlog.cursor = MsgId(u64::MAX);
            if self.backlog.outstanding.is_empty() {
                self.finish_backlog().await;
            }
            return Ok(());
        };
        self.backlog.cursor = last;
        let fresh: Vec<MsgId> = ids.into_iter().filter(|id| !self.inflight.contains_key(id)).collect();
        let frames = match crate::history::frames(&self.state, &fresh).await {
            Ok(f) => f,
            Err(e) => {
                // Nothing is removed on a failed read: the page is read again.
                tracing::warn!(error = %e, "message frames could not be read from MySQL");
                return Err(fred::error::Error::new(fred::error::ErrorKind::Unknown, "message frames unavailable"));
            }
        };
        let now = Instant::now();
        for id in fresh {
            match frames.get(&id) {
                Some(frame) => {
                    self.inflight.insert(id, now);
                    self.backlog.outstanding.insert(id);
                    self.write(frame.clone()).await;
                    metrics::counter!("herald_deliveries_total", "kind" => "backlog").increment(1);
                }
                None => {
                    // Not in Redis nor MySQL (a message that was never committed cannot
                    // be pending); drop the stale entry.
                    let _: Result<i64, _> = self.state.redis.next().zrem(self.pending_key(), id.member()).await;
                }
            }
        }
        Ok(())
    }

    /// Server shutdown: tell the client when to come back (spread over the drain
    /// period), give it a moment to ack what is in flight, then close with 4003.
    async fn drain(&mut self, drain_ms: u64) -> Step {
        let after_ms = rand::random::<u64>() % drain_ms.max(1);
        self.write(json!({"t": "reconnect", "after_ms": after_ms}).to_string()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(drain_ms.min(2_000));
        while !self.inflight.is_empty() {
            match tokio::time::timeout_at(deadline, self.socket.recv()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    if let Ok(ClientFrame::Ack(a)) = ClientFrame::parse(t.as_str()) {
                        let _ = self.on_ack(a.ids).await;
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => break,
            }
        }
        Step::Close(CloseCode::Draining, "server draining; reconnect")
    }
}

fn sent_frame(cmid: &str, r: &SendResult) -> String {
    json!({"t": "sent", "cmid": cmid, "id": r.id, "conv": r.conv, "seq": r.seq, "ts": r.ts, "dup": r.dup}).to_string()
}
