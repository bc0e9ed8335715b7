//! One WebSocket session: a single loop over shutdown, its one timer (heartbeat, token
//! expiry, backlog pacing, ack flush), control messages, answers to the device's
//! requests, realtime pushes, socket reads and a new Redis epoch.
//!
//! Delivery rules (docs/architecture.md section 4): realtime pushes go first (biased
//! select); backlog is read from the device's pending set in pages, each page acked
//! before the next; at most `inflight_window` pushes are unacked; an ack removes the
//! ids from the pending set (and nothing else does); an unacked push older than
//! `ack_timeout_ms` triggers a ping, and without a pong the connection is half-open and
//! closed (4000). A push dropped because this session's queue was full is re-read from
//! the pending set.
//!
//! # Layout
//! - [`backlog`]: the pager's state; [`inflight`]: the window, ack batching, heartbeat.
//! - [`presence`]: where the device is connected, one session per device.
//! - `ephemeral`: typing sent (limited, relayed) and typing and presence shown.
//! - `closing`: the node's drain and the session's end; `delivery`: pushes, backlog
//!   pages, acks; `upkeep`: the timer and what it does (heartbeat, epoch, watermark);
//!   `requests`: send, sync and read; `reads`: read positions shown; `status`:
//!   delivered positions reported and delivery status shown; `token`: the token's
//!   expiry and its refresh; `frames`: frames read from the socket and written to it.
//!
//! The loop is generic over a `Stream` + `Sink` of WebSocket messages, so a test drives
//! a session over channels.

mod backlog;
mod closing;
mod delivery;
mod ephemeral;
mod frames;
mod inflight;
pub mod presence;
mod reads;
mod requests;
mod start;
mod status;
mod token;
mod upkeep;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Message;
use fred::prelude::Pool;
use futures::{Sink, Stream, StreamExt};
use governor::DefaultDirectRateLimiter;
use herald_shared::auth::Claims;
use herald_shared::config::Config;
use herald_shared::ids::MsgId;
use herald_shared::keys::{DeviceKey, Keys, PresenceValue};
use herald_shared::protocol::{CloseCode, ServerFrame};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::acks::{AckQueue, Tally};
use crate::delivered::DeliveredReports;
use crate::devices::DeviceRegistry;
use crate::epoch::{EpochSeen, EpochWatch};
use crate::history::History;
use crate::ingress::Ingress;
use crate::limits::NodeLimits;
use crate::mailbox::Mailbox;
use crate::recovery::{Recovery, RecoveryError};
use crate::roster::Roster;
use crate::sessions::{Control, SessionRegistry};
use crate::typing::TypingRelay;
use crate::watchers::PresenceWatchers;
use crate::watermarks::Marks;
use backlog::BacklogPager;
use ephemeral::TypingLimit;
use inflight::{AckBatch, Heartbeat, Inflight};
use presence::Presence;
use requests::Strikes;
use status::{DeliveredMarks, StatusThrottle};

/// What every session of this node is given.
#[derive(Clone, Debug)]
pub struct SessionEnv {
    pub cfg: Arc<Config>,
    /// Tokens' keys and revocations (`refresh`).
    pub identity: Arc<crate::identity::Identity>,
    /// Devices registered in MySQL (a device found logged out at its start is
    /// registered again).
    pub devices: DeviceRegistry,
    pub redis: Pool,
    pub keys: Keys,
    pub history: History,
    pub ingress: Ingress,
    pub recovery: Recovery,
    pub marks: Marks,
    /// The node's ack writer: acked ids leave the pending sets through it.
    pub acks: AckQueue,
    /// Where acks move the user's delivered positions.
    pub delivered: DeliveredReports,
    pub epoch: EpochWatch,
    pub directory: Arc<SessionRegistry>,
    pub limits: Arc<NodeLimits>,
    /// Presence announced and read.
    pub roster: Roster,
    /// Typing indicators relayed.
    pub typing: Arc<TypingRelay>,
    /// Who follows whose presence here.
    pub watchers: Arc<PresenceWatchers>,
    /// Cancelled when the node drains: sessions send `reconnect` and close.
    pub drain: CancellationToken,
}

/// The frames a session asked for at the upgrade (`features=`, docs/protocol.md
/// section 3.1): a client that predates a frame never sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `delivered`: the delivery status of the user's own messages.
    pub delivered: bool,
    /// `typing`: other members' typing indicators.
    pub typing: bool,
    /// `presence`: presence of the users it follows (`presence_subscribe`).
    pub presence: bool,
}

impl Features {
    /// The features an upgrade's query asks for: `features=` with a comma-separated
    /// list; names this gateway does not know are ignored, so a client may ask for
    /// features of newer gateways.
    pub fn of_query(query: Option<&str>) -> Features {
        let mut f = Features::default();
        let Some(query) = query else { return f };
        let names = query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .filter(|(k, _)| *k == "features")
            .flat_map(|(_, v)| v.split([',', ' ']).flat_map(|f| f.split("%2C").flat_map(|f| f.split("%2c"))));
        for name in names {
            match name {
                "delivered" => f.delivered = true,
                "typing" => f.typing = true,
                "presence" => f.presence = true,
                _ => {}
            }
        }
        f
    }
}

/// Why a session could not go on.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("pending set rebuild: {0}")]
    Recovery(#[from] RecoveryError),
    #[error("device registration: {0}")]
    Register(String),
    /// A newer session of the device holds its presence.
    #[error("replaced by a newer session")]
    Superseded,
    #[error("acks: {0}")]
    Acks(#[from] delivery::AcksNotRecorded),
}

/// The close reason of a session whose device logged out.
pub(super) const LOGGED_OUT: &str = "the device logged out";
/// The close reason of a session a newer one of its device replaced.
pub(super) const REPLACED: &str = "replaced by a newer session";

/// What a session's admission found: the device's watermark when its registration read
/// or wrote it (the start needs no second read), and the session's epoch among the
/// device's sessions (`presence::draw_epoch`).
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub watermark: Option<MsgId>,
    pub epoch: u64,
}

/// How a session ends.
#[derive(Debug)]
enum End {
    /// The server closes it, with this code.
    Close(CloseCode, &'static str),
    /// The client went away (or its socket failed).
    Gone,
}

/// What a handler tells the loop: go on, or end the session.
type Flow = ControlFlow<End>;

/// One device's session. An idle session's memory is mostly its task: this struct
/// (1.6 KiB with its WebSocket) inside the loop's resting future, which axum's upgrade
/// and tokio's task wrap, about 3.9 KiB in all; the allocator rounds that up to its next
/// size class, so a field or an inline handler that takes the task past 4 KiB costs every
/// idle session a whole KiB (docs/benchmarks.md, idle session memory). What only some
/// sessions use is boxed and made on demand.
pub struct Session<S> {
    env: Arc<SessionEnv>,
    claims: Claims,
    device: DeviceKey,
    id: String,
    socket: S,
    pending_key: String,
    presence: Presence,
    inflight: Inflight,
    heartbeat: Heartbeat,
    acks: AckBatch,
    /// Its acks' removals handed to the node's ack writer and not yet done.
    ack_tally: Arc<Tally>,
    backlog: BacklogPager,
    /// Its place in the line for the node's backlog budget, while it waits there.
    budget_turn: Option<Arc<crate::budget::Turn>>,
    backlog_bucket: DefaultDirectRateLimiter,
    send_bucket: DefaultDirectRateLimiter,
    /// The Redis epoch this session's pending set was checked against.
    epoch: EpochSeen,
    last_mark: Instant,
    /// The watermark last reported: an unchanged one is not written again.
    reported_watermark: Option<herald_shared::ids::MsgId>,
    /// When W was last reported (which writes `last_seen_at`).
    last_report: Instant,
    strikes: Strikes,
    /// Read positions written but not yet confirmed by a pong: (field, seq).
    unconfirmed_reads: Vec<(String, u64)>,
    /// The highest seq acked per conversation, not yet reported.
    delivered: DeliveredMarks,
    /// Delivery status shown to this sender's device: only when it opted in.
    status: Option<Box<StatusThrottle>>,
    /// What the device asked for at the upgrade.
    features: Features,
    /// Typing frames sent, per conversation (`gateway.typing_burst`): made at the
    /// device's first typing frame, so sessions that never send one do not carry it.
    typing_limit: Option<Box<TypingLimit>>,
    /// The users the device asked to follow (`presence_subscribe`), checked again
    /// against its contacts when a membership change reaches it.
    presence_asked: Option<Box<[String]>>,
    /// Sends, syncs and reads waiting for their answers; aborted with the session.
    requests: JoinSet<Option<ServerFrame>>,
    /// A write missed its deadline: the connection is given up.
    stalled: bool,
    /// The token's expiry ends the session (4001); `refresh` moves it.
    expires: Instant,
    /// When the upkeep last ran (see `upkeep`).
    last_upkeep: Instant,
    /// The device's watermark as its registration found it, until the start uses it.
    registered_watermark: Option<MsgId>,
    /// The overflow band's first page, read by the start with its count, until the
    /// pager asks for it.
    first_band_page: Option<Box<start::FirstPage>>,
}

impl<S, E> Session<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin + Send,
{
    /// Serves one device's session until it ends. Not an `async fn`: its arguments
    /// would stay in the session's future, a second copy beside the session they
    /// moved into.
    /// `admitted`: what the session's admission found (see [`Admission`]);
    /// `features`: the frames the device asked for.
    pub fn run(
        env: Arc<SessionEnv>,
        claims: Claims,
        admitted: Admission,
        socket: S,
        features: Features,
    ) -> impl Future<Output = ()> {
        let Admission { watermark, epoch } = admitted;
        let id = format!("{}-{:016x}", env.cfg.node_id, rand::random::<u64>());
        let span = tracing::debug_span!("session", tenant = %claims.tid, user = %claims.sub, device = %claims.dev, session = %id);
        let mut session = Session::new(env, claims, id, socket, epoch);
        session.registered_watermark = watermark;
        session.features = features;
        if features.delivered {
            session.presence.show_statuses();
            let interval = Duration::from_millis(session.env.cfg.delivery.status_interval_ms);
            session.status = Some(Box::new(StatusThrottle::new(interval)));
        }
        session.serve().instrument(span)
    }

    fn new(env: Arc<SessionEnv>, claims: Claims, id: String, socket: S, epoch: u64) -> Session<S> {
        let g = &env.cfg.gateway;
        let (page_size, backlog_rate) = if claims.plat.is_mobile() {
            (g.backlog_page_mobile, g.backlog_rate_mobile)
        } else {
            (g.backlog_page_desktop, g.backlog_rate_desktop)
        };
        let device = DeviceKey::of(&claims);
        let now = Instant::now();
        let ms = Duration::from_millis;
        Session {
            backlog_bucket: crate::limits::bucket(backlog_rate, (page_size as u32).max(backlog_rate / 10)),
            send_bucket: crate::limits::bucket(g.send_rate, g.send_burst),
            inflight: Inflight::new(g.inflight_window),
            heartbeat: Heartbeat::new(ms(g.heartbeat_ms), ms(g.ack_timeout_ms), ms(g.ack_probe_ms), now),
            backlog: BacklogPager::new(page_size),
            budget_turn: None,
            presence: Presence::new(
                &env.keys,
                &device,
                PresenceValue::new(env.cfg.node_id.as_str(), id.as_str()),
                g.heartbeat_ms,
                epoch,
            ),
            pending_key: env.keys.pending_of(&device),
            epoch: EpochSeen::new(&env.epoch),
            acks: AckBatch::default(),
            ack_tally: Arc::default(),
            last_mark: now,
            reported_watermark: None,
            last_report: now,
            strikes: Strikes::default(),
            unconfirmed_reads: Vec::new(),
            delivered: DeliveredMarks::default(),
            status: None,
            features: Features::default(),
            typing_limit: None,
            presence_asked: None,
            requests: JoinSet::new(),
            stalled: false,
            expires: token::expiry(claims.exp),
            last_upkeep: now,
            registered_watermark: None,
            first_band_page: None,
            env,
            claims,
            device,
            id,
            socket,
        }
    }

    /// While idle, a session holds the loop's resting state and nothing else: the start,
    /// the end and every handler but a push run boxed, so their futures (Redis and MySQL
    /// calls nested deep: 13 KiB when they were inline) exist only while they run. An
    /// `async` block, not an `async fn`: the function's argument would be moved into a
    /// local of its own, and its future would keep both (the session twice, 1.5 KiB).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn serve(mut self) -> impl Future<Output = ()> {
        async move {
            let directory = self.env.directory.clone();
            let mailbox = {
                let g = &self.env.cfg.gateway;
                let epoch = self.presence.epoch();
                let (device, id, statuses) = (self.device.clone(), self.id.clone(), self.presence.statuses());
                directory.register(device, id, statuses, epoch, g.realtime_queue, g.ephemeral_queue)
            };
            // A revocation announced between the token's check and the registration
            // just above found no session here to close: look again.
            let revoked = Box::pin(token::revoked_meanwhile(self.env.identity.clone(), self.claims.clone())).await;
            let end = if revoked {
                End::Close(CloseCode::Revoked, token::REVOKED)
            } else {
                match Box::pin(self.start()).await {
                    Ok(()) => self.event_loop(&mailbox).await,
                    Err(SessionError::Recovery(RecoveryError::Unregistered)) => {
                        End::Close(CloseCode::Replaced, LOGGED_OUT)
                    }
                    Err(SessionError::Superseded) => End::Close(CloseCode::Replaced, REPLACED),
                    Err(e) => {
                        tracing::warn!(error = %e, "session start failed");
                        End::Close(CloseCode::InternalError, "dependency unavailable")
                    }
                }
            };
            Box::pin(self.finish(end, &directory)).await
        }
    }

    async fn event_loop(&mut self, mailbox: &Mailbox) -> End {
        let drain = self.env.drain.clone();
        let mut epochs = self.env.epoch.subscribe();
        // The session's one timer, set to whatever is due first (see `next_due`): an
        // idle session sleeps from one ping to the next in the runtime's timer wheel.
        let timer = tokio::time::sleep_until(self.next_due());
        tokio::pin!(timer);
        loop {
            if mailbox.take_lagged() {
                // Dropped pushes are still pending in Redis: read the set again.
                self.backlog.restart();
            }
            if self.budget_turn.as_ref().is_some_and(|t| t.is_served()) {
                // Its turn was served while the session was busy: the read may go.
                self.backlog.resume();
            }
            if let ControlFlow::Break(end) = self.read_backlog().await {
                return end;
            }
            let due = self.next_due();
            if timer.deadline() != due {
                timer.as_mut().reset(due);
            }
            let flow = tokio::select! {
                biased;
                _ = drain.cancelled() => ControlFlow::Break(Box::pin(self.drain()).await),
                () = &mut timer => Box::pin(self.on_timer()).await,
                c = mailbox.next_control() => Box::pin(self.on_control(c)).await,
                () = mailbox.lagged() => ControlFlow::Continue(()),
                Some(answer) = self.requests.join_next(), if !self.requests.is_empty() => Box::pin(self.on_answer(answer)).await,
                // Boxed too: inline, its write and deadline would add 160 bytes to the
                // resting state (see `Session`); one small allocation per push.
                push = mailbox.next_push(), if self.inflight.has_room() => Box::pin(self.on_push(push, mailbox)).await,
                msg = self.socket.next() => Box::pin(self.on_socket(msg)).await,
                // After pushes and the device's own frames: typing and presence wait,
                // and are dropped when their queue fills (gateway.ephemeral_queue).
                e = mailbox.next_ephemeral() => Box::pin(self.on_ephemeral(e)).await,
                // Its turn for the node's backlog budget came: the next page may go. (A
                // turn already served waits for the read that uses it.)
                () = crate::budget::served(&self.budget_turn), if self.budget_turn.as_ref().is_some_and(|t| !t.is_served()) => {
                    self.backlog.resume();
                    ControlFlow::Continue(())
                }
                Ok(()) = epochs.changed() => Box::pin(self.check_epoch()).await,
            };
            if let ControlFlow::Break(end) = flow {
                return end;
            }
            if self.stalled {
                return half_open();
            }
        }
    }

    async fn on_control(&mut self, c: Control) -> Flow {
        match c {
            Control::Replaced => ControlFlow::Break(End::Close(CloseCode::Replaced, REPLACED)),
            Control::Revoked(not_before) => self.on_revoked(not_before),
            Control::Read(position) => {
                self.show_read(position).await;
                self.ping().await;
                ControlFlow::Continue(())
            }
            Control::Status(status) => {
                self.on_status(status).await;
                ControlFlow::Continue(())
            }
        }
    }
}

/// How a session whose writes stalled (a write missed `gateway.write_timeout_ms`) ends.
fn half_open() -> End {
    metrics::counter!("herald_half_open_closes_total").increment(1);
    End::Close(CloseCode::HeartbeatTimeout, "writes stalled: half-open")
}
