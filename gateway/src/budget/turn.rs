//! A session's place in the line for the node's backlog budget: served (its tokens
//! taken for it) by the bucket in the order the sessions came, and the session woken
//! then, once.
//!
//! Before the line, a session the bucket could not serve was told how long until the
//! tokens would be there, and so was every other: they all woke at that moment, one
//! took the page's tokens and the rest were told again. A storm of 5 000 devices made
//! about ten such wake-ups per message pushed (docs/benchmarks.md, change 24).

use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
pub struct Turn {
    /// The tokens asked for.
    tokens: usize,
    served: AtomicBool,
    /// The waiting session's task, woken when the turn is served.
    waker: Mutex<Option<Waker>>,
}

impl Turn {
    pub(super) fn new(tokens: usize) -> Turn {
        Turn { tokens, served: AtomicBool::new(false), waker: Mutex::new(None) }
    }

    /// The tokens asked for: taken for the session once it is served.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn is_served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    /// Marks it served; the waker is returned, to be woken outside the bucket's lock.
    pub(super) fn serve(&self) -> Option<Waker> {
        self.served.store(true, Ordering::Release);
        self.waker.lock().expect("turn").take()
    }

    fn poll_served(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_served() {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock().expect("turn");
            match waker.as_ref() {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        // Served between the first look and the waker's registration: not missed.
        if self.is_served() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Completes when the session's turn is served; never without one (a branch of the
/// session's loop that waits for nothing then).
pub fn served(turn: &Option<Arc<Turn>>) -> impl Future<Output = ()> + '_ {
    poll_fn(move |cx| match turn {
        Some(t) => t.poll_served(cx),
        None => Poll::Pending,
    })
}

/// The session let go of its turn (it ended): only the line holds it, and the bucket
/// drops it without taking its tokens.
pub(super) fn is_abandoned(turn: &Arc<Turn>) -> bool {
    Arc::strong_count(turn) == 1
}
