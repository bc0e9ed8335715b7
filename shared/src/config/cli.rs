//! The command line the gateway and the worker share: configuration flags, commands and
//! `--help`.

use std::fmt::{self, Write as _};
use std::path::PathBuf;

use super::{env_name, keys, ConfigError, DefaultText, Role};

/// What the command line said, besides configuration keys.
#[derive(Debug, Default, Clone)]
pub struct Cli {
    /// Positional words (subcommands), in order.
    pub args: Vec<String>,
    /// `HERALD_*` variables that name no key and are still allowed: the ones
    /// orchestrators set themselves (Kubernetes: `HERALD_SERVICE_HOST` for a Service
    /// named herald). Any other unknown `HERALD_*` variable is an error.
    pub ignored_env: Vec<String>,
    /// Deprecated keys that were used (and applied to their replacements). Logged as
    /// warnings once tracing is up.
    pub deprecated: Vec<Deprecated>,
}

/// A deprecated key that was given, and the key it was applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecated {
    /// The old name and where it came from: `worker.pending_cap (HERALD_WORKER__PENDING_CAP)`.
    pub given: String,
    pub replacement: &'static str,
}

impl fmt::Display for Deprecated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is deprecated; use {} ({})", self.given, self.replacement, env_name(self.replacement))
    }
}

/// A flag that sets a configuration key, besides `--set`.
struct Shortcut {
    flag: &'static str,
    key: &'static str,
    /// Its value, as `--help` names it.
    value: &'static str,
}

const SHORTCUTS: &[Shortcut] = &[
    Shortcut { flag: "--listen", key: "listen", value: "ADDR" },
    Shortcut { flag: "--admin-listen", key: "admin_listen", value: "ADDR" },
    Shortcut { flag: "--node-id", key: "node_id", value: "ID" },
    Shortcut { flag: "--mysql-url", key: "mysql_url", value: "URL" },
    Shortcut { flag: "--redis-url", key: "redis_url", value: "URL" },
];

const HELP_FLAGS: &[&str] = &["--help", "-h"];
const VERSION_FLAGS: &[&str] = &["--version", "-V"];

/// Switches of commands, kept in [`Cli::args`] for the command to read.
const SWITCHES: &[&str] = &["--dry-run"];

/// The command line, read.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    /// `--config FILE`.
    pub file: Option<PathBuf>,
    /// `--set key=value` and the shortcuts, in order.
    pub sets: Vec<(String, String)>,
    /// Commands and their switches.
    pub args: Vec<String>,
    /// `--help`, `-h`, or `help` as the command.
    pub help: bool,
    /// `--version` or `-V`.
    pub version: bool,
    pub errors: Vec<ConfigError>,
}

/// Reads `argv` (without the program name). `--name value` and `--name=value` both work.
pub(super) fn parse(argv: &[String]) -> Parsed {
    let mut p = Parsed::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value =
            |name: &str| inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| format!("{name} needs a value"));
        let mut error = |key: &str, message: String| p.errors.push(ConfigError { key: key.into(), message });
        match name.as_str() {
            "--config" => match value("--config") {
                Ok(v) => p.file = Some(v.into()),
                Err(e) => error("--config", e),
            },
            "--set" => match value("--set").map(|v| v.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))) {
                Ok(Some(kv)) => p.sets.push(kv),
                _ => error("--set", "expects key=value".into()),
            },
            flag if HELP_FLAGS.contains(&flag) => p.help = true,
            flag if VERSION_FLAGS.contains(&flag) => p.version = true,
            flag if SWITCHES.contains(&flag) => p.args.push(name.clone()),
            flag => match SHORTCUTS.iter().find(|s| s.flag == flag) {
                Some(s) => match value(flag) {
                    Ok(v) => p.sets.push((s.key.into(), v)),
                    Err(e) => error(flag, e),
                },
                None if flag.starts_with('-') => error(flag, "unknown flag".into()),
                None => p.args.push(name.clone()),
            },
        }
    }
    p.help |= p.args.first().is_some_and(|a| a == "help");
    p
}

/// Whether `argv` (without the program name) asks for help: `--help`, `-h`, or the
/// command `help`. Checked before loading, so help needs no configuration at all.
pub fn help_requested(argv: &[String]) -> bool {
    parse(argv).help
}

/// Whether `argv` asks for the version (`--version`, `-V`); like help, it needs no
/// configuration.
pub fn version_requested(argv: &[String]) -> bool {
    parse(argv).version
}

/// What `--version` prints: the program, the release and the commit it was built from
/// (`HERALD_GIT_COMMIT` at build time, `unknown` without it).
pub fn version(program: &str) -> String {
    format!("{program} {} (commit {})\n", env!("CARGO_PKG_VERSION"), crate::metric_catalog::build_commit())
}

/// The command both binaries take to validate a configuration without running.
pub const CHECK_CONFIG: Command = Command {
    usage: "check-config",
    about: "Load and validate the configuration (file, environment, flags), report every problem, and exit: 0 valid, 2 not.",
};

/// What `check-config` prints for a configuration that loaded: the role, the variables
/// allowed although they name no key, and the deprecated keys used.
pub fn check_config_report(program: &str, role: Role, cli: &Cli) -> String {
    let mut out = format!("{program}: the configuration is valid for the {}\n", role.name());
    for var in &cli.ignored_env {
        let _ = writeln!(out, "  {var}: not a configuration key (an orchestrator's variable); ignored");
    }
    for old in &cli.deprecated {
        let _ = writeln!(out, "  {old}");
    }
    out
}

/// A command of a binary, for its `--help`.
#[derive(Debug, Clone, Copy)]
pub struct Command {
    /// The command and its switches: `rebuild-projections [--dry-run]`.
    pub usage: &'static str,
    pub about: &'static str,
}

/// The `--help` text of a Herald binary: its commands, the flags every process takes,
/// how the layers combine, and the keys this role reads with their defaults.
pub fn usage(program: &str, role: Role, about: &str, commands: &[Command]) -> String {
    let mut out = format!("{program}: {about}\n\nUsage: {program}");
    if !commands.is_empty() {
        out += " [COMMAND]";
    }
    out += " [OPTIONS]\n";
    let mut section = |title: &str, rows: Vec<(String, String)>| {
        let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        let _ = writeln!(out, "\n{title}:");
        for (left, right) in rows {
            let _ = writeln!(out, "  {left:<width$}  {right}");
        }
    };
    if !commands.is_empty() {
        section("Commands", commands.iter().map(|c| (c.usage.to_string(), c.about.to_string())).collect());
    }
    let mut flags = vec![
        ("--config FILE".to_string(), "Read a TOML file of keys ([section] tables); also HERALD_CONFIG.".to_string()),
        ("--set KEY=VALUE".into(), "Set any key below; repeatable.".into()),
    ];
    let reads = |key: &str| keys().any(|k| k.name == key && k.roles.contains(&role));
    flags.extend(
        SHORTCUTS
            .iter()
            .filter(|s| reads(s.key))
            .map(|s| (format!("{} {}", s.flag, s.value), format!("Same as --set {}={}.", s.key, s.value))),
    );
    flags.push(("-h, --help".into(), "Print this help and exit.".into()));
    flags.push(("-V, --version".into(), "Print the version and the commit, and exit.".into()));
    section("Options", flags);
    let keys: Vec<(String, String)> = keys()
        .filter(|k| k.roles.contains(&role))
        .map(|k| {
            let default = match k.default {
                DefaultText::Value("") => String::new(),
                DefaultText::Value(v) => format!(" [default: {v}]"),
                DefaultText::Described(d) => format!(" [default: {}]", d.replace('`', "")),
            };
            (k.name.to_string(), format!("{}{default}", k.about.replace('`', "")))
        })
        .collect();
    section(&format!("Configuration keys the {} reads", role.name()), keys);
    out += "\nLayers, later ones winning: defaults, the file, HERALD_* environment variables, flags.\n\
            A key's variable is HERALD_ and the key in capitals, __ for the dot:\n\
            outbox.max_attempts is HERALD_OUTBOX__MAX_ATTEMPTS. Every problem is reported at once (exit status 2).\n";
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::argv;
    use super::*;

    #[test]
    fn flags_take_their_value_inline_or_next() {
        let p = parse(&argv(&["--listen=0.0.0.0:1", "--node-id", "n", "--set", "log=debug", "migrate", "--dry-run"]));
        let sets: Vec<(&str, &str)> = p.sets.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(sets, [("listen", "0.0.0.0:1"), ("node_id", "n"), ("log", "debug")]);
        assert_eq!(p.args, ["migrate", "--dry-run"]);
        assert!(p.errors.is_empty());
    }

    #[test]
    fn help_is_asked_by_flag_or_command_but_not_by_a_value() {
        for words in [&["--help"][..], &["-h"], &["help"], &["migrate", "--help"], &["--set", "log=x", "-h"]] {
            assert!(help_requested(&argv(words)), "{words:?}");
        }
        for words in [&[][..], &["migrate"], &["--set", "log=--help"], &["migrate", "help"]] {
            assert!(!help_requested(&argv(words)), "{words:?}");
        }
    }

    #[test]
    fn usage_lists_commands_flags_and_the_role_s_keys() {
        let commands = [Command { usage: "migrate", about: "Apply the schema." }];
        let text = usage("herald-worker", Role::Worker, "the worker.", &commands);
        for expected in [
            "Usage: herald-worker [COMMAND] [OPTIONS]",
            "migrate",
            "--set KEY=VALUE",
            "--admin-listen ADDR",
            "-h, --help",
            "outbox.max_attempts",
            "[default: 5]",
            "delivery.pending_cap",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
        }
        assert!(!text.contains("gateway.heartbeat_ms"), "the worker does not read gateway keys");
        assert!(!text.contains("--listen"), "nor the client API's address");
        let text = usage("herald-gateway", Role::Gateway, "the gateway.", &[]);
        assert!(text.contains("Usage: herald-gateway [OPTIONS]") && text.contains("gateway.heartbeat_ms"), "{text}");
    }

    #[test]
    fn loading_ignores_the_help_flag() {
        let (_, cli) = super::super::load(
            Role::Gateway,
            &argv(&["--help"]),
            &super::super::testing::env(&[super::super::testing::SECRET]),
        )
        .unwrap();
        assert!(cli.args.is_empty());
    }

    #[test]
    fn version_is_asked_by_flag_and_names_the_release() {
        assert!(version_requested(&argv(&["--version"])) && version_requested(&argv(&["-V", "migrate"])));
        assert!(!version_requested(&argv(&["--set", "log=--version"])) && !help_requested(&argv(&["--version"])));
        assert!(version("herald-worker").starts_with(&format!("herald-worker {} (commit ", env!("CARGO_PKG_VERSION"))));
    }

    #[test]
    fn a_flag_without_its_value_or_unknown_is_an_error() {
        let p = parse(&argv(&["--wat", "--set", "novalue", "--config"]));
        let keys: Vec<&str> = p.errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["--wat", "--set", "--config"]);
    }
}
