//! How a session ends: the node's drain (`reconnect`, a moment for the acks in flight,
//! 4003, then the frames the device sent before it saw the close), then the close and
//! what the session leaves recorded.
//!
//! While draining, nothing the device sends is dropped unanswered: acks and read
//! positions are applied (even those arriving after the close frame went out: the device
//! sent them before it saw it), other requests are answered `unavailable` (the device
//! resends them, with their keys, to the node it reconnects to).

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message};
use futures::{Sink, SinkExt, Stream, StreamExt};
use herald_shared::error::ErrorCode;
use herald_shared::protocol::{ClientFrame, CloseCode, ErrorFrame, Reconnect};
use tokio::time::Instant;

use super::{End, Session};
use crate::sessions::SessionRegistry;

/// How long an ending session waits for its last acks' removals.
const FINAL_ACKS_WAIT: Duration = Duration::from_secs(2);

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// Server shutdown: tell the client when to come back (spread over the drain
    /// period), give it a moment to ack what is in flight, then close with 4003.
    pub(super) async fn drain(&mut self) -> End {
        let drain_ms = self.env.cfg.gateway.drain_ms;
        let after_ms = rand::random::<u64>() % drain_ms.max(1);
        self.send_frame(Reconnect { after_ms }).await;
        let deadline = Instant::now() + Duration::from_millis(drain_ms.min(2_000));
        while !self.inflight.is_empty() {
            match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => self.on_draining_frame(t.as_str(), true).await,
                Ok(Some(Ok(_))) => {}
                _ => break,
            }
        }
        End::Close(CloseCode::Draining, "server draining; reconnect")
    }

    /// A frame while the node drains: acks and reads applied, the rest refused with
    /// `unavailable` while an answer can still be written (`open`).
    async fn on_draining_frame(&mut self, text: &str, open: bool) {
        let refused = |reference: Option<String>| {
            ErrorFrame::new(ErrorCode::Unavailable, "server draining; reconnect and send again").with_ref(reference)
        };
        let answer = match ClientFrame::parse(text) {
            Ok(ClientFrame::Ack(a)) => {
                let _ = self.on_ack(a.ids).await;
                None
            }
            Ok(ClientFrame::Read(r)) => {
                // Enqueued now (the worker applies it); an enqueue that fails answers
                // with an error while the socket is open.
                let _ = self.on_read(r).await;
                None
            }
            Ok(ClientFrame::Send(s)) => Some(refused(Some(s.cmid))),
            Ok(ClientFrame::Sync(s)) => Some(refused(s.reference)),
            Ok(_) => None,
            Err(e) => Some(refused(e.reference)),
        };
        if let Some(frame) = answer.filter(|_| open) {
            self.send_frame(frame).await;
        }
    }

    /// After the drain's close frame: what the device sent before it saw it, until its
    /// own close (bounded).
    async fn read_until_closed(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(Ok(m))) = tokio::time::timeout_at(deadline, self.socket.next()).await {
            match m {
                Message::Text(t) => self.on_draining_frame(t.as_str(), false).await,
                Message::Close(_) => break,
                _ => {}
            }
        }
    }

    /// Closes the socket (with a code when the server ends the session), then records
    /// what the session leaves: its acks, its watermark, its presence gone.
    pub(super) async fn finish(&mut self, end: End, directory: &SessionRegistry) {
        metrics::counter!("herald_sessions_closed_total", "reason" => end.reason()).increment(1);
        if let End::Close(code, reason) = end {
            let close = Message::Close(Some(CloseFrame { code: code.code(), reason: reason.into() }));
            // Bounded: a stalled peer does not get the write deadline again.
            let sent = tokio::time::timeout(Duration::from_secs(2), self.socket.send(close)).await;
            if code == CloseCode::Draining && matches!(sent, Ok(Ok(()))) {
                self.read_until_closed().await;
            }
        }
        let last_of_user = directory.unregister(&self.device, &self.id);
        // The node's ack writer records the last acks whatever happens to the session;
        // waiting (bounded) for them lets a device that comes straight back find them gone.
        match self.hand_acks() {
            Ok(()) => {
                let _ = tokio::time::timeout(FINAL_ACKS_WAIT, self.ack_tally.cleared()).await;
            }
            Err(e) => tracing::warn!(error = %e, "final acks not handed over; those messages will be pushed again"),
        }
        self.report_watermark().await;
        self.env.watchers.forget(&self.device, &self.id);
        let successor = directory.successor(&self.device, &self.id);
        let successor = successor.as_ref().map(|(session, statuses)| (session.as_str(), *statuses));
        if self.presence.give_up(self.env.redis.next(), successor).await {
            self.env.roster.disconnected(&self.device.tenant, &self.device.user).await;
        }
        if last_of_user {
            self.presence.leave_node(self.env.redis.next(), &self.env.keys).await;
        }
    }
}
