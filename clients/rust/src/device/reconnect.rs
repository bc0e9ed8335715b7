//! What a device does when a session ends, by its close code and the hints the server
//! gave before it (docs/client.md section 2, docs/protocol.md section 3.6), and the
//! jittered backoff between attempts.

use std::time::Duration;

use herald_shared::protocol::CloseCode;
use rand::Rng;

/// Why a device stopped for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// The app stopped it ([`Device::stop`](super::Device::stop)).
    App,
    /// Its one session (or one attempt at one) ended, without `reconnect`.
    OneSession,
    /// 4002: another session of the device is live, or the device logged out. Coming
    /// back by itself would replace that session, which would come back too, forever.
    Replaced,
    /// 4009: the server refused too many of the device's frames, a client bug that a
    /// new session would repeat.
    ProtocolErrors,
    /// 4001 with no way to get a new token: no token source, or it had none.
    Unauthorized,
    /// 4004 with no way to get a new token: the server revoked the device's token (its
    /// user or device was disconnected); the same token would be refused.
    Revoked,
}

/// What the server said before a session ended that bears on the next attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Hints {
    /// `reconnect {after_ms}`: the gateway is draining.
    pub(super) reconnect_after: Option<Duration>,
    /// `error rate_limited {retry_after_ms}` without a request's `ref`: the session was
    /// refused (a login storm, connection limits).
    pub(super) retry_after: Option<Duration>,
}

/// What the device does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Reconnect after this long; with `new_token`, ask the token source first.
    Reconnect {
        after: Duration,
        new_token: bool,
    },
    Stop(EndedBy),
}

/// What the device may do about the codes that stop it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Policy {
    /// A token source was given: a 4001 leads to a new token, not to a stop.
    pub(super) can_renew_token: bool,
    /// Reconnect after 4001 (without a token source), 4002 and 4009 too.
    pub(super) reconnect_anyway: bool,
}

/// The decision after a session or an attempt ended with close `code` (`None`: lost
/// without a close frame, or never opened). Server hints are already jittered per
/// client and are followed as given.
pub(super) fn after_session(code: Option<u16>, hints: Hints, policy: Policy, backoff: &mut Backoff) -> Next {
    let stop_unless_told = |why| if policy.reconnect_anyway { None } else { Some(Next::Stop(why)) };
    let reconnect = |after| Next::Reconnect { after, new_token: false };
    let stop = match code.and_then(CloseCode::from_code) {
        Some(CloseCode::Replaced) => stop_unless_told(EndedBy::Replaced),
        Some(CloseCode::Protocol) => stop_unless_told(EndedBy::ProtocolErrors),
        Some(CloseCode::Unauthorized | CloseCode::Revoked) if policy.can_renew_token => {
            return Next::Reconnect { after: backoff.next(), new_token: true }
        }
        Some(CloseCode::Unauthorized) => stop_unless_told(EndedBy::Unauthorized),
        Some(CloseCode::Revoked) => stop_unless_told(EndedBy::Revoked),
        Some(CloseCode::Policy | CloseCode::TryAgainLater) => {
            return reconnect(hints.retry_after.unwrap_or_else(|| backoff.next()))
        }
        _ => None,
    };
    // 4003 after `reconnect`, 1011, 4000, other codes, no close frame: the drain hint
    // when one came (a drain may break the connection before its close), else backoff.
    stop.unwrap_or_else(|| reconnect(hints.reconnect_after.unwrap_or_else(|| backoff.next())))
}

/// Full jitter: each delay is drawn uniformly from `[0, cap)`, the cap doubling from a
/// base to a maximum, so that thousands of devices cut at once do not come back at once.
#[derive(Debug)]
pub(super) struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub(super) fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max, attempt: 0 }
    }

    fn cap(&self) -> Duration {
        self.base.saturating_mul(1 << self.attempt.min(20)).min(self.max)
    }

    /// The next delay; the cap doubles for the one after.
    pub(super) fn next(&mut self) -> Duration {
        let cap = self.cap().as_millis().max(1) as u64;
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(rand::rng().random_range(0..cap))
    }

    /// A session said `hello`: start from the base again.
    pub(super) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Policy = Policy { can_renew_token: false, reconnect_anyway: false };

    fn backoff() -> Backoff {
        Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
    }

    fn decide(code: Option<u16>, hints: Hints, policy: Policy) -> Next {
        after_session(code, hints, policy, &mut backoff())
    }

    #[test]
    fn replaced_protocol_errors_and_a_refused_fixed_token_stop_the_device() {
        assert_eq!(decide(Some(4002), Hints::default(), SPEC), Next::Stop(EndedBy::Replaced));
        assert_eq!(decide(Some(4009), Hints::default(), SPEC), Next::Stop(EndedBy::ProtocolErrors));
        assert_eq!(decide(Some(4001), Hints::default(), SPEC), Next::Stop(EndedBy::Unauthorized));
        assert_eq!(decide(Some(4004), Hints::default(), SPEC), Next::Stop(EndedBy::Revoked));
        // Unless the device was told to come back whatever happened (the load-test).
        let anyway = Policy { reconnect_anyway: true, ..SPEC };
        for code in [4001, 4002, 4009] {
            assert!(matches!(decide(Some(code), Hints::default(), anyway), Next::Reconnect { new_token: false, .. }));
        }
    }

    #[test]
    fn an_expired_token_is_renewed_when_a_source_can_give_one() {
        let renew = Policy { can_renew_token: true, ..SPEC };
        assert!(matches!(decide(Some(4001), Hints::default(), renew), Next::Reconnect { new_token: true, .. }));
    }

    #[test]
    fn server_hints_are_followed_as_given() {
        let drain = Hints { reconnect_after: Some(Duration::from_millis(7_321)), retry_after: None };
        let storm = Hints { reconnect_after: None, retry_after: Some(Duration::from_millis(12_345)) };
        let after = |after| Next::Reconnect { after, new_token: false };
        assert_eq!(decide(Some(4003), drain, SPEC), after(Duration::from_millis(7_321)));
        assert_eq!(decide(None, drain, SPEC), after(Duration::from_millis(7_321)), "a drain cut short");
        assert_eq!(decide(Some(1013), storm, SPEC), after(Duration::from_millis(12_345)));
        assert_eq!(decide(Some(4008), storm, SPEC), after(Duration::from_millis(12_345)));
    }

    #[test]
    fn other_ends_reconnect_with_backoff() {
        for code in [None, Some(1000), Some(1011), Some(4000), Some(4003), Some(4999)] {
            match decide(code, Hints::default(), SPEC) {
                Next::Reconnect { after, new_token: false } => assert!(after < Duration::from_millis(500), "{code:?}"),
                other => panic!("{code:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn backoff_draws_below_a_doubling_cap_and_resets() {
        let mut b = backoff();
        let caps: Vec<u64> = (0..9)
            .map(|_| {
                let cap = b.cap();
                assert!(b.next() < cap);
                cap.as_millis() as u64
            })
            .collect();
        assert_eq!(caps, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]);
        b.reset();
        assert_eq!(b.cap(), Duration::from_millis(500));
        let draws: Vec<Duration> =
            (0..200).map(|_| Backoff::new(Duration::from_secs(10), Duration::from_secs(10)).next()).collect();
        assert!(draws.iter().any(|d| *d < Duration::from_secs(2)), "full jitter reaches near zero");
        assert!(draws.iter().any(|d| *d > Duration::from_secs(8)), "and near the cap");
    }
}
