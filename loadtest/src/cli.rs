//! The command line of `herald-loadtest`, parsed by clap: one subcommand per scenario or
//! tool, each option with its type and default, so `--help` is generated and a mistyped
//! option is refused rather than silently left at its default.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand};
use herald_shared::auth::Platform;

use crate::sampler::AdminUrl;

mod action;
mod failover;
mod service_token;
mod soak;
pub use action::Action;
pub use failover::Failover;
pub use service_token::ServiceToken;
pub use soak::Soak;

const AFTER_HELP: &str = "\
Each scenario shows progress, ends with the integrity check and writes <out>/<scenario>.json,
.md and SVG charts; its exit status is 1 when the integrity check (or soak's bounded-state
check) fails, 2 on other errors.
An option given twice takes its last value (--action adds one each time).
`herald-loadtest COMMAND --help` lists a command's options and their defaults.";

#[derive(Debug, Parser)]
#[command(
    name = "herald-loadtest",
    version,
    about = "Herald's load-test suite: scenarios against a running cluster, the canary and the capacity report",
    after_help = AFTER_HELP,
    args_override_self = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Direct conversations, a device online per recipient, sends at --rate msg/s (HTTP or --via ws).
    Steady(Steady),
    /// Groups of --group members online, one sender per group.
    Fanout(Fanout),
    /// Groups of --group members online that type (--rate typing frames/s), then reconnect in turn (presence).
    Typing(Typing),
    /// Devices with a backlog reconnect at once while realtime conversations keep receiving.
    Storm(Storm),
    /// `steady` while each --action SECONDS=COMMAND runs (kill a gateway, restart it, ...).
    Chaos(Chaos),
    /// The first gateway is killed under traffic: its devices reconnect to the others and catch up.
    Failover(Failover),
    /// Idle sessions on one gateway: its memory per connection, and that they still deliver.
    Idle(Idle),
    /// `steady` with devices leaving, joining and reconnecting; fails when kept state keeps growing.
    Soak(Soak),
    /// Durable 1:1 sends over HTTP at full speed (closed loop): throughput and send-ack latency.
    Sends(Sends),
    /// The canary between two probe accounts, exporting herald_probe_* metrics.
    Probe(Probe),
    /// The capacity report from the scenario reports in --dir, next to the design's targets.
    Report(Report),
    /// A client token for --user and --device, printed (for curl and wscat).
    Token(Token),
    /// A service token for the server API (--service, --scope), printed.
    ServiceToken(ServiceToken),
}

/// The JWT secret: `--secret`, or the `HERALD_JWT_SECRET` environment variable.
#[derive(Debug, Clone, Args)]
pub struct Secret {
    /// HS256 secret of client tokens [default: $HERALD_JWT_SECRET].
    #[arg(long = "secret", value_name = "S")]
    value: Option<String>,
}

impl Secret {
    pub fn get(&self) -> Result<String, NoSecret> {
        self.value.clone().or_else(|| std::env::var("HERALD_JWT_SECRET").ok()).ok_or(NoSecret)
    }
}

/// Neither `--secret` nor `HERALD_JWT_SECRET` was given.
#[derive(Debug)]
pub struct NoSecret;

impl fmt::Display for NoSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("--secret or HERALD_JWT_SECRET is required")
    }
}

impl std::error::Error for NoSecret {}

/// Gateway base URLs, comma-separated.
#[derive(Debug, Clone, Args)]
pub struct Gateways {
    /// Gateway base URLs, comma-separated; work is spread over them.
    #[arg(long = "gateways", value_name = "URL,...", value_delimiter = ',', action = ArgAction::Set,
          default_value = "http://127.0.0.1:8080")]
    pub urls: Vec<String>,
    /// PEM file of the CAs that sign `https://` gateways' certificates, trusted instead of
    /// the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

impl Gateways {
    /// Whom to trust for `https://` gateways.
    pub fn tls(&self) -> anyhow::Result<herald_client::Tls> {
        Ok(herald_client::Tls::trusting(self.ca_file.as_deref())?)
    }
}

/// Where a scenario runs, as whom, and where its report goes.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    #[command(flatten)]
    pub gateways: Gateways,
    /// Tenant of the scenario's users.
    #[arg(long, default_value = "bench")]
    pub tenant: String,
    #[command(flatten)]
    pub secret: Secret,
    /// Directory of the reports.
    #[arg(long, value_name = "DIR", default_value = "loadtest-reports")]
    pub out: PathBuf,
    /// Loopback addresses devices connect from, in turn (more ports than one address has).
    #[arg(long, value_name = "IP,...", value_delimiter = ',', action = ArgAction::Set)]
    pub local_ips: Vec<IpAddr>,
    #[command(flatten)]
    pub measure: Measure,
}

/// Where the processes' CPU (and, in `soak`, their memory) is read.
#[derive(Debug, Clone, Default, Args)]
pub struct Measure {
    /// A Herald process's admin listener ([NAME=]URL): its /metrics give its CPU (and, in
    /// soak, its RSS); repeat for more.
    #[arg(long = "admin", value_name = "[NAME=]URL", action = ArgAction::Append)]
    pub admins: Vec<AdminUrl>,
    /// The cluster's Redis (standalone): its CPU from INFO cpu; soak also samples its memory
    /// and keys [soak's default: redis://127.0.0.1:6379/0].
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
}

/// Options `sends` and `probe` accept because every command once shared them; unused.
#[derive(Debug, Clone, Args)]
pub struct Unused {
    #[arg(long, hide = true)]
    out: Option<String>,
    #[arg(long, hide = true)]
    local_ips: Option<String>,
}

/// Live traffic: how fast, how long, how big.
#[derive(Debug, Clone, Args)]
pub struct Traffic {
    /// Sends per second in total; 0 sends as fast as acknowledgements come back.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Seconds of sending.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    pub duration: f64,
    /// Message body size in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 100)]
    pub payload: usize,
    /// How senders send: http (POST /v1/messages) or ws (`send` frames on their own session).
    #[arg(long, value_enum, default_value_t = SendVia::Http)]
    pub via: SendVia,
    /// Sends each sender may have waiting for an answer at once.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub in_flight: u32,
    /// Every N messages a sender edits its latest, the next time recalls it (timeline
    /// events, checked like messages); 0: none.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub change_every: u64,
}

#[derive(Debug, Clone, Args)]
pub struct Steady {
    /// Direct conversations, each with a device online for its recipient.
    #[arg(long, default_value_t = 500)]
    pub conversations: usize,
    #[command(flatten)]
    pub traffic: Traffic,
    /// A shell command run SECONDS after sending starts (a profiler, say); repeat for more.
    #[arg(long, value_name = "SECONDS=COMMAND")]
    pub action: Vec<Action>,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Fanout {
    /// Receiving devices, all online.
    #[arg(long, default_value_t = 2000)]
    pub receivers: usize,
    /// Members per group (at most 1000).
    #[arg(long, default_value_t = 100)]
    pub group: usize,
    #[command(flatten)]
    pub traffic: Traffic,
    /// A shell command run SECONDS after sending starts (a profiler, say); repeat for more.
    #[arg(long, value_name = "SECONDS=COMMAND")]
    pub action: Vec<Action>,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Typing {
    /// Devices, all online, each following the presence of its group's other members.
    #[arg(long, default_value_t = 2000)]
    pub receivers: usize,
    /// Members per group (typing reaches groups of at most `gateway.typing_max_members`,
    /// 100 by default, counting each group's sender).
    #[arg(long, default_value_t = 50)]
    pub group: usize,
    /// Typing frames per second in total, from every device in turn (at most one per
    /// device every 2 s, within the gateway's typing burst).
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Seconds of typing, then as long of presence changes.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    pub duration: f64,
    /// Devices per second that disconnect and connect again in the presence phase (each
    /// twice a change of its user's presence for its followers).
    #[arg(long, value_name = "N", default_value_t = 20.0)]
    pub churn: f64,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Storm {
    /// Devices that reconnect at once.
    #[arg(long, default_value_t = 5000)]
    pub devices: usize,
    /// Messages each device gets while offline.
    #[arg(long, default_value_t = 200)]
    pub backlog: usize,
    /// Members per group of the storm's devices (at most 1000).
    #[arg(long, default_value_t = 50)]
    pub group: usize,
    /// Direct conversations that keep receiving realtime messages.
    #[arg(long, default_value_t = 100)]
    pub realtime: usize,
    /// Realtime messages per second in total.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds of realtime traffic sent before the baseline is measured: the senders'
    /// first requests open their connections and meet the cluster's cold paths.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub warm_up: f64,
    /// Seconds of realtime traffic measured before the storm (after the warm-up).
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub baseline: f64,
    /// true: the devices never connected before and are registered over HTTP, so their
    /// first session also restores its pending set from MySQL.
    #[arg(long, value_name = "BOOL", action = ArgAction::Set, default_value_t = false)]
    pub fresh: bool,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Chaos {
    /// A shell command run SECONDS after sending starts; repeat for more.
    #[arg(long, value_name = "SECONDS=COMMAND", required = true)]
    pub action: Vec<Action>,
    /// Direct conversations, each with a device online for its recipient.
    #[arg(long, default_value_t = 300)]
    pub conversations: usize,
    #[command(flatten)]
    pub traffic: Traffic,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Idle {
    /// The gateway whose memory is measured (the first of --gateways).
    #[arg(long, value_name = "PID")]
    pub gateway_pid: u32,
    /// Idle sessions to open.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Members per group (at most 1000); one message into every group checks delivery.
    #[arg(long, default_value_t = 500)]
    pub group: usize,
    /// Sessions opened per second.
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// Seconds the sessions are held idle.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub hold: f64,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Args)]
pub struct Sends {
    #[command(flatten)]
    pub gateways: Gateways,
    /// Tenant of the senders.
    #[arg(long, default_value = "bench")]
    pub tenant: String,
    #[command(flatten)]
    pub secret: Secret,
    /// Direct conversations between pairs of users.
    #[arg(long, default_value_t = 200)]
    pub conversations: usize,
    /// Concurrent senders, each sending its next message after the previous `200`.
    #[arg(long, default_value_t = 200)]
    pub senders: usize,
    /// Seconds of sending.
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    pub duration: u64,
    /// Message body size in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 100)]
    pub payload: usize,
    /// Also write the summary to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub unused: Unused,
}

#[derive(Debug, Clone, Args)]
pub struct Probe {
    #[command(flatten)]
    pub gateways: Gateways,
    /// Tenant of the probe accounts.
    #[arg(long, default_value = "probe")]
    pub tenant: String,
    #[command(flatten)]
    pub secret: Secret,
    /// Names the probe accounts (NAME-a, NAME-b) and their conversation.
    #[arg(long, default_value = "canary")]
    pub name: String,
    /// Token of the first probe account, instead of a secret: a credential that acts
    /// in the probe's tenant only (mint it with `token --platform probe`); its tenant
    /// and user are the accounts' [default: $PROBE_TOKEN_A].
    #[arg(long, value_name = "JWT")]
    pub token_a: Option<String>,
    /// Token of the second probe account, with --token-a [default: $PROBE_TOKEN_B].
    #[arg(long, value_name = "JWT")]
    pub token_b: Option<String>,
    /// Milliseconds between the messages of each side.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_ms: u64,
    /// A message not received within this many milliseconds counts as lost.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub loss_after_ms: u64,
    /// Address of the probe's /metrics and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9099")]
    pub listen: SocketAddr,
    /// Seconds to run; 0 runs forever.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub duration: u64,
    /// With --duration: exit non-zero unless messages went both ways and none was lost,
    /// duplicated or reordered (a deployment check, such as `helm test`).
    #[arg(long)]
    pub fail_on_loss: bool,
    #[command(flatten)]
    pub unused: Unused,
}

#[derive(Debug, Clone, Args)]
pub struct Report {
    /// Directory of the scenario reports (<scenario>.json).
    #[arg(long)]
    pub dir: PathBuf,
    /// The capacity report to write.
    #[arg(long, value_name = "FILE", default_value = "docs/capacity-report.md")]
    pub out: PathBuf,
    /// The machine the numbers come from, as the report names it.
    #[arg(long, value_name = "TEXT", default_value = "not recorded")]
    pub machine: String,
}

#[derive(Debug, Clone, Args)]
pub struct Token {
    /// The user the token is for.
    #[arg(long)]
    pub user: String,
    /// The user's device.
    #[arg(long)]
    pub device: String,
    #[arg(long, default_value = "acme")]
    pub tenant: String,
    /// ios, android, web, desktop, server or probe.
    #[arg(long, default_value = "ios", value_parser = platform)]
    pub platform: Platform,
    /// How long the token is valid, in seconds.
    #[arg(long, default_value_t = 86_400)]
    pub ttl_s: u64,
    /// The `kid` of the key (a trust file's key with a `kid`); none by default.
    #[arg(long)]
    pub kid: Option<String>,
    #[command(flatten)]
    pub secret: Secret,
}

fn platform(s: &str) -> Result<Platform, String> {
    serde_json::from_value(serde_json::Value::String(s.into())).map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;

/// How the senders send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SendVia {
    /// `POST /v1/messages`, one request per message.
    #[default]
    Http,
    /// `send` frames on the sender's own WebSocket session, answered by `sent`.
    Ws,
}

impl SendVia {
    pub fn name(self) -> &'static str {
        match self {
            SendVia::Http => "http",
            SendVia::Ws => "ws",
        }
    }
}
