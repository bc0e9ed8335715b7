//! Whether the server is still there. The device pings every half heartbeat and the
//! server answers each ping with `pong`, so a healthy session never stays silent for two
//! heartbeats; one that does sits on a dead path (a cut without FIN or RST) that TCP
//! would take minutes to notice.

use std::time::{Duration, Instant};

pub(super) struct Liveness {
    silent_limit: Duration,
    last_heard: Instant,
}

impl Liveness {
    pub(super) fn new(hb: Duration, now: Instant) -> Liveness {
        Liveness { silent_limit: hb * 2, last_heard: now }
    }

    pub(super) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    pub(super) fn is_lost(&self, now: Instant) -> bool {
        now.duration_since(self.last_heard) > self.silent_limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_silent_for_two_heartbeats_is_lost() {
        let (hb, t0) = (Duration::from_secs(1), Instant::now());
        let mut live = Liveness::new(hb, t0);
        assert!(!live.is_lost(t0 + Duration::from_millis(2000)), "two heartbeats of silence are allowed");
        assert!(live.is_lost(t0 + Duration::from_millis(2001)));
        live.heard(t0 + Duration::from_millis(1500));
        assert!(!live.is_lost(t0 + Duration::from_millis(3000)), "any frame restarts the count");
        assert!(live.is_lost(t0 + Duration::from_millis(3600)));
    }
}
