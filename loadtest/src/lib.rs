//! `herald-loadtest`: measures Herald from the outside, through its public API, with the
//! client library's devices; every scenario ends with the integrity check.
//!
//! - [`scenarios`]: `steady`, `fanout`, `storm`, `chaos`, `idle`.
//! - [`sends`]: durable sends over HTTP at full speed (closed loop).
//! - [`probe`]: the canary between probe accounts, with `herald_probe_*` metrics.
//! - [`engine`]: provisioning, senders, the recorder and progress display.
//! - [`integrity`]: the check (tested on doctored logs).
//! - [`report`]: JSON, Markdown, SVG charts and the capacity report.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

pub mod engine;
pub mod integrity;
pub mod probe;
pub mod report;
pub mod scenarios;
pub mod sends;

/// `--name value` options; a name may repeat (`--action`).
#[derive(Debug, Default)]
pub struct Args(HashMap<String, Vec<String>>);

impl Args {
    /// The command and its options.
    pub fn parse(argv: &[String]) -> Result<(String, Args)> {
        let mut it = argv.iter();
        let cmd = it.next().cloned().unwrap_or_default();
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else { bail!("unexpected argument {a:?}") };
            let value = it.next().with_context(|| format!("--{name} needs a value"))?;
            map.entry(name.to_string()).or_default().push(value.clone());
        }
        Ok((cmd, Args(map)))
    }

    /// The last value given for `name`.
    pub fn opt(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|v| v.last()).map(String::as_str)
    }

    /// Every value given for `name`, in order.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0.get(name).cloned().unwrap_or_default()
    }

    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.opt(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| anyhow::anyhow!("--{name}: cannot parse {v:?}")),
        }
    }

    pub fn text(&self, name: &str, default: &str) -> String {
        self.opt(name).unwrap_or(default).to_string()
    }

    pub fn secret(&self) -> Result<String> {
        self.opt("secret")
            .map(str::to_owned)
            .or_else(|| std::env::var("HERALD_JWT_SECRET").ok())
            .context("--secret or HERALD_JWT_SECRET is required")
    }

    /// Names given that `known` does not list: a typo must not silently use a default.
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        let mut unknown: Vec<&str> = self.0.keys().map(String::as_str).filter(|k| !known.contains(k)).collect();
        unknown.sort_unstable();
        if !unknown.is_empty() {
            bail!("unknown option(s): --{}", unknown.join(", --"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_repeat_and_typos_are_refused() {
        let argv: Vec<String> =
            ["chaos", "--action", "1=a", "--action", "2=b", "--rate", "5"].map(String::from).to_vec();
        let (cmd, args) = Args::parse(&argv).unwrap();
        assert_eq!(cmd, "chaos");
        assert_eq!(args.all("action"), ["1=a", "2=b"]);
        assert_eq!(args.get("rate", 0.0).unwrap(), 5.0);
        assert!(args.get::<u32>("rate", 0).is_ok());
        assert!(args.check_known(&["action"]).unwrap_err().to_string().contains("--rate"));
        assert!(Args::parse(&["x".into(), "--rate".into()]).is_err(), "a flag without value");
    }
}
