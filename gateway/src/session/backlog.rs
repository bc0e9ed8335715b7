//! The backlog pager: where a session stands in reading what is waiting for its device.
//!
//! A reading first checks the device's overflow band (messages missing from the pending
//! set, read from MySQL) and pages through it, then pages through the pending set,
//! oldest first; before `caught_up` it checks the band once more (a fan-out may have
//! trimmed the set meanwhile). Each page is pushed and acked before the next. A reading
//! starts on connect and whenever the set must be read again (a dropped push, a new
//! Redis epoch, a presence that vanished). This is the state alone; the session does
//! the reads (the `pending_page` script, exact above 2^53) and paces them with token
//! buckets.

use std::collections::HashSet;

use herald_shared::ids::MsgId;
use tokio::time::Instant;

use crate::recovery::Band;

/// Where the next page of the pending set starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Nothing read yet: the oldest entry.
    Start,
    /// After this id (which may have been acked and removed since).
    After(MsgId),
    /// Every page was read.
    End,
}

/// The next read the session must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageRequest {
    /// Read the device's overflow band (it may have none).
    CheckBand,
    /// Up to `want` messages of the band after `after`; first move the band's low end to
    /// `advance_to` (everything below is acked), if set.
    Band { band: Band, after: MsgId, advance_to: Option<MsgId>, want: usize },
    /// Up to `want` entries of the pending set after `after` (`None`: from the start).
    Set { after: Option<MsgId>, want: usize },
}

#[derive(Debug)]
pub struct BacklogPager {
    check_band: bool,
    /// The band being read and the last id read from it.
    band: Option<(Band, MsgId)>,
    cursor: Cursor,
    /// Ids of the current page not yet acked.
    outstanding: HashSet<MsgId>,
    /// `caught_up` was sent for this reading: nothing older is still on its way.
    pub(super) done: bool,
    /// Backlog messages acked in this session (across readings).
    delivered: u64,
    page_size: usize,
    /// Pacing: no page before then (realtime keeps flowing meanwhile).
    resume: Option<Instant>,
    /// Messages pushed and not yet paid for to the device's bucket: a page is paid for
    /// before the next read, so a read that finds nothing costs the device nothing.
    owed: u32,
    /// Messages still waiting, as far as the session knows (from `hello.pending`, less
    /// what was pushed since); unknown once the set must be read again.
    expected: Option<u32>,
}

impl BacklogPager {
    pub fn new(page_size: usize) -> BacklogPager {
        BacklogPager {
            check_band: true,
            band: None,
            cursor: Cursor::Start,
            outstanding: HashSet::new(),
            done: false,
            delivered: 0,
            page_size: page_size.max(1),
            resume: None,
            owed: 0,
            expected: None,
        }
    }

    /// Backlog messages pushed since the device's bucket was last paid.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// The device's bucket was paid.
    pub fn paid(&mut self) {
        self.owed = 0;
    }

    /// `n` messages wait, as the session's start counted them.
    pub fn expect(&mut self, n: u64) {
        self.expected = Some(n.min(u64::from(u32::MAX)) as u32);
    }

    /// What a read of up to `want` messages reserves from the node's budget: what is
    /// expected to wait, or the whole page when that is unknown.
    pub fn reservation(&self, want: usize) -> usize {
        self.expected.map_or(want, |e| want.min(e as usize))
    }

    /// Reads everything again from the start; what was delivered stays counted.
    pub fn restart(&mut self) {
        self.check_band = true;
        self.band = None;
        self.cursor = Cursor::Start;
        // Released, not cleared: a page's set is the size of a page.
        self.outstanding = HashSet::new();
        self.done = false;
        self.expected = None;
    }

    /// Most messages a page holds.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    #[cfg(test)]
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next read, if one is due: the previous page is acked, the pager is not
    /// paced, and the inflight window has `room`.
    pub fn next_request(&self, now: Instant, room: usize) -> Option<PageRequest> {
        if self.done || !self.outstanding.is_empty() || room == 0 || self.is_paced(now) {
            return None;
        }
        let want = self.page_size.min(room);
        if self.check_band {
            return Some(PageRequest::CheckBand);
        }
        if let Some((band, after)) = &self.band {
            let advance_to = (*after >= band.low).then(|| MsgId(after.0 + 1));
            return Some(PageRequest::Band { band: band.clone(), after: *after, advance_to, want });
        }
        match self.cursor {
            Cursor::Start => Some(PageRequest::Set { after: None, want }),
            Cursor::After(id) => Some(PageRequest::Set { after: Some(id), want }),
            Cursor::End => None,
        }
    }

    /// What the band check found. A band is read from its low end, then the set from
    /// its start.
    pub fn band_checked(&mut self, band: Option<Band>) {
        self.check_band = false;
        if let Some(band) = band {
            let after = MsgId(band.low.0.saturating_sub(1));
            self.band = Some((band, after));
            self.cursor = Cursor::Start;
        }
    }

    /// The band's low end moved to `low` (everything below is acked).
    pub fn band_advanced(&mut self, low: MsgId) {
        if let Some((band, _)) = &mut self.band {
            *band = band.moved_to(low);
        }
    }

    /// The band changed under the session (a fan-out widened it): read it again.
    pub fn band_changed(&mut self) {
        self.band = None;
        self.check_band = true;
    }

    /// A band page was read; an empty one means the band is passed (the session then
    /// removes it, and reads the set from its start).
    pub fn band_read(&mut self, page: &[MsgId]) {
        if let Some((_, after)) = &mut self.band {
            if let Some(last) = page.last() {
                *after = *last;
            }
        }
    }

    /// The band was removed: on to the pending set.
    pub fn band_done(&mut self) {
        self.band = None;
        self.cursor = Cursor::Start;
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

    /// A page of the set was read: the cursor moves past it; an empty one ends the set,
    /// and the band is checked once more before `caught_up`.
    pub fn read(&mut self, page: &[MsgId]) {
        self.cursor = match page.last() {
            Some(last) => Cursor::After(*last),
            None => {
                self.check_band = true;
                Cursor::End
            }
        };
    }

    /// An id of the page was pushed; its ack is awaited before the next page.
    pub fn pushed(&mut self, id: MsgId) {
        self.outstanding.insert(id);
        self.owed = self.owed.saturating_add(1);
        self.expected = self.expected.map(|e| e.saturating_sub(1));
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
        if self.outstanding.is_empty() {
            // The page is done: its memory goes until the next one.
            self.outstanding.shrink_to_fit();
        }
        was
    }

    /// Everything was read and acked, and `caught_up` is not sent yet.
    pub fn is_finishing(&self) -> bool {
        !self.done
            && self.outstanding.is_empty()
            && self.cursor == Cursor::End
            && !self.check_band
            && self.band.is_none()
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

    fn band(low: u64, high: u64) -> Band {
        Band::parse(&format!("{} {}", MsgId(low).member(), MsgId(high).member())).unwrap()
    }

    /// Reads the set through to `caught_up` with no band.
    fn set_pages(p: &mut BacklogPager, pages: &[Vec<MsgId>]) {
        let now = Instant::now();
        for page in pages {
            assert!(matches!(p.next_request(now, 10), Some(PageRequest::Set { .. })));
            p.read(page);
            for id in page {
                p.pushed(*id);
                assert!(p.acked(*id));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pages_follow_the_cursor_one_acked_page_at_a_time_to_caught_up() {
        let now = Instant::now();
        let mut p = BacklogPager::new(3);
        assert_eq!(p.next_request(now, 10), Some(PageRequest::CheckBand), "the band first");
        p.band_checked(None);
        assert_eq!(p.next_request(now, 10), Some(PageRequest::Set { after: None, want: 3 }));
        assert_eq!(p.next_request(now, 2), Some(PageRequest::Set { after: None, want: 2 }), "bounded by the window");
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
        assert_eq!(p.next_request(now, 10), Some(PageRequest::Set { after: Some(MsgId(3)), want: 3 }));
        assert!(!p.is_finishing(), "not before an empty page says it was the last");
        p.read(&[]);
        assert_eq!(p.cursor(), Cursor::End);
        assert_eq!(p.next_request(now, 10), Some(PageRequest::CheckBand), "the band again before caught_up");
        p.band_checked(None);
        assert_eq!(p.next_request(now, 10), None);
        assert!(p.is_finishing());
        assert_eq!(p.finish(), 3);
        assert!(!p.is_finishing(), "caught_up once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_band_is_read_before_the_set_and_its_low_end_follows_the_acks() {
        let now = Instant::now();
        let mut p = BacklogPager::new(2);
        p.band_checked(Some(band(10, 20)));
        assert_eq!(
            p.next_request(now, 10),
            Some(PageRequest::Band { band: band(10, 20), after: MsgId(9), advance_to: None, want: 2 })
        );
        p.band_read(&ids(10..12));
        p.pushed(MsgId(10));
        p.pushed(MsgId(11));
        assert_eq!(p.next_request(now, 10), None, "the band page is awaited like any page");
        assert!(p.acked(MsgId(10)) && p.acked(MsgId(11)));
        // Everything up to 11 acked: the band's low end moves to 12 before the next page.
        let Some(PageRequest::Band { advance_to, after, .. }) = p.next_request(now, 10) else { panic!() };
        assert_eq!((advance_to, after), (Some(MsgId(12)), MsgId(11)));
        p.band_advanced(MsgId(12));
        let Some(PageRequest::Band { band: b, .. }) = p.next_request(now, 10) else { panic!() };
        assert_eq!(b.low, MsgId(12));
        // A fan-out widened the band meanwhile: it is read again.
        p.band_changed();
        assert_eq!(p.next_request(now, 10), Some(PageRequest::CheckBand));
        p.band_checked(Some(band(5, 30)));
        let Some(PageRequest::Band { after, .. }) = p.next_request(now, 10) else { panic!() };
        assert_eq!(after, MsgId(4), "from the new low end");
        // Passed: the band goes, the set is read from its start, then caught_up.
        p.band_read(&[]);
        p.band_done();
        set_pages(&mut p, &[ids(40..42), vec![]]);
        assert_eq!(p.next_request(now, 10), Some(PageRequest::CheckBand));
        p.band_checked(None);
        assert!(p.is_finishing());
        assert_eq!(p.finish(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn pacing_holds_pages_and_a_restart_reads_again_keeping_the_count() {
        let mut p = BacklogPager::new(2);
        p.band_checked(None);
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
        p.restart();
        assert_eq!(p.cursor(), Cursor::Start);
        assert!(!p.is_outstanding(MsgId(6)), "the page is read again, not awaited");
        assert_eq!(p.next_request(Instant::now(), 10), Some(PageRequest::CheckBand));
        p.band_checked(None);
        assert_eq!(p.next_request(Instant::now(), 10), Some(PageRequest::Set { after: None, want: 2 }));
        p.read(&[]);
        p.band_checked(None);
        assert_eq!(p.finish(), 1, "what was delivered before the restart stays counted");
    }

    #[test]
    fn pushed_messages_are_owed_until_paid() {
        let mut p = BacklogPager::new(10);
        assert_eq!(p.owed(), 0, "nothing pushed, nothing owed");
        p.pushed(MsgId(1));
        p.pushed(MsgId(2));
        assert_eq!(p.owed(), 2);
        p.paid();
        p.pushed(MsgId(3));
        assert_eq!(p.owed(), 1, "only what was pushed since");
    }

    #[test]
    fn a_read_reserves_what_is_expected_or_a_page() {
        let mut p = BacklogPager::new(10);
        assert_eq!(p.reservation(10), 10, "unknown: a page");
        p.expect(3);
        assert_eq!(p.reservation(10), 3);
        p.pushed(MsgId(1));
        assert_eq!(p.reservation(10), 2, "less what was pushed");
        p.pushed(MsgId(2));
        p.pushed(MsgId(3));
        p.pushed(MsgId(4));
        assert_eq!(p.reservation(10), 0, "nothing more expected");
        p.restart();
        assert_eq!(p.reservation(10), 10, "a read again from the start: unknown");
    }
}
