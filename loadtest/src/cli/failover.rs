//! The options of `failover`: how many devices the killed gateway holds, the traffic
//! they keep receiving, and the command that kills it.

use clap::Args;

use super::TargetArgs;

#[derive(Debug, Clone, Args)]
pub struct Failover {
    /// The command that kills the first of --gateways (SIGKILL, say `kill -9 PID`); run
    /// by `sh -c` after the baseline. It must not restart the gateway.
    #[arg(long, value_name = "COMMAND")]
    pub kill: String,
    /// Devices with a session on the first gateway, which reconnect to the others.
    #[arg(long, default_value_t = 10_000)]
    pub devices: usize,
    /// Members per group of the devices (at most 1000); one sender per group.
    #[arg(long, default_value_t = 50)]
    pub group: usize,
    /// Messages per second into the groups in total, sent over HTTP through the other
    /// gateways, before, during and after the storm (deliveries: --rate x --group).
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Seconds of traffic measured before the kill.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub baseline: f64,
    /// Seconds of traffic after every device caught up again.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub after: f64,
    /// Seconds the devices have to catch up, on the first gateway and again after the kill.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub limit: f64,
    /// Sessions per second opened on the first gateway before the kill (0: all at once).
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    #[command(flatten)]
    pub target: TargetArgs,
}
