//! The backlog pager: where a session stands in reading its pending set.
//!
//! On connect (and whenever the set must be read again: a dropped push, a new Redis
//! epoch, a presence that vanished) the pending set is read in pages after a cursor,
//! oldest first; each page is pushed and acked before the next is read, and
//! `caught_up` follows the last page's acks. This is the state alone; the session does
//! the Redis and MySQL reads (with the `pending_page` script, exact above 2^53) and
//! paces them with token buckets.

use std::collections::HashSet;

use herald_shared::ids::MsgId;
use tokio::time::Instant;

/// Where the next page starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Nothing read yet: the oldest entry.
    Start,
    /// After this id (which may have been acked and removed since).
    After(MsgId),
    /// Every page was read; `caught_up` follows the last acks.
    End,
}

/// One page to read: up to `want` entries after `after` (`None`: from the start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub after: Option<MsgId>,
    pub want: usize,
}

#[derive(Debug)]
pub struct BacklogPager {
    cursor: Cursor,
    /// Ids of the current page not yet acked.
    outstanding: HashSet<MsgId>,
    /// `caught_up` was sent for this reading.
    done: bool,
    /// Backlog messages acked in this session (across readings).
    delivered: u64,
    page_size: usize,
    /// Pacing: no page before then (realtime keeps flowing meanwhile).
    resume: Option<Instant>,
}

impl BacklogPager {
    pub fn new(page_size: usize) -> BacklogPager {
        BacklogPager {
            cursor: Cursor::Start,
            outstanding: HashSet::new(),
            done: false,
            delivered: 0,
            page_size: page_size.max(1),
            resume: None,
        }
    }

    /// Reads the pending set again from the start; what was delivered stays counted.
    pub fn restart(&mut self) {
        self.cursor = Cursor::Start;
        self.outstanding.clear();
        self.done = false;
    }

    #[cfg(test)]
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next page to read, if one is due: the previous page is acked, the pager is
    /// not paced, and the inflight window has `room`.
    pub fn next_request(&self, now: Instant, room: usize) -> Option<PageRequest> {
        if self.done || !self.outstanding.is_empty() || room == 0 || self.is_paced(now) {
            return None;
        }
        let after = match self.cursor {
            Cursor::Start => None,
            Cursor::After(id) => Some(id),
            Cursor::End => return None,
        };
        Some(PageRequest { after, want: self.page_size.min(room) })
    }

    /// The token buckets said wait.
    pub fn pace_until(&mut self, until: Instant) {
        self.resume = Some(until);
    }

    pub fn resume_at(&self) -> Option<Instant> {
        self.resume
    }

    pub fn resume(&mut self) {
        self.resume = None;
    }

    fn is_paced(&self, now: Instant) -> bool {
        self.resume.is_some_and(|t| t > now)
    }

    /// A page was read: the cursor moves past it, or to the end when it was empty.
    pub fn read(&mut self, page: &[MsgId]) {
        self.cursor = match page.last() {
            Some(last) => Cursor::After(*last),
            None => Cursor::End,
        };
    }

    /// An id of the page was pushed; its ack is awaited before the next page.
    pub fn pushed(&mut self, id: MsgId) {
        self.outstanding.insert(id);
    }

    pub fn is_outstanding(&self, id: MsgId) -> bool {
        self.outstanding.contains(&id)
    }

    /// An ack; true when it was one of the page's.
    pub fn acked(&mut self, id: MsgId) -> bool {
        let was = self.outstanding.remove(&id);
        if was {
            self.delivered += 1;
        }
        was
    }

    /// Every page was read and acked, and `caught_up` is not sent yet.
    pub fn is_finishing(&self) -> bool {
        !self.done && self.outstanding.is_empty() && self.cursor == Cursor::End
    }

    /// Marks the backlog delivered; what `caught_up` reports.
    pub fn finish(&mut self) -> u64 {
        self.done = true;
        self.delivered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: std::ops::Range<u64>) -> Vec<MsgId> {
        r.map(MsgId).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn pages_follow_the_cursor_one_acked_page_at_a_time_to_caught_up() {
        let now = Instant::now();
        let mut p = BacklogPager::new(3);
        assert_eq!(p.next_request(now, 10), Some(PageRequest { after: None, want: 3 }));
        assert_eq!(p.next_request(now, 2), Some(PageRequest { after: None, want: 2 }), "bounded by the window");
        assert_eq!(p.next_request(now, 0), None, "no room, no page");
        let page = ids(1..4);
        p.read(&page);
        for id in &page {
            p.pushed(*id);
        }
        assert_eq!(p.cursor(), Cursor::After(MsgId(3)));
        assert_eq!(p.next_request(now, 10), None, "the page is not acked yet");
        assert!(p.acked(MsgId(1)) && p.acked(MsgId(2)) && !p.acked(MsgId(42)));
        assert!(p.is_outstanding(MsgId(3)) && !p.is_outstanding(MsgId(1)));
        assert!(p.acked(MsgId(3)));
        assert_eq!(p.next_request(now, 10), Some(PageRequest { after: Some(MsgId(3)), want: 3 }));
        assert!(!p.is_finishing(), "not before an empty page says it was the last");
        p.read(&[]);
        assert_eq!(p.cursor(), Cursor::End);
        assert_eq!(p.next_request(now, 10), None);
        assert!(p.is_finishing());
        assert_eq!(p.finish(), 3);
        assert!(!p.is_finishing(), "caught_up once");
    }

    #[tokio::test(start_paused = true)]
    async fn pacing_holds_pages_and_a_restart_reads_again_keeping_the_count() {
        let mut p = BacklogPager::new(2);
        let t0 = Instant::now();
        p.pace_until(t0 + std::time::Duration::from_millis(50));
        assert_eq!(p.next_request(t0, 10), None, "paced");
        assert_eq!(p.resume_at(), Some(t0 + std::time::Duration::from_millis(50)));
        tokio::time::advance(std::time::Duration::from_millis(50)).await;
        assert!(p.next_request(Instant::now(), 10).is_some(), "due at the resume time");
        p.resume();
        p.read(&ids(5..7));
        p.pushed(MsgId(5));
        p.pushed(MsgId(6));
        assert!(p.acked(MsgId(5)));
        p.read(&[]);
        p.restart();
        assert_eq!(p.cursor(), Cursor::Start);
        assert!(!p.is_outstanding(MsgId(6)), "the page is read again, not awaited");
        assert_eq!(p.next_request(Instant::now(), 10), Some(PageRequest { after: None, want: 2 }));
        p.read(&[]);
        assert_eq!(p.finish(), 1, "what was delivered before the restart stays counted");
    }
}
