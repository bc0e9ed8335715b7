//! WebSocket close codes (docs/protocol.md, "Close codes").

/// Why the server closed a session. Clients act on the code: reconnect, ask for a new
/// token, stop, or wait as told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 4000: no frame or pong within the idle limit, or pushes unacked and pings
    /// unanswered (half-open).
    HeartbeatTimeout,
    /// 4001: token missing, invalid or expired.
    Unauthorized,
    /// 4002: replaced by a newer session of the same device.
    Replaced,
    /// 4003: the server is draining (after `reconnect`).
    Draining,
    /// 4004: the session's token was revoked (its user or device was disconnected by
    /// the server API): do not reconnect with the same token.
    Revoked,
    /// 4008: rate or connection limits exceeded repeatedly.
    Policy,
    /// 4009: malformed or oversized frames repeatedly.
    Protocol,
    /// 1011: the server could not serve the session (a dependency is down).
    InternalError,
    /// 1013: try again later (admission refused in a login storm).
    TryAgainLater,
}

impl CloseCode {
    pub const ALL: [CloseCode; 9] = [
        CloseCode::HeartbeatTimeout,
        CloseCode::Unauthorized,
        CloseCode::Replaced,
        CloseCode::Draining,
        CloseCode::Revoked,
        CloseCode::Policy,
        CloseCode::Protocol,
        CloseCode::InternalError,
        CloseCode::TryAgainLater,
    ];

    pub fn code(self) -> u16 {
        match self {
            CloseCode::HeartbeatTimeout => 4000,
            CloseCode::Unauthorized => 4001,
            CloseCode::Replaced => 4002,
            CloseCode::Draining => 4003,
            CloseCode::Revoked => 4004,
            CloseCode::Policy => 4008,
            CloseCode::Protocol => 4009,
            CloseCode::InternalError => 1011,
            CloseCode::TryAgainLater => 1013,
        }
    }

    /// The code's name in metrics (`herald_sessions_closed_total{reason}`).
    pub fn name(self) -> &'static str {
        match self {
            CloseCode::HeartbeatTimeout => "heartbeat_timeout",
            CloseCode::Unauthorized => "unauthorized",
            CloseCode::Replaced => "replaced",
            CloseCode::Draining => "draining",
            CloseCode::Revoked => "revoked",
            CloseCode::Policy => "policy",
            CloseCode::Protocol => "protocol",
            CloseCode::InternalError => "internal_error",
            CloseCode::TryAgainLater => "try_again_later",
        }
    }

    pub fn from_code(code: u16) -> Option<CloseCode> {
        CloseCode::ALL.into_iter().find(|c| c.code() == code)
    }
}

impl From<CloseCode> for u16 {
    fn from(c: CloseCode) -> u16 {
        c.code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for c in CloseCode::ALL {
            assert_eq!(CloseCode::from_code(c.code()), Some(c));
            assert!(seen.insert(c.code()));
        }
        assert_eq!(CloseCode::from_code(1000), None);
        assert_eq!(u16::from(CloseCode::Replaced), 4002);
    }
}
