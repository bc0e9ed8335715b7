//! `herald-loadtest`: measures Herald from the outside, through its public API, with the
//! client library's devices; every scenario ends with the integrity check.
//!
//! - [`cli`]: the command line (clap), every command's options and defaults.
//! - [`scenarios`]: `steady`, `fanout`, `storm`, `chaos`, `failover`, `idle`, `soak`, `typing`.
//! - [`senders`]: the scenarios' senders, over HTTP or WebSocket, on an open-loop schedule.
//! - [`load`]: schedules, offered against achieved load, and which side was the limit.
//! - [`pacer`]: wake-ups at due times finer than tokio's 1 ms timer.
//! - [`sends`]: durable sends over HTTP at full speed (closed loop).
//! - [`probe`]: the canary between probe accounts, with `herald_probe_*` metrics.
//! - [`engine`]: provisioning, devices, senders, settling and the check.
//! - [`cpu`]: CPU per message of every process, read before and after the send window.
//! - [`recorder`]: histograms, per-tick series and the progress line.
//! - [`integrity`]: the check (tested on doctored logs).
//! - [`report`]: JSON, Markdown, SVG charts and the capacity report.
//! - [`sampler`]: what `soak` samples: Redis, MySQL and the processes' `/metrics`.
//! - [`slope`]: the slope test: does a sampled series keep growing?
//! - [`soak_report`]: the soak's series judged, their table and charts.

pub mod chart;
pub mod cli;
pub mod cpu;
pub mod engine;
pub mod integrity;
pub mod load;
pub mod pacer;
pub mod probe;
pub mod recorder;
pub mod report;
pub mod sampler;
pub mod scenarios;
pub mod senders;
pub mod sends;
pub mod slope;
pub mod soak_report;
