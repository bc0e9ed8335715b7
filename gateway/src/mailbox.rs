//! A session's mailbox: the realtime pushes, control messages and ephemeral frames
//! (typing, presence) the node hands it.
//!
//! Its queues are allocated when something arrives and released when emptied, so an
//! idle session holds none. The two tokio channels it replaced allocated a 32-slot block
//! each at creation, next to their cache-padded headers: about 4 KiB per session, idle
//! or not (docs/benchmarks.md, idle session memory).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use herald_shared::ids::MsgId;
use herald_shared::protocol::{DeliveryStatus, ReadPosition};

/// A realtime push: the frame's bytes are allocated once per node and shared
/// (reference counted) by every session that writes them.
#[derive(Debug, Clone)]
pub struct Push {
    pub id: MsgId,
    pub frame: axum::extract::ws::Utf8Bytes,
    /// When it came in on the node channel: the start of its realtime latency.
    pub arrived: tokio::time::Instant,
}

/// What an ephemeral frame is: a session shows only the kinds it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EphemeralKind {
    Typing,
    Presence,
}

/// A typing or presence frame, serialized once per node. Never stored: one that finds
/// the session's queue full is dropped (counted), and nothing reads it again.
#[derive(Debug, Clone)]
pub struct Ephemeral {
    pub kind: EphemeralKind,
    pub frame: axum::extract::ws::Utf8Bytes,
}

/// Control messages to a session.
#[derive(Debug)]
pub enum Control {
    /// A newer session of the same device exists (close 4002).
    Replaced,
    /// Tokens of the session's user or device issued before this time (seconds) are
    /// revoked: the session closes (4004) if its token is one.
    Revoked(u64),
    /// A read position to show; kept in Redis until a pong confirms it.
    Read(ReadPosition),
    /// A delivery status of the user's own messages (not kept: a lost one is
    /// superseded by the next, and history has the counts).
    Status(DeliveryStatus),
}

/// Control messages queued at most. A full queue loses nothing: read positions wait in
/// Redis for the next session, and a kick that finds it full finds a session that has
/// not read its queue for a long while (the heartbeat closes it).
const CONTROL_CAPACITY: usize = 1_024;

#[derive(Debug)]
pub struct Mailbox {
    queues: Mutex<Queues>,
    /// Pushes queued at most (`gateway.realtime_queue`).
    push_capacity: usize,
    /// Ephemeral frames queued at most (`gateway.ephemeral_queue`).
    ephemeral_capacity: usize,
}

#[derive(Debug, Default)]
struct Queues {
    pushes: VecDeque<Push>,
    control: VecDeque<Control>,
    ephemeral: VecDeque<Ephemeral>,
    /// A push was dropped because the queue was full, or the node lost some: the
    /// session reads its pending set again, where they still are.
    lagged: bool,
    /// The session's task, when it waits for mail.
    waker: Option<Waker>,
}

impl Mailbox {
    pub fn new(push_capacity: usize, ephemeral_capacity: usize) -> Mailbox {
        Mailbox { queues: Mutex::new(Queues::default()), push_capacity, ephemeral_capacity }
    }

    /// Queues an ephemeral frame; false when the queue was full and it was dropped.
    /// Nothing is marked: a lost typing or presence frame is not read again.
    pub fn ephemeral(&self, e: Ephemeral) -> bool {
        self.deliver(|q| {
            if q.ephemeral.len() >= self.ephemeral_capacity {
                return false;
            }
            q.ephemeral.push_back(e);
            true
        })
    }

    /// Queues a push; false when the queue was full: the session is marked lagged.
    pub fn push(&self, push: Push) -> bool {
        self.deliver(|q| {
            if q.pushes.len() >= self.push_capacity {
                q.lagged = true;
                return false;
            }
            q.pushes.push_back(push);
            true
        })
    }

    /// Queues a control message; false when the queue was full.
    pub fn control(&self, c: Control) -> bool {
        self.deliver(|q| {
            if q.control.len() >= CONTROL_CAPACITY {
                return false;
            }
            q.control.push_back(c);
            true
        })
    }

    /// Makes the session read its pending set again.
    pub fn mark_lagged(&self) {
        self.deliver(|q| {
            q.lagged = true;
            true
        });
    }

    /// Whether the session must read its pending set again (and clears it).
    pub fn take_lagged(&self) -> bool {
        std::mem::take(&mut self.queues.lock().expect("mailbox").lagged)
    }

    /// Ready while the session must read its pending set again (see [`Self::take_lagged`]).
    pub fn lagged(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| self.poll_with(cx, |q| q.lagged.then_some(())))
    }

    /// The next control message.
    pub fn next_control(&self) -> impl Future<Output = Control> + '_ {
        poll_fn(|cx| self.poll_with(cx, |q| take_front(&mut q.control)))
    }

    /// The next push.
    pub fn next_push(&self) -> impl Future<Output = Push> + '_ {
        poll_fn(|cx| self.poll_with(cx, |q| take_front(&mut q.pushes)))
    }

    /// The next push if one is queued now, without waiting.
    pub fn try_push(&self) -> Option<Push> {
        take_front(&mut self.queues.lock().expect("mailbox").pushes)
    }

    /// The next ephemeral frame.
    pub fn next_ephemeral(&self) -> impl Future<Output = Ephemeral> + '_ {
        poll_fn(|cx| self.poll_with(cx, |q| take_front(&mut q.ephemeral)))
    }

    /// Changes the queues under the lock, then wakes the session (outside the lock).
    fn deliver(&self, change: impl FnOnce(&mut Queues) -> bool) -> bool {
        let (changed, waker) = {
            let mut q = self.queues.lock().expect("mailbox");
            let changed = change(&mut q);
            (changed, if changed { q.waker.take() } else { None })
        };
        if let Some(w) = waker {
            w.wake();
        }
        changed
    }

    fn poll_with<T>(&self, cx: &mut Context<'_>, take: impl FnOnce(&mut Queues) -> Option<T>) -> Poll<T> {
        let mut q = self.queues.lock().expect("mailbox");
        if let Some(item) = take(&mut q) {
            return Poll::Ready(item);
        }
        match &q.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => q.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// The oldest item; an emptied queue gives its memory back.
fn take_front<T>(queue: &mut VecDeque<T>) -> Option<T> {
    let item = queue.pop_front()?;
    if queue.is_empty() {
        *queue = VecDeque::new();
    }
    Some(item)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::extract::ws::Utf8Bytes;

    use super::*;

    fn push(id: u64) -> Push {
        Push { id: MsgId(id), frame: Utf8Bytes::from_static("{}"), arrived: tokio::time::Instant::now() }
    }

    #[tokio::test]
    async fn a_full_queue_drops_the_push_and_marks_the_session_lagged() {
        let m = Mailbox::new(2, 1);
        assert!(m.push(push(1)) && m.push(push(2)));
        assert!(!m.take_lagged());
        assert!(!m.push(push(3)), "the third does not fit");
        assert!(m.take_lagged() && !m.take_lagged(), "lagged once, then cleared");
        assert_eq!(m.next_push().await.id, MsgId(1));
        assert!(m.push(push(4)), "room again");
        assert_eq!((m.next_push().await.id, m.next_push().await.id), (MsgId(2), MsgId(4)));
    }

    #[tokio::test]
    async fn a_full_ephemeral_queue_drops_the_frame_and_leaves_pushes_alone() {
        let m = Mailbox::new(2, 1);
        let typing = || Ephemeral { kind: EphemeralKind::Typing, frame: Utf8Bytes::from_static("{}") };
        assert!(m.ephemeral(typing()));
        assert!(!m.ephemeral(typing()), "the second does not fit");
        assert!(!m.take_lagged(), "a dropped ephemeral frame is not read again");
        assert!(m.push(push(1)), "pushes have their own queue");
        assert_eq!(m.next_ephemeral().await.kind, EphemeralKind::Typing);
        assert!(m.ephemeral(typing()), "room again");
    }

    #[tokio::test]
    async fn emptied_queues_hold_no_memory() {
        let m = Mailbox::new(1_024, 8);
        for i in 0..100 {
            m.push(push(i));
        }
        m.control(Control::Replaced);
        for _ in 0..100 {
            m.next_push().await;
        }
        assert!(matches!(m.next_control().await, Control::Replaced));
        let q = m.queues.lock().unwrap();
        assert_eq!((q.pushes.capacity(), q.control.capacity()), (0, 0));
    }

    #[tokio::test]
    async fn a_waiting_session_is_woken_by_mail_and_by_a_lag() {
        let m = Arc::new(Mailbox::new(8, 8));
        let waiting = tokio::spawn({
            let m = m.clone();
            async move { m.next_control().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(m.control(Control::Replaced));
        let c = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        assert!(matches!(c, Control::Replaced));
        // A lag wakes a session waiting for pushes, so it reads its pending set.
        let waiting = tokio::spawn({
            let m = m.clone();
            async move {
                tokio::select! {
                    p = m.next_push() => Some(p.id),
                    _ = m.lagged() => None,
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        m.mark_lagged();
        let woke = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        assert_eq!(woke, None);
    }
}
