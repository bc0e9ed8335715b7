//! What the HTTP handlers share: the node's services, bundled for axum's `State`.
//! Only the HTTP handlers take it; every lower module takes the handles it
//! needs.

use std::ops::Deref;
use std::sync::Arc;

use herald_shared::config::Config;
use sqlx::mysql::MySqlPool;
use tokio_util::task::TaskTracker;

use crate::devices::DeviceRegistry;
use crate::history::History;
use crate::ingress::Ingress;
use crate::limits::NodeLimits;
use crate::roster::Roster;
use crate::session::SessionEnv;

#[derive(Debug)]
pub struct Gateway {
    pub cfg: Arc<Config>,
    /// For the conversations API.
    pub db: MySqlPool,
    pub history: History,
    pub ingress: Ingress,
    pub devices: DeviceRegistry,
    pub limits: Arc<NodeLimits>,
    /// Presence queries (`GET /v1/presence`).
    pub roster: Roster,
    /// What each WebSocket session is given: shared, not copied per session.
    pub sessions: Arc<SessionEnv>,
    /// Every WebSocket task: axum does not track upgraded sockets, and a drain waits
    /// for them.
    pub session_tasks: TaskTracker,
}

#[derive(Clone, Debug)]
pub struct AppState(pub Arc<Gateway>);

impl Deref for AppState {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.0
    }
}
