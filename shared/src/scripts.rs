//! Every Lua script Herald runs, in one place. Each script's source is a file in
//! `shared/src/lua/` whose header states its KEYS/ARGV contract; scripts run by
//! `EVALSHA`; one Redis does not know yet (after a restart, a failover) runs by `EVAL`
//! with its source, and for pipelined ones the scripts are loaded (on every master of a
//! cluster) and the pipeline is sent again.

use std::sync::OnceLock;

use fred::error::Error;
use fred::prelude::{Client, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{FromValue, MultipleKeys, MultipleValues};

/// One Lua script.
#[derive(Debug)]
pub struct Lua {
    name: &'static str,
    source: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    const fn new(name: &'static str, source: &'static str) -> Lua {
        Lua { name, source, script: OnceLock::new() }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The script with its SHA-1, for `EVALSHA` in pipelines.
    pub fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::from_lua(self.source))
    }

    /// Runs the script: `EVALSHA`, and on `NOSCRIPT` `EVAL` with its source, which runs
    /// it and loads it in one command. (Loading it first and calling it by hash again
    /// would leave a window for Redis to forget it once more, a `SCRIPT FLUSH` or a
    /// failover in between, and fail the call.)
    pub async fn call<R, K, V>(&self, client: &Client, keys: K, args: V) -> Result<R, Error>
    where
        R: FromValue,
        K: Into<MultipleKeys> + Send,
        V: TryInto<MultipleValues> + Send,
        V::Error: Into<Error> + Send,
    {
        let keys: MultipleKeys = keys.into();
        let args: MultipleValues = args.try_into().map_err(Into::into)?;
        match client.evalsha(self.script().sha1().clone(), keys.clone(), args.clone()).await {
            Err(e) if e.details().starts_with("NOSCRIPT") => client.eval(self.source, keys, args).await,
            result => result,
        }
    }
}

macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $($(#[$doc])* pub static $name: Lua = Lua::new($file, include_str!(concat!("lua/", $file, ".lua")));)*
        /// Every script, for tests and for loading them all at once.
        pub static ALL: &[&Lua] = &[$(&$name),*];
    };
}

scripts! {
    /// Adds committed messages to the pending sets (with the cap) of the devices of
    /// users whose keys share a cluster slot, and reports where each device is connected.
    FANOUT = "fanout";
    /// Stores a fan-out run's frames whose keys share a cluster slot, with their expiry.
    FRAMES_SET = "frames_set";
    /// Records a read position for one user's devices and reports their presence.
    READS_RECORD = "reads_record";
    /// Removes acked ids from the pending sets of devices whose keys share a cluster slot.
    ACKS_REMOVE = "acks_remove";
    /// Removes read positions a device confirmed.
    READS_CONFIRM = "reads_confirm";
    /// The next backlog page after a cursor, exact above 2^53.
    PENDING_PAGE = "pending_page";
    /// Sets a device's presence, returning the session it replaces.
    PRESENCE_SET = "presence_set";
    /// Keeps a device's presence alive, setting it again when it vanished.
    PRESENCE_KEEP = "presence_keep";
    /// Clears a device's presence if it is still this session's.
    PRESENCE_CLEAR = "presence_clear";
    /// Drops presence entries that still name sessions of a gateway gone (or of its
    /// previous life), reporting the devices still connected.
    PRESENCE_DROP = "presence_drop";
    /// What bounds a device's watermark (oldest pending or overflowed id), if its set
    /// is trusted in this epoch.
    OLDEST_IF_TRUSTED = "oldest_if_trusted";
    /// Widens a device's overflow band (read from MySQL instead of the pending set) and
    /// marks its pending set trusted in the epoch.
    OVERFLOW_WIDEN = "overflow_widen";
    /// Moves a device's overflow band up as the device catches up, or removes it.
    OVERFLOW_ADVANCE = "overflow_advance";
    /// Starts a new epoch when a shard's master changed its replication id (a promoted
    /// replica), for a standalone Redis and for each master of a cluster.
    REPLIDS_CHECK = "replids_check";
    /// Raises a conversation's highest seq fanned out (never lowers it).
    SEQ_RAISE = "seq_raise";
    /// Renews a lease held by this token.
    LEASE_RENEW = "lease_renew";
    /// Releases a lease held by this token.
    LEASE_RELEASE = "lease_release";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_states_its_contract_and_has_a_distinct_hash() {
        let mut hashes = std::collections::HashSet::new();
        for s in ALL {
            assert!(s.source().contains("-- KEYS:"), "{} does not state its KEYS", s.name());
            assert!(s.source().contains("ARGV:"), "{} does not state its ARGV", s.name());
            assert!(s.source().contains("-- Returns:"), "{} does not state what it returns", s.name());
            assert!(hashes.insert(s.script().sha1().to_string()), "{}", s.name());
        }
        assert_eq!(ALL.len(), 17);
    }
}
