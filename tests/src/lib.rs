//! Test harness: a fresh database and Redis key prefix per test, real `herald-worker`
//! and `herald-gateway` processes on ports they pick themselves, private Redis servers
//! for fault tests.
//!
//! The binaries are the workspace's own (`cargo build --bins` first; the test
//! command in the README does it). Every process is killed when its cluster drops.
//!
//! # Layout
//! - [`Cluster`] (`cluster`): one test's database, key prefix and processes.
//! - [`RedisServer`] (`redis_server`): a private `redis-server` a test may kill.
//! - [`AdminClient`] (`admin`): the worker's admin API.
//! - [`AutoDevice`] (`device`): a device that acks everything and records what it saw.
//! - [`fill_backlog`], [`pending_ids`] (`backlog`): filling a device's backlog, and what
//!   it holds.
//! - [`send_frame`], [`ack_frame`] (`frames`): client frames tests build often.
//! - `Cluster::service` (`service`): a backend's client of the server API.
//! - [`eventually`] (`wait`): polling until a condition holds.
//! - [`statements_waiting`] (`locks`): statements waiting, for a row lock held by the test.
//! - [`WireTap`] (`wiretap`): a proxy that records what a client puts on the wire.
//! - [`run_scenario`] (`scenario`): a load-test scenario against a cluster, its report.
//! - [`drill`], [`faults`], [`redis_cluster`]: fault drills, injected faults, Redis Cluster;
//!   [`replication`]: a MariaDB primary with a semi-synchronous replica.

mod admin;
mod backlog;
mod cluster;
mod device;
mod frames;
mod locks;
mod redis_server;
mod scenario;
mod service;
mod streams;
mod wait;
mod wiretap;

pub mod drill;
pub mod faults;
pub mod redis_cluster;
pub mod replication;

pub use admin::AdminClient;
pub use backlog::{fill_backlog, pending_ids, Fill};
pub use cluster::{bin, shared_redis_url, Cluster, Proc};
pub use device::{AutoDevice, Seen};
pub use frames::{ack_frame, send_frame};
pub use locks::statements_waiting;
pub use redis_server::{free_port, spawn_redis_server, RedisServer};
pub use scenario::{assert_clean, run_scenario, scenario_cluster, scenario_out};
pub use service::service_token;
pub use streams::entries_added;
pub use wait::eventually;
pub use wiretap::{Tapped, WireTap};

pub const SECRET: &str = "test-secret-0123456789abcdef";
/// The gateways' `service_secret`: the key of service tokens (the server API).
pub const SERVICE_SECRET: &str = "test-service-secret-0123456789";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const TENANT: &str = "acme";
