//! The way into the workers: a send, a read receipt or a timeline change is queued for
//! the node's ingress writer, which appends it to its conversation's ingress stream
//! (`crate::ingress_writer`), and its answer awaited on this node's channel. The
//! worker answers only after COMMIT; without an answer in time the caller hears
//! `unavailable` and resends with the same `cmid` (it gets the first commit back with
//! `dup: true`).

use std::sync::Arc;
use std::time::Duration;

use herald_shared::auth::{is_valid_ident, Claims};
use herald_shared::error::ErrorCode;
use herald_shared::keys::shard_of;
use herald_shared::otel::{TraceParent, Tracer};
use herald_shared::protocol::pack::PackedSend;
use herald_shared::protocol::{Echo, ReadEntry, SendOutcome, SendResult, TimelineEntry, TimelineOp, MAX_CMID_LEN};
use serde_json::value::RawValue;

use crate::error::{ApiError, ApiResult};
use crate::ingress_writer::{IngressQueue, Request};
use crate::waiters::{SendWaiters, Waiter};

/// Queues requests for the ingress streams and waits for their answers.
#[derive(Clone, Debug)]
pub struct Ingress {
    pub queue: IngressQueue,
    pub waiters: Arc<SendWaiters>,
    /// This node: where answers come back.
    pub node_id: String,
    pub shards: u32,
    pub send_timeout: Duration,
    pub max_body_bytes: usize,
    /// Where sends' spans start (`crate::send_span`); off unless `otel.endpoint` is set.
    pub tracer: Tracer,
}

/// Checks a send's fields against the protocol's limits.
pub fn check_send(cmid: &str, conv: &str, body: &RawValue, max_body_bytes: usize) -> ApiResult<()> {
    if cmid.is_empty() || cmid.chars().count() > MAX_CMID_LEN {
        return Err(ApiError::bad_request(format!("cmid must be 1..{MAX_CMID_LEN} characters")));
    }
    if !is_valid_ident(conv) {
        return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
    }
    if body.get().len() > max_body_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("body is {} bytes serialized; the limit is {max_body_bytes}", body.get().len()),
        ));
    }
    Ok(())
}

impl Ingress {
    /// Checks a send (HTTP and WebSocket alike).
    pub fn validate_send(&self, cmid: &str, conv: &str, body: &RawValue) -> ApiResult<()> {
        check_send(cmid, conv, body, self.max_body_bytes)
    }

    /// Queues the send for its ingress stream, with its span's context when it is
    /// traced. Sends of one session are queued in the order they arrived, which is the
    /// order their `seq` follows.
    pub fn enqueue_send(
        &self,
        c: &Claims,
        cmid: String,
        conv: String,
        body: Box<RawValue>,
        trace: Option<TraceParent>,
    ) -> ApiResult<Waiter> {
        let shard = shard_of(&c.tid, &conv, self.shards);
        let echo = Echo { tenant: c.tid.clone(), user: c.sub.clone(), conv: conv.clone(), cmid: Some(cmid.clone()) };
        let waiter = self.waiters.register(echo);
        let send = PackedSend {
            tenant: c.tid.clone(),
            user: c.sub.clone(),
            device: c.dev.clone(),
            cmid,
            conv,
            rid: waiter.rid,
            body,
            trace,
        };
        self.queue.push(shard, Request::Send(send))?;
        Ok(waiter)
    }

    /// Queues a read receipt for the conversation's ingress stream (after its sends).
    pub fn enqueue_read(&self, c: &Claims, conv: String, seq: u64) -> ApiResult<Waiter> {
        if !is_valid_ident(&conv) {
            return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
        }
        let shard = shard_of(&c.tid, &conv, self.shards);
        let mut entry = ReadEntry {
            tenant: c.tid.clone(),
            user: c.sub.clone(),
            device: c.dev.clone(),
            conv,
            seq,
            node: self.node_id.clone(),
            rid: 0,
        };
        let waiter = self.waiters.register(entry.echo());
        entry.rid = waiter.rid;
        self.queue.push(shard, Request::Entry { fields: entry.to_fields(), rid: waiter.rid })?;
        Ok(waiter)
    }

    /// Appends a timeline change of `actor` (a user, or a service: `by_service`) to the
    /// conversation's stream, in order with its sends, and waits for its events (none
    /// when it changed nothing; those of the first commit for a repeated `cmid`).
    pub async fn timeline(
        &self,
        actor: &Claims,
        by_service: bool,
        conv: String,
        cmid: String,
        op: TimelineOp,
    ) -> ApiResult<Vec<SendResult>> {
        if !is_valid_ident(&conv) {
            return Err(ApiError::bad_request("conv must be 1..64 printable ASCII characters"));
        }
        let shard = shard_of(&actor.tid, &conv, self.shards);
        let mut entry = TimelineEntry {
            tenant: actor.tid.clone(),
            user: actor.sub.clone(),
            device: actor.dev.clone(),
            cmid,
            conv,
            by_service,
            op,
            node: self.node_id.clone(),
            rid: 0,
        };
        let waiter = self.waiters.register(entry.echo());
        entry.rid = waiter.rid;
        self.queue.push(shard, Request::Entry { fields: entry.to_fields(), rid: waiter.rid })?;
        let Some(answer) = self.answer(waiter).await else {
            metrics::counter!("herald_send_timeouts_total", "transport" => "timeline").increment(1);
            return Err(not_confirmed());
        };
        match answer? {
            SendOutcome::Timeline(events) => Ok(events),
            _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
        }
    }

    /// Queues and waits for the committed answer (`POST /v1/messages`).
    pub async fn send(
        &self,
        c: &Claims,
        cmid: String,
        conv: String,
        body: Box<RawValue>,
        trace: Option<TraceParent>,
    ) -> ApiResult<SendResult> {
        let waiter = self.enqueue_send(c, cmid, conv, body, trace)?;
        self.committed(waiter, "http").await
    }

    /// Waits for the worker's answer to a send, which comes only after COMMIT; one not
    /// confirmed in time is counted under its `transport` (`http`, `ws`).
    pub async fn committed(&self, waiter: Waiter, transport: &'static str) -> ApiResult<SendResult> {
        let Some(answer) = self.answer(waiter).await else {
            metrics::counter!("herald_send_timeouts_total", "transport" => transport).increment(1);
            return Err(not_confirmed());
        };
        match answer? {
            SendOutcome::Ok(r) => Ok(r),
            _ => Err(ApiError::new(ErrorCode::Internal, "unexpected answer")),
        }
    }

    /// Waits for the worker's answer to a read position.
    pub async fn outcome(&self, waiter: Waiter) -> ApiResult<SendOutcome> {
        let Some(answer) = self.answer(waiter).await else {
            metrics::counter!("herald_read_timeouts_total").increment(1);
            return Err(not_confirmed());
        };
        answer
    }

    /// The worker's answer; `None` when none came within the send timeout.
    async fn answer(&self, mut waiter: Waiter) -> Option<ApiResult<SendOutcome>> {
        match tokio::time::timeout(self.send_timeout, &mut waiter.rx).await {
            Ok(Ok(SendOutcome::Err { code, message })) => Some(Err(ApiError::new(code, message))),
            Ok(Ok(outcome)) => Some(Ok(outcome)),
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

fn not_confirmed() -> ApiError {
    ApiError::new(ErrorCode::Unavailable, "not confirmed in time; retry (sends with the same cmid)")
}
