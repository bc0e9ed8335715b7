//! Herald's shared crate: what gateways, workers, the load-test and the tests agree on.
//!
//! # Layout
//! - [`ids`]: snowflake message ids and their exact Redis encodings.
//! - [`auth`]: client tokens and identifier rules; [`service_token`]: the tokens of
//!   backends and bots (the server API); [`identity`]: the key sets both are checked
//!   against (per tenant, JWKS, the trust file).
//! - [`config`]: layered, validated configuration.
//! - [`protocol`]: wire frames and gateway/worker messages.
//! - [`error`]: the protocol's error codes.
//! - [`keys`]: the Redis key schema, device keys and presence values;
//!   [`device_state`]: freeing what Redis holds for a device; [`device_epochs`]: the
//!   per-tenant epoch every change of a tenant's receiving devices raises.
//! - [`scripts`]: every Lua script, with its KEYS/ARGV contract.
//! - [`db`]: the MySQL schema (migrations) and pools; [`mysql_server`]: the server's
//!   flavour, version, role (primary or not) and packet limit, checked at start.
//!   [`sql_script`]: multi-statement text scripts, one round trip each.
//! - [`redis`]: Redis connection settings; [`tls`]: rustls settings for every hop.
//! - [`process`]: the process skeleton: cancellation, supervised loops, readiness;
//!   [`dependencies`]: the state of MySQL and Redis as the health loops see it.
//! - [`ops`]: the admin routes (health, readiness, metrics) and the admin guard;
//!   [`process_metrics`]: CPU, memory and descriptors of the process.
//! - [`clock`]: this process's clock against Redis's (the settle window's assumption).
//! - [`telemetry`]: tracing and metrics setup; [`metric_catalog`]: every metric with
//!   its help text; [`otel`]: OpenTelemetry traces of sends (off by default).

pub mod auth;
pub mod clock;
pub mod config;
pub mod db;
pub mod dependencies;
pub mod device_epochs;
pub mod device_state;
pub mod error;
pub mod identity;
pub mod ids;
pub mod keys;
pub mod metric_catalog;
#[cfg(test)]
mod migration_rules;
pub mod mysql_server;
pub mod names;
pub mod ops;
pub mod otel;
pub mod process;
pub mod process_metrics;
pub mod protocol;
pub mod redis;
pub mod runtime;
pub mod scripts;
pub mod service_token;
pub mod sql_script;
pub mod telemetry;
pub mod tls;
