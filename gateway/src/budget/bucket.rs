//! The node's backlog bucket: a token bucket whose rate the [`super::BudgetController`]
//! changes while sessions take from it (governor's limiters have a fixed quota).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Backlog messages per second for the whole node, at a rate that can change.
///
/// It holds a tenth of a second at its current rate plus one desktop page, as the fixed
/// bucket did, so a cut also shrinks what can leave at once.
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
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
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
        let bucket = Bucket { tokens: burst, rate: f64::from(rate), burst, last: Instant::now() };
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
    }

    /// Takes `n` tokens now, or says how long until they would be there (taking none).
    /// More than the bucket ever holds is let through rather than stalled forever.
    pub fn take(&self, n: usize) -> Result<(), Duration> {
        let n = n.max(1) as f64;
        let mut b = self.bucket.lock().expect("backlog budget");
        b.refill(Instant::now());
        if n > b.burst {
            return Ok(());
        }
        if b.tokens >= n {
            b.tokens -= n;
            self.taken.fetch_add(n as u64, Ordering::Relaxed);
            return Ok(());
        }
        Err(Duration::from_secs_f64((n - b.tokens) / b.rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn takes_while_tokens_last_then_says_when() {
        let b = BacklogBudget::new(1_000, 50);
        // 100 (a tenth of a second) + 50 (a page).
        assert_eq!(b.take(150), Ok(()));
        assert_eq!(b.take(10), Err(Duration::from_millis(10)));
        assert_eq!((b.taken(), b.taken()), (150, 0), "what was taken, once");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(b.take(10), Ok(()));
        // More than it ever holds goes through.
        assert_eq!(b.take(151), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_refills_at_that_rate_and_shrinks_the_bucket() {
        let b = BacklogBudget::new(10_000, 0);
        b.set_rate(100);
        assert_eq!(b.rate(), 100);
        // The bucket now holds 10; the 1 000 it had are cut down to that.
        assert_eq!(b.take(10), Ok(()));
        assert_eq!(b.take(5), Err(Duration::from_millis(50)));
        b.set_rate(1_000);
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(b.take(5), Ok(()), "five tokens in 5 ms at the new rate");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_settles_for_what_was_used() {
        let b = BacklogBudget::new(1_000, 50);
        assert_eq!(b.take(150), Ok(()));
        b.settle(150, 10);
        assert_eq!(b.taken(), 10, "only what was used counts as taken");
        assert_eq!(b.take(140), Ok(()), "the tokens not used are there again");
        b.settle(0, 20);
        assert_eq!(b.taken(), 160, "more than reserved is taken too");
        assert_eq!(b.take(1), Err(Duration::from_millis(21)), "in debt: 20 to pay off, then 1");
    }
}
