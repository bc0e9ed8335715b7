//! How a session ends: the node's drain (`reconnect`, a moment for the acks in flight,
//! 4003), then the close and what the session leaves recorded.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message};
use futures::{Sink, SinkExt, Stream, StreamExt};
use herald_shared::protocol::{ClientFrame, CloseCode, Reconnect};
use tokio::time::Instant;

use super::{End, Session};
use crate::sessions::SessionRegistry;

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
                Ok(Some(Ok(Message::Text(t)))) => {
                    if let Ok(ClientFrame::Ack(a)) = ClientFrame::parse(t.as_str()) {
                        let _ = self.on_ack(a.ids).await;
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => break,
            }
        }
        End::Close(CloseCode::Draining, "server draining; reconnect")
    }

    /// Closes the socket (with a code when the server ends the session), then records
    /// what the session leaves: its acks, its watermark, its presence gone.
    pub(super) async fn finish(&mut self, end: End, directory: &SessionRegistry) {
        metrics::counter!("herald_sessions_closed_total", "reason" => end.reason()).increment(1);
        if let End::Close(code, reason) = end {
            let close = Message::Close(Some(CloseFrame { code: code.code(), reason: reason.into() }));
            // Bounded: a stalled peer does not get the write deadline again.
            let _ = tokio::time::timeout(Duration::from_secs(2), self.socket.send(close)).await;
        }
        let last_of_user = directory.unregister(&self.device, &self.id);
        if let Err(e) = self.flush_acks().await {
            tracing::warn!(error = %e, "final acks could not be recorded yet; the node retries them");
            self.leave_acks();
        }
        self.report_watermark().await;
        self.env.watchers.forget(&self.device, &self.id);
        let successor = directory.successor(&self.device, &self.id);
        if self.presence.give_up(self.env.redis.next(), successor.as_deref()).await {
            self.env.roster.disconnected(&self.device.tenant, &self.device.user).await;
        }
        if last_of_user {
            self.presence.leave_node(self.env.redis.next(), &self.env.keys).await;
        }
    }
}
