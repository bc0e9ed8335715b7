//! Wake-ups at a send's due time, to a tenth of a millisecond.
//!
//! tokio's timer wheel ticks in whole milliseconds and rounds a deadline up to the next
//! tick, so a sender sleeping until its due time woke 1.3 ms late at the median, and that
//! lateness counted in every latency measured from the due time (the floor of a 2 ms
//! target). One OS thread keeps the due times of every waiting sender in a heap and
//! sleeps on the OS timer (futex timeouts, about 50 us of slack) until the earliest, then
//! wakes its sender: one thread for all senders, asleep between due times.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::Instant;

use tokio::sync::oneshot;

/// A wake-up asked for: when, and whom to wake.
type Wake = (Instant, oneshot::Sender<()>);

/// The thread that wakes sleepers at their due times.
#[derive(Debug)]
pub struct Pacer {
    asks: mpsc::Sender<Wake>,
}

impl Pacer {
    /// The process's pacer, its thread started on first use.
    pub fn global() -> &'static Pacer {
        static PACER: OnceLock<Pacer> = OnceLock::new();
        PACER.get_or_init(Pacer::start)
    }

    fn start() -> Pacer {
        let (asks, rx) = mpsc::channel::<Wake>();
        std::thread::Builder::new().name("pacer".into()).spawn(move || run(rx)).expect("the pacer thread starts");
        Pacer { asks }
    }

    /// Completes at `t` (at once when it has passed). Dropping the future gives the
    /// wake-up up; the thread then wakes nobody.
    pub async fn sleep_until(&self, t: Instant) {
        if t <= Instant::now() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        if self.asks.send((t, tx)).is_err() {
            // No thread (it cannot stop while the process runs): tokio's timer instead.
            tokio::time::sleep_until(t.into()).await;
            return;
        }
        let _ = rx.await;
    }
}

fn run(rx: mpsc::Receiver<Wake>) {
    let mut due: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut waiting: std::collections::HashMap<u64, oneshot::Sender<()>> = std::collections::HashMap::new();
    let mut order = 0u64;
    loop {
        let now = Instant::now();
        while let Some(Reverse((t, k))) = due.peek().copied() {
            if t > now {
                break;
            }
            due.pop();
            if let Some(tx) = waiting.remove(&k) {
                let _ = tx.send(());
            }
        }
        let asked = match due.peek() {
            Some(Reverse((t, _))) => match rx.recv_timeout(t.saturating_duration_since(now)) {
                Ok(w) => w,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(w) => w,
                Err(_) => return,
            },
        };
        for (t, tx) in std::iter::once(asked).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            order += 1;
            due.push(Reverse((t, order)));
            waiting.insert(order, tx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sleepers_wake_at_their_due_times_in_order() {
        let pacer = Pacer::global();
        let start = Instant::now();
        let dues: Vec<Instant> = [30u64, 10, 20, 10].iter().map(|ms| start + Duration::from_millis(*ms)).collect();
        let woke = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks: Vec<_> = dues
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let woke = woke.clone();
                tokio::spawn(async move {
                    pacer.sleep_until(t).await;
                    let at = Instant::now();
                    woke.lock().unwrap().push((i, at));
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let woke = woke.lock().unwrap().clone();
        for (i, at) in woke.iter() {
            assert!(*at >= dues[*i], "sleeper {i} woke before its due time");
        }
        let order: Vec<usize> = woke.iter().map(|(i, _)| *i).collect();
        assert_eq!(order.last(), Some(&0), "the latest due time wakes last: {order:?}");
        // A past due time completes at once.
        let before = Instant::now();
        pacer.sleep_until(start).await;
        assert!(before.elapsed() < Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_dropped_sleep_wakes_nobody_and_the_next_still_wakes() {
        let pacer = Pacer::global();
        let t = Instant::now() + Duration::from_millis(5);
        drop(tokio::time::timeout(Duration::from_millis(1), pacer.sleep_until(t)).await);
        pacer.sleep_until(t + Duration::from_millis(5)).await;
        assert!(Instant::now() >= t + Duration::from_millis(5));
    }
}
