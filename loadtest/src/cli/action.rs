//! A chaos action (`--action SECONDS=COMMAND`): a shell command and when it runs.

use anyhow::{ensure, Context};

/// A chaos action: a shell command run `at` seconds after sending starts.
#[derive(Clone, Debug)]
pub struct Action {
    pub at: f64,
    pub command: String,
}

impl std::str::FromStr for Action {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Action> {
        let (at, command) = s.split_once('=').context("an action is SECONDS=COMMAND")?;
        let at: f64 = at.trim().parse().with_context(|| format!("action time {at:?} is not a number of seconds"))?;
        ensure!(!command.trim().is_empty(), "action at {at} s has no command");
        Ok(Action { at, command: command.trim().to_owned() })
    }
}
