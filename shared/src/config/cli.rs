//! The command line every Herald process shares: configuration flags, then commands.

use std::fmt;
use std::path::PathBuf;

use super::{env_name, ConfigError};

/// What the command line said, besides configuration keys.
#[derive(Debug, Default, Clone)]
pub struct Cli {
    /// Positional words (subcommands), in order.
    pub args: Vec<String>,
    /// `HERALD_*` variables that name no key. Not fatal: orchestrators set such
    /// variables themselves (Kubernetes: `HERALD_SERVICE_HOST` for a Service named
    /// herald). Logged as warnings once tracing is up.
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
}

const SHORTCUTS: &[Shortcut] = &[
    Shortcut { flag: "--listen", key: "listen" },
    Shortcut { flag: "--admin-listen", key: "admin_listen" },
    Shortcut { flag: "--node-id", key: "node_id" },
    Shortcut { flag: "--mysql-url", key: "mysql_url" },
    Shortcut { flag: "--redis-url", key: "redis_url" },
];

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
    p
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
    fn a_flag_without_its_value_or_unknown_is_an_error() {
        let p = parse(&argv(&["--wat", "--set", "novalue", "--config"]));
        let keys: Vec<&str> = p.errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["--wat", "--set", "--config"]);
    }
}
