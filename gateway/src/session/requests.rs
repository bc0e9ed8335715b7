//! The device's requests: `send` (enqueued in arrival order, answered after COMMIT),
//! `sync` (a page of history from MySQL) and `read` (a read receipt). Their answers are
//! awaited in tasks the session tracks and aborts when it ends; the loop writes them.
//! Malformed frames and refused requests count as strikes.

use std::ops::ControlFlow;

use axum::extract::ws::Message;
use futures::{Sink, Stream};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{CloseCode, ErrorFrame, History, ReadFrame, SendFrame, Sent, ServerFrame, SyncFrame};
use tokio::task::JoinError;

use super::{End, Flow, Session};
use crate::error::ApiError;

/// Protocol errors tolerated before the connection is closed with 4009.
const MAX_PROTOCOL_ERRORS: u32 = 10;
/// Rate-limited requests tolerated before the connection is closed with 4008.
const MAX_RATE_LIMITED: u32 = 100;

/// Misbehaviour counted over the session.
#[derive(Debug, Default)]
pub(super) struct Strikes {
    protocol: u32,
    rate_limited: u32,
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
    fn rate_limited(&mut self) -> Flow {
        self.rate_limited += 1;
        if self.rate_limited >= MAX_RATE_LIMITED {
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
        let ingress = self.env.ingress.clone();
        if let Err(e) = ingress.validate_send(&s.cmid, &s.conv, &s.body) {
            self.send_frame(error_of(e, Some(s.cmid))).await;
            return ControlFlow::Continue(());
        }
        // The device's bucket, then the tenant's (gateway.tenant_send_rate).
        if let Err(wait) =
            crate::limits::take(&self.send_bucket, 1).and_then(|()| self.env.limits.tenant_send(&self.claims.tid))
        {
            metrics::counter!("herald_rate_limited_total", "what" => "send").increment(1);
            let f = ErrorFrame::new(ErrorCode::RateLimited, "too many sends; retry later")
                .with_ref(Some(s.cmid))
                .retry_after(wait.as_millis().max(1) as u64);
            self.send_frame(f).await;
            return self.strikes.rate_limited();
        }
        let started = std::time::Instant::now();
        // Enqueued here, in arrival order; the commit is awaited in a task.
        match ingress.enqueue_send(&self.claims, s.cmid.clone(), s.conv, s.body.get().to_owned()).await {
            Err(e) => {
                self.send_frame(error_of(e, Some(s.cmid))).await;
            }
            Ok(waiter) => {
                self.requests.spawn(async move {
                    let frame = match ingress.committed(waiter).await {
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

    pub(super) fn on_sync(&mut self, s: SyncFrame) -> Flow {
        let limit = s.limit.unwrap_or(100).clamp(1, 1_000);
        let history = self.env.history.clone();
        let (tenant, user) = (self.claims.tid.clone(), self.claims.sub.clone());
        self.requests.spawn(async move {
            Some(match history.conversation(&tenant, &user, &s.conv, s.after_seq, limit).await {
                Ok(p) => History { conv: s.conv, items: p.items, more: p.more, reference: s.reference }.into(),
                Err(e) => error_of(e, s.reference),
            })
        });
        ControlFlow::Continue(())
    }

    pub(super) async fn on_read(&mut self, r: ReadFrame) -> Flow {
        let ingress = self.env.ingress.clone();
        match ingress.enqueue_read(&self.claims, r.conv, r.seq).await {
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
