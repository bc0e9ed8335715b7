//! Read positions shown to the device: pushed ones as they come, stored ones (kept in
//! Redis while the device was away) right after `hello`. A position stays stored until
//! a pong that follows its frame confirms the device has it.

use std::collections::HashMap;

use axum::extract::ws::Message;
use fred::interfaces::HashesInterface;
use futures::{Sink, Stream};
use herald_shared::protocol::{read_field, ReadPosition};
use herald_shared::scripts;

use super::{Session, SessionError};

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// Writes a read position, to be confirmed by the next pong.
    pub(super) async fn show_read(&mut self, position: ReadPosition) {
        self.unconfirmed_reads.push((read_field(&position.conv, &position.user), position.seq));
        self.send_frame(position).await;
    }

    /// Read positions waiting in Redis since the device was last connected: the latest
    /// of each, followed by a ping whose pong confirms them.
    pub(super) async fn send_stored_reads(&mut self) -> Result<(), SessionError> {
        let key = self.env.keys.reads(&self.device.tenant, &self.device.user, &self.device.device);
        let stored: HashMap<String, u64> = self.env.redis.next().hgetall(key).await?;
        if stored.is_empty() {
            return Ok(());
        }
        for (field, seq) in stored {
            if let Some((conv, user)) = field.split_once(' ') {
                self.show_read(ReadPosition { conv: conv.to_owned(), user: user.to_owned(), seq }).await;
            }
        }
        self.ping().await;
        Ok(())
    }

    /// A pong comes after every frame written before its ping: the reads are shown.
    pub(super) async fn confirm_reads(&mut self) {
        if self.unconfirmed_reads.is_empty() {
            return;
        }
        let key = self.env.keys.reads(&self.device.tenant, &self.device.user, &self.device.device);
        let reads = std::mem::take(&mut self.unconfirmed_reads);
        let args: Vec<String> = reads.into_iter().flat_map(|(f, s)| [f, s.to_string()]).collect();
        let _: Result<i64, _> = scripts::READS_CONFIRM.call(self.env.redis.next(), vec![key], args).await;
    }
}
