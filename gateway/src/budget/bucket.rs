//! The node's backlog bucket: a token bucket whose rate the [`super::BudgetController`]
//! changes while sessions take from it (governor's limiters have a fixed quota), with
//! a line of the sessions waiting for it, served in the order they came.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::turn::{self, Turn};

/// Backlog messages per second for the whole node, at a rate that can change.
///
/// It holds a tenth of a second at its current rate plus one desktop page, as the fixed
/// bucket did, so a cut also shrinks what can leave at once. A session it cannot serve
/// at once joins its line and is woken when its turn is served: by the controller's
/// probe (every 10 ms), or by whoever takes or settles first. A rate cut holds the line
/// back at once, and a raise moves it on at once, because turns hold no time, only a
/// place.
#[derive(Debug)]
pub struct BacklogBudget {
    bucket: Mutex<Bucket>,
    /// The rate, readable without the lock (the gauge, tests).
    rate: AtomicU32,
    /// Tokens above a tenth of a second's worth: one page always fits.
    page: u32,
    /// Tokens taken since the controller last looked: how much of the budget is used.
    taken: AtomicU64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    last: Instant,
    /// Sessions waiting, in the order they came.
    line: VecDeque<Arc<Turn>>,
    /// The tokens the line asks for.
    queued: f64,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes the tokens of the turns at the front of the line while they are there;
    /// the wakers of the turns served go into `woken`.
    fn serve_line(&mut self, woken: &mut Vec<Waker>) -> u64 {
        let mut taken = 0;
        while let Some(front) = self.line.front() {
            let n = front.tokens() as f64;
            if !turn::is_abandoned(front) {
                // More than the bucket ever holds is let through rather than stalled.
                if n <= self.burst && self.tokens < n {
                    break;
                }
                if n <= self.burst {
                    self.tokens -= n;
                }
                taken += front.tokens() as u64;
                woken.extend(front.serve());
            }
            self.queued -= n;
            self.line.pop_front();
        }
        taken
    }
}

fn burst(rate: u32, page: u32) -> f64 {
    f64::from(rate / 10) + f64::from(page)
}

impl BacklogBudget {
    /// A full bucket of `rate` per second.
    pub fn new(rate: u32, page: u32) -> BacklogBudget {
        let rate = rate.max(1);
        let burst = burst(rate, page);
        let bucket = Bucket {
            tokens: burst,
            rate: f64::from(rate),
            burst,
            last: Instant::now(),
            line: VecDeque::new(),
            queued: 0.0,
        };
        BacklogBudget { bucket: Mutex::new(bucket), rate: AtomicU32::new(rate), page, taken: AtomicU64::new(0) }
    }

    /// Messages per second now.
    pub fn rate(&self) -> u32 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Changes the rate from now on; what was earned at the old rate is kept, up to
    /// what the bucket holds at the new one.
    pub fn set_rate(&self, rate: u32) {
        let rate = rate.max(1);
        let mut b = self.bucket.lock().expect("backlog budget");
        b.refill(Instant::now());
        b.rate = f64::from(rate);
        b.burst = burst(rate, self.page);
        b.tokens = b.tokens.min(b.burst);
        self.rate.store(rate, Ordering::Relaxed);
        self.serve_locked(b);
    }

    /// Serves the line as far as the tokens go and wakes the sessions served.
    pub fn serve(&self) {
        let mut b = self.bucket.lock().expect("backlog budget");
        b.refill(Instant::now());
        self.serve_locked(b);
    }

    fn serve_locked(&self, mut b: std::sync::MutexGuard<'_, Bucket>) {
        let mut woken = Vec::new();
        let taken = b.serve_line(&mut woken);
        self.release(b, taken, woken);
    }

    /// Lets the bucket go, counts what was taken under it, then wakes the sessions
    /// served (outside the lock).
    fn release(&self, b: std::sync::MutexGuard<'_, Bucket>, taken: u64, woken: Vec<Waker>) {
        drop(b);
        self.taken.fetch_add(taken, Ordering::Relaxed);
        woken.into_iter().for_each(Waker::wake);
    }

    /// Tokens taken since the last call.
    pub fn taken(&self) -> u64 {
        self.taken.swap(0, Ordering::Relaxed)
    }

    /// Settles a reservation of `reserved` tokens of which `used` were used: what was
    /// not is given back (up to what the bucket holds), more is taken, into debt if need
    /// be (the next takes wait until it is paid off).
    pub fn settle(&self, reserved: usize, used: usize) {
        if reserved == used {
            return;
        }
        let mut b = self.bucket.lock().expect("backlog budget");
        b.refill(Instant::now());
        b.tokens = (b.tokens + reserved as f64 - used as f64).min(b.burst);
        let _ = self.taken.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            Some((t + used as u64).saturating_sub(reserved as u64))
        });
        // Tokens given back go to the line.
        self.serve_locked(b);
    }

    /// Takes `n` tokens now when nobody waits and they are there; otherwise the caller
    /// joins the line: its turn, and about how long until it is served at today's
    /// rate. More than the bucket ever holds is let through rather than stalled forever.
    pub fn take_or_wait(&self, n: usize) -> Result<(), (Arc<Turn>, Duration)> {
        let n = n.max(1);
        let mut b = self.bucket.lock().expect("backlog budget");
        b.refill(Instant::now());
        let mut woken = Vec::new();
        let mut taken = b.serve_line(&mut woken);
        let wanted = n as f64;
        let result = if b.line.is_empty() && (wanted > b.burst || b.tokens >= wanted) {
            if wanted <= b.burst {
                b.tokens -= wanted;
            }
            taken += n as u64;
            Ok(())
        } else {
            let turn = Arc::new(Turn::new(n));
            b.line.push_back(turn.clone());
            b.queued += wanted;
            Err((turn, Duration::from_secs_f64((b.queued - b.tokens).max(0.0) / b.rate)))
        };
        self.release(b, taken, woken);
        result
    }

    /// About how long until the whole line is served at today's rate: a turn not yet
    /// served waits at most that long (unless the rate is cut).
    pub fn line_wait(&self) -> Duration {
        let b = self.bucket.lock().expect("backlog budget");
        Duration::from_secs_f64((b.queued - b.tokens).max(0.0) / b.rate)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll, Wake};

    use super::*;

    /// Takes now, or says how long until the tokens are there (the turn let go of).
    fn take(b: &BacklogBudget, n: usize) -> Result<(), Duration> {
        b.take_or_wait(n).map_err(|(_, wait)| wait)
    }

    /// A session's task: counts its wake-ups.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Task {
        fn woken(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Polls the wait for `turn` once from `task`: whether it was served.
    fn poll_served(task: &Arc<Task>, turn: &Option<Arc<Turn>>) -> bool {
        let waker = Waker::from(task.clone());
        let wait = std::pin::pin!(turn::served(turn));
        wait.poll(&mut Context::from_waker(&waker)) == Poll::Ready(())
    }

    /// Joins the line (the bucket must be short) and starts waiting.
    fn queue(b: &BacklogBudget, n: usize) -> (Arc<Task>, Option<Arc<Turn>>, Duration) {
        let (turn, wait) = b.take_or_wait(n).expect_err("the bucket is short");
        let (task, turn) = (Arc::new(Task::default()), Some(turn));
        assert!(!poll_served(&task, &turn), "not served yet");
        (task, turn, wait)
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_sessions_are_served_in_order_and_each_woken_once() {
        let b = BacklogBudget::new(1_000, 0);
        assert_eq!(take(&b, 100), Ok(()), "the bucket emptied");
        let (first, first_turn, wait) = queue(&b, 10);
        assert_eq!(wait, Duration::from_millis(10));
        let (second, second_turn, wait) = queue(&b, 10);
        assert_eq!(wait, Duration::from_millis(20), "behind the first");
        let (third, third_turn, _) = queue(&b, 10);
        tokio::time::advance(Duration::from_millis(10)).await;
        b.serve();
        assert_eq!((first.woken(), second.woken(), third.woken()), (1, 0, 0), "the first alone");
        assert!(poll_served(&first, &first_turn));
        assert_eq!(first_turn.as_ref().map(|t| t.tokens()), Some(10));
        // A newcomer finds tokens (5 ms' worth) but waits behind the line.
        tokio::time::advance(Duration::from_millis(5)).await;
        let (late, late_turn, _) = queue(&b, 5);
        tokio::time::advance(Duration::from_millis(15)).await;
        b.serve();
        assert_eq!((second.woken(), third.woken(), late.woken()), (1, 1, 0), "the next two, in order");
        assert!(poll_served(&second, &second_turn) && poll_served(&third, &third_turn));
        tokio::time::advance(Duration::from_millis(5)).await;
        b.serve();
        b.serve();
        assert_eq!(late.woken(), 1, "woken once, served once");
        assert!(poll_served(&late, &late_turn));
        assert_eq!(b.taken(), 100 + 35, "every turn's tokens taken, once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_ends_leaves_the_line_without_its_tokens() {
        let b = BacklogBudget::new(1_000, 0);
        assert_eq!(take(&b, 100), Ok(()));
        let (_, gone, _) = queue(&b, 50);
        let (waiting, turn, wait) = queue(&b, 10);
        assert_eq!(wait, Duration::from_millis(60), "behind the first");
        drop(gone);
        tokio::time::advance(Duration::from_millis(10)).await;
        b.serve();
        assert_eq!(waiting.woken(), 1, "served at once: the ended session's turn is skipped");
        assert!(poll_served(&waiting, &turn));
        assert_eq!(b.taken(), 100 + 10);
        assert_eq!(b.line_wait(), Duration::ZERO, "nobody waits");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_holds_the_line_back_and_a_raise_moves_it_on() {
        // A page of 50 always fits, at any rate.
        let b = BacklogBudget::new(1_000, 50);
        assert_eq!(take(&b, 150), Ok(()));
        let (task, turn, wait) = queue(&b, 50);
        assert_eq!(wait, Duration::from_millis(50));
        b.set_rate(100);
        tokio::time::advance(Duration::from_millis(50)).await;
        b.serve();
        assert_eq!(task.woken(), 0, "held back by the cut: 5 tokens in 50 ms");
        assert!(!poll_served(&task, &turn));
        b.set_rate(10_000);
        tokio::time::advance(Duration::from_millis(5)).await;
        b.serve();
        assert_eq!(task.woken(), 1, "moved on by the raise");
        assert!(poll_served(&task, &turn));
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_given_back_serve_the_line() {
        let b = BacklogBudget::new(1_000, 0);
        assert_eq!(take(&b, 100), Ok(()));
        let (task, turn, _) = queue(&b, 30);
        b.settle(100, 60);
        assert_eq!(task.woken(), 1, "the 40 not used went to the waiting session");
        assert!(poll_served(&task, &turn));
    }

    #[tokio::test(start_paused = true)]
    async fn takes_while_tokens_last_then_says_when() {
        let b = BacklogBudget::new(1_000, 50);
        // 100 (a tenth of a second) + 50 (a page).
        assert_eq!(take(&b, 150), Ok(()));
        assert_eq!(take(&b, 10), Err(Duration::from_millis(10)));
        assert_eq!((b.taken(), b.taken()), (150, 0), "what was taken, once");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(take(&b, 10), Ok(()));
        // More than it ever holds goes through.
        assert_eq!(take(&b, 151), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_refills_at_that_rate_and_shrinks_the_bucket() {
        let b = BacklogBudget::new(10_000, 0);
        b.set_rate(100);
        assert_eq!(b.rate(), 100);
        // The bucket now holds 10; the 1 000 it had are cut down to that.
        assert_eq!(take(&b, 10), Ok(()));
        assert_eq!(take(&b, 5), Err(Duration::from_millis(50)));
        b.set_rate(1_000);
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(take(&b, 5), Ok(()), "five tokens in 5 ms at the new rate");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_settles_for_what_was_used() {
        let b = BacklogBudget::new(1_000, 50);
        assert_eq!(take(&b, 150), Ok(()));
        b.settle(150, 10);
        assert_eq!(b.taken(), 10, "only what was used counts as taken");
        assert_eq!(take(&b, 140), Ok(()), "the tokens not used are there again");
        b.settle(0, 20);
        assert_eq!(b.taken(), 160, "more than reserved is taken too");
        assert_eq!(take(&b, 1), Err(Duration::from_millis(21)), "in debt: 20 to pay off, then 1");
    }
}
