//! Ephemeral frames (docs/protocol.md section 4.12): typing indicators and presence.
//! Never stored: relayed over pub/sub to the sessions online now, dropped first when a
//! session's queue is full, so a client shows them for a while and then forgets them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a member started or stopped typing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TypingState {
    #[default]
    Started,
    Stopped,
}

/// A member of `conv` is typing (or stopped): shown to the other members' sessions that
/// asked for `features=typing`, for `expires_in_ms` unless renewed or stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TypingShown {
    pub conv: String,
    pub user: String,
    pub state: TypingState,
    /// How long to show a `started` indicator without another frame.
    pub expires_in_ms: u64,
}

/// A user's presence: online (some device connected) or not, with when it was last
/// online when known. Sent to sessions that subscribed to the user (`presence_subscribe`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PresenceState {
    pub user: String,
    pub online: bool,
    /// When the user's last device went offline (ms), while it is offline; null when
    /// online or unknown.
    #[serde(default)]
    pub last_seen: Option<u64>,
}
