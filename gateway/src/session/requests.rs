//! The device's requests: `send` (enqueued in arrival order, answered after COMMIT),
//! `sync` (a page of history from MySQL) and `read` (a read receipt). Their answers are
//! awaited in tasks the session tracks and aborts when it ends; the loop writes them.
//! Malformed frames and refused requests count as strikes.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::Message;
use futures::{Sink, Stream};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{CloseCode, ErrorFrame, History, ReadFrame, SendFrame, Sent, ServerFrame, SyncFrame};
use tokio::task::JoinError;
use tokio::time::Instant;

use super::{End, Flow, Session};
use crate::error::ApiError;
use crate::send_span::SendSpan;

/// Protocol errors tolerated before the connection is closed with 4009.
const MAX_PROTOCOL_ERRORS: u32 = 10;
/// Rate-limited requests tolerated within [`RATE_LIMIT_WINDOW`] before the connection
/// is closed with 4008: a client that keeps ignoring `retry_after_ms`, not a long
/// session that was refused now and then.
const MAX_RATE_LIMITED: usize = 100;
const RATE_LIMIT_WINDOW: Duration = Duration::from_secs(60);

/// Misbehaviour counted over the session.
#[derive(Debug, Default)]
pub(super) struct Strikes {
    protocol: u32,
    /// When recent requests were refused by a rate limit.
    rate_limited: VecDeque<Instant>,
}

impl Strikes {
    /// A malformed or oversized frame.
    pub(super) fn protocol(&mut self) -> Flow {
        self.protocol += 1;
        metrics::counter!("herald_protocol_errors_total").increment(1);
        if self.protocol >= MAX_PROTOCOL_ERRORS {
            return ControlFlow::Break(End::Close(CloseCode::Protocol, "too many malformed frames"));
        }
        ControlFlow::Continue(())
    }

    /// A request refused by a rate limit.
    fn rate_limited(&mut self, now: Instant) -> Flow {
        while self.rate_limited.front().is_some_and(|t| now.duration_since(*t) >= RATE_LIMIT_WINDOW) {
            self.rate_limited.pop_front();
        }
        self.rate_limited.push_back(now);
        if self.rate_limited.len() >= MAX_RATE_LIMITED {
            return ControlFlow::Break(End::Close(CloseCode::Policy, "rate limits exceeded repeatedly"));
        }
        ControlFlow::Continue(())
    }
}

fn error_of(e: ApiError, reference: Option<String>) -> ServerFrame {
    ErrorFrame::new(e.code, e.message).with_ref(reference).into()
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    pub(super) async fn protocol_error(&mut self, reference: Option<String>, message: &str) -> Flow {
        self.send_frame(ErrorFrame::new(ErrorCode::BadRequest, message).with_ref(reference)).await;
        self.strikes.protocol()
    }

    pub(super) async fn on_send(&mut self, s: SendFrame) -> Flow {
        metrics::counter!("herald_sends_received_total", "transport" => "ws").increment(1);
        let ingress = self.env.ingress.clone();
        // A frame carries no trace context: a traced WebSocket send is a trace's root.
        let mut span = SendSpan::start(&ingress.tracer, "ws", &self.claims.tid, None);
        span.describe(&s.conv, &s.cmid);
        if let Err(e) = ingress.validate_send(&s.cmid, &s.conv, &s.body) {
            span.fail(e.code);
            self.send_frame(error_of(e, Some(s.cmid))).await;
            return ControlFlow::Continue(());
        }
        // The device's bucket, then the tenant's (gateway.tenant_send_rate).
        if let Err(wait) =
            crate::limits::take(&self.send_bucket, 1).and_then(|()| self.env.limits.tenant_send(&self.claims.tid))
        {
            span.fail(ErrorCode::RateLimited);
            metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
            let f = ErrorFrame::new(ErrorCode::RateLimited, "too many sends; retry later")
                .with_ref(Some(s.cmid))
                .retry_after(wait.as_millis().max(1) as u64);
            self.send_frame(f).await;
            return self.strikes.rate_limited(Instant::now());
        }
        let started = std::time::Instant::now();
        // Enqueued here, in arrival order; the commit is awaited in a task.
        match ingress.enqueue_send(&self.claims, s.cmid.clone(), s.conv, s.body, span.context()) {
            Err(e) => {
                span.fail(e.code);
                self.send_frame(error_of(e, Some(s.cmid))).await;
            }
            Ok(waiter) => {
                self.requests.spawn(async move {
                    let answer = ingress.committed(waiter, "ws").await;
                    span.finish(&answer);
                    let frame = match answer {
                        Ok(r) => Sent::new(s.cmid, &r).into(),
                        Err(e) => error_of(e, Some(s.cmid)),
                    };
                    metrics::histogram!("herald_send_ack_seconds", "transport" => "ws")
                        .record(started.elapsed().as_secs_f64());
                    Some(frame)
                });
            }
        }
        ControlFlow::Continue(())
    }

    /// `sync` and `read` take from the device's request bucket like sends: each costs a
    /// MySQL read or a stream entry.
    pub(super) async fn limit_request(&mut self, what: &'static str, reference: Option<String>) -> Option<Flow> {
        let wait = crate::limits::take(&self.send_bucket, 1).err()?;
        metrics::counter!("herald_rate_limited_total", "what" => what).increment(1);
        let f = ErrorFrame::new(ErrorCode::RateLimited, format!("too many {what} requests; retry later"))
            .with_ref(reference)
            .retry_after(wait.as_millis().max(1) as u64);
        self.send_frame(f).await;
        Some(self.strikes.rate_limited(Instant::now()))
    }

    pub(super) async fn on_sync(&mut self, s: SyncFrame) -> Flow {
        if let Some(flow) = self.limit_request("sync", s.reference.clone()).await {
            return flow;
        }
        let limit = s.limit.unwrap_or(100).clamp(1, 1_000);
        let history = self.env.history.clone();
        let (tenant, user, device) = (self.claims.tid.clone(), self.claims.sub.clone(), self.claims.dev.clone());
        self.requests.spawn(async move {
            Some(match history.conversation(&tenant, &user, &device, &s.conv, s.after_seq, limit).await {
                Ok(p) => History {
                    conv: s.conv,
                    items: p.items,
                    more: p.more,
                    reference: s.reference,
                    joined_seq: p.joined_seq,
                    start_seq: p.start_seq,
                }
                .into(),
                Err(e) => error_of(e, s.reference),
            })
        });
        ControlFlow::Continue(())
    }

    pub(super) async fn on_read(&mut self, r: ReadFrame) -> Flow {
        if let Some(flow) = self.limit_request("read", None).await {
            return flow;
        }
        let ingress = self.env.ingress.clone();
        match ingress.enqueue_read(&self.claims, r.conv, r.seq) {
            Err(e) => {
                self.send_frame(error_of(e, None)).await;
            }
            Ok(waiter) => {
                // Success has no frame of its own (the other devices get `read`).
                self.requests.spawn(async move { ingress.outcome(waiter).await.err().map(|e| error_of(e, None)) });
            }
        }
        ControlFlow::Continue(())
    }

    /// A request's answer is ready.
    pub(super) async fn on_answer(&mut self, answer: Result<Option<ServerFrame>, JoinError>) -> Flow {
        if let Ok(Some(frame)) = answer {
            if !self.send_frame(frame).await {
                return ControlFlow::Break(End::Gone);
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_strikes_count_within_a_sliding_window() {
        let mut s = Strikes::default();
        for _ in 0..MAX_RATE_LIMITED - 1 {
            assert!(s.rate_limited(Instant::now()).is_continue());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // 99 refusals spread over 99 s: the oldest have left the window.
        assert!(s.rate_limited(Instant::now()).is_continue(), "a long session refused now and then is not closed");
        for _ in 0..MAX_RATE_LIMITED - 1 {
            let _ = s.rate_limited(Instant::now());
        }
        assert!(s.rate_limited(Instant::now()).is_break(), "100 refusals within a minute close it");
    }

    #[test]
    fn the_tenth_protocol_error_closes() {
        let mut s = Strikes::default();
        for _ in 0..MAX_PROTOCOL_ERRORS - 1 {
            assert!(s.protocol().is_continue());
        }
        assert!(matches!(s.protocol(), ControlFlow::Break(End::Close(CloseCode::Protocol, _))));
    }
}
