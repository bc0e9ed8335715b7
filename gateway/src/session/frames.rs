//! The socket's side of a session: frames read from the device (each dispatched to its
//! handler, a bad one answered with the protocol's error) and frames written to it,
//! every write with a deadline.

use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use futures::{Sink, SinkExt, Stream};
use herald_shared::protocol::{ClientFrame, ErrorFrame, ServerFrame};
use tokio::time::Instant;

use super::{End, Flow, Session};
use crate::meters;

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    pub(super) async fn on_socket(&mut self, msg: Option<Result<Message, E>>) -> Flow {
        let Some(Ok(msg)) = msg else { return ControlFlow::Break(End::Gone) };
        let now = Instant::now();
        self.heartbeat.seen(now);
        match msg {
            Message::Text(t) => self.on_frame(t.as_str()).await,
            Message::Pong(_) => {
                self.heartbeat.pong(now, &mut self.inflight);
                self.confirm_reads().await;
                ControlFlow::Continue(())
            }
            Message::Close(_) => ControlFlow::Break(End::Gone),
            Message::Binary(_) => self.protocol_error(None, "binary frames are not supported").await,
            Message::Ping(_) => ControlFlow::Continue(()),
        }
    }

    pub(super) async fn on_frame(&mut self, text: &str) -> Flow {
        let max_frame = self.env.cfg.gateway.max_body_bytes * 2 + 4096;
        if text.len() > max_frame {
            let message = format!("frame is {} bytes; the limit is {max_frame}", text.len());
            self.send_frame(ErrorFrame::new(herald_shared::error::ErrorCode::TooLarge, message)).await;
            return self.strikes.protocol();
        }
        let frame = match ClientFrame::parse(text) {
            Ok(f) => f,
            Err(e) => {
                metrics::counter!("herald_frames_in_total", "type" => "invalid").increment(1);
                return self.protocol_error(e.reference, &e.message).await;
            }
        };
        meters::frame_in(frame.kind());
        match frame {
            ClientFrame::Ping(p) => {
                let ts = p.ts.unwrap_or_else(herald_shared::ids::now_ms);
                self.send_frame(herald_shared::protocol::Pong { ts }).await;
                ControlFlow::Continue(())
            }
            ClientFrame::Ack(a) => self.on_ack(a.ids).await,
            ClientFrame::Send(s) => self.on_send(s).await,
            ClientFrame::Sync(s) => self.on_sync(s).await,
            ClientFrame::Read(r) => self.on_read(r).await,
            ClientFrame::Refresh(f) => self.on_refresh(f).await,
            ClientFrame::Typing(t) => self.on_typing(t).await,
            ClientFrame::PresenceSubscribe(p) => self.on_presence_subscribe(p).await,
            ClientFrame::Auth(f) => {
                let why = "auth must be the first frame, and only without a token at the upgrade";
                self.protocol_error(f.reference, why).await
            }
        }
    }

    /// Writes a text frame; false when the socket is gone or stalled.
    pub(super) async fn write(&mut self, text: Utf8Bytes) -> bool {
        meters::FRAMES_OUT.increment(1);
        self.send_message(Message::Text(text)).await
    }

    /// Puts a text frame in the socket's buffer without writing it out: frames fed one
    /// after another go out in one write at the next [`Self::flush`] (or the next
    /// [`Self::write`]). False when the socket is gone or stalled.
    pub(super) async fn feed(&mut self, text: Utf8Bytes) -> bool {
        meters::FRAMES_OUT.increment(1);
        if self.stalled {
            return false;
        }
        let deadline = Duration::from_millis(self.env.cfg.gateway.write_timeout_ms);
        let fed = tokio::time::timeout(deadline, self.socket.feed(Message::Text(text))).await;
        self.met_deadline(fed)
    }

    /// Writes out the frames fed since the last write; false when the socket is gone or
    /// stalled.
    pub(super) async fn flush(&mut self) -> bool {
        if self.stalled {
            return false;
        }
        let deadline = Duration::from_millis(self.env.cfg.gateway.write_timeout_ms);
        let flushed = tokio::time::timeout(deadline, self.socket.flush()).await;
        self.met_deadline(flushed)
    }

    /// Every write has a deadline: a peer that stops reading (a half-open connection
    /// whose buffers filled) must not hold the session, and its slots, forever. Once
    /// one write missed it, the session is over: later writes (the rest of a backlog
    /// page, answers) fail at once instead of waiting a deadline each.
    pub(super) async fn send_message(&mut self, m: Message) -> bool {
        if self.stalled {
            return false;
        }
        let deadline = Duration::from_millis(self.env.cfg.gateway.write_timeout_ms);
        let sent = tokio::time::timeout(deadline, self.socket.send(m)).await;
        self.met_deadline(sent)
    }

    /// Whether a write under its deadline went through; one that missed it marks the
    /// session stalled.
    fn met_deadline<T, W>(&mut self, written: Result<Result<T, W>, tokio::time::error::Elapsed>) -> bool {
        match written {
            Ok(written) => written.is_ok(),
            Err(_) => {
                metrics::counter!("herald_write_timeouts_total").increment(1);
                self.stalled = true;
                false
            }
        }
    }

    pub(super) async fn ping(&mut self) {
        self.send_message(Message::Ping(Default::default())).await;
    }

    pub(super) async fn send_frame(&mut self, frame: impl Into<ServerFrame>) -> bool {
        self.write(frame.into().to_json().into()).await
    }
}
