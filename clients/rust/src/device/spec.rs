//! Who a device is, where it connects and how: the [`DeviceSpec`] an app starts a
//! [`Device`](super::Device) with.

use std::net::IpAddr;
use std::time::Duration;

use crate::tls::Tls;

use super::timeline::Stored;
use super::token::TokenSource;

/// Where the token goes when a session opens (docs/client.md section 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenIn {
    /// The session's first frame, `{"t":"auth","token":...}`: kept out of URLs, which
    /// proxies and servers log. The default.
    #[default]
    Frame,
    /// `?access_token=` in the upgrade's URL, for gateways older than the `auth` frame.
    Query,
}

/// Who the device is and where it may connect.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    pub user: String,
    pub device: String,
    /// The token of the first session (empty: ask `token_source` first).
    pub token: String,
    /// Where new tokens come from: asked after a 4001, and before the session's token
    /// expires, to `refresh` it in the session. Without one, the device stops at a 4001.
    pub token_source: Option<TokenSource>,
    /// How long before its `exp` a session's token is refreshed (with a `token_source`).
    pub refresh_before: Duration,
    /// Where the token goes when a session opens.
    pub token_in: TokenIn,
    /// Offer the `herald.v1` subprotocol and insist that the server chooses it; `false`
    /// for gateways older than that name (they do not echo it).
    pub offer_subprotocol: bool,
    /// Ask for `delivered` frames (the delivery status of the user's own messages),
    /// which the observer then sees as frames.
    pub delivery_status: bool,
    /// Ask for `typing` and `presence` frames (other members typing; the presence of
    /// the users followed with a `presence_subscribe` frame), which the observer then
    /// sees as frames.
    pub typing_and_presence: bool,
    /// Keep what each conversation's screen shows ([`DeviceLog::screens`](super::DeviceLog::screens)):
    /// messages' text as edited or recalled, and a line per membership, title or role
    /// change. Off by default: the load-test's thousands of devices keep only ids.
    pub keep_screen: bool,
    /// Gateways (`http://host:port`), tried in turn starting at `first_gateway`.
    pub gateways: Vec<String>,
    pub first_gateway: usize,
    /// Local address to connect from (spreads many connections over loopback addresses).
    pub local_ip: Option<IpAddr>,
    /// Whom to trust for `https://` gateways (the system's roots unless told).
    pub tls: Tls,
    /// A gap still open this long after `caught_up` is filled with `sync`.
    pub gap_sync_after: Duration,
    /// Reconnect when a session ends, as an app does; `false`: one session (or one
    /// failed attempt), then the device ends.
    pub reconnect: bool,
    /// Reconnect after 4002 (replaced or logged out) and 4009 (protocol errors), and
    /// after a 4001 without a `token_source`, which by the spec stop the device: for the
    /// load-test, which wants every device back whatever ended its session.
    pub reconnect_after_stop_codes: bool,
    /// The largest backoff cap between attempts (full jitter from 500 ms, doubling).
    pub backoff_max: Duration,
    /// What an earlier instance of the device stored ([`DeviceLog::stored`](super::DeviceLog::stored)):
    /// this one goes on from there, as an app restarted on the same phone does.
    pub resume: Stored,
}

impl DeviceSpec {
    /// A device that reconnects across `gateways`, starting with the first, as
    /// docs/client.md says: the token in the first frame, `herald.v1` offered.
    pub fn new(user: &str, device: &str, token: &str, gateways: Vec<String>) -> DeviceSpec {
        DeviceSpec {
            user: user.into(),
            device: device.into(),
            token: token.into(),
            token_source: None,
            refresh_before: Duration::from_secs(60),
            token_in: TokenIn::Frame,
            offer_subprotocol: true,
            delivery_status: false,
            typing_and_presence: false,
            keep_screen: false,
            gateways,
            first_gateway: 0,
            local_ip: None,
            tls: Tls::system(),
            gap_sync_after: Duration::from_secs(5),
            reconnect: true,
            reconnect_after_stop_codes: false,
            backoff_max: Duration::from_secs(30),
            resume: Stored::default(),
        }
    }
}
