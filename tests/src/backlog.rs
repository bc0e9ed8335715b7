//! A device's backlog: the ids in its pending set.

use std::collections::BTreeSet;

use fred::prelude::*;
use herald_shared::keys::Keys;

use crate::TENANT;

/// The ids in a device's pending set.
pub async fn pending_ids(redis: &Client, keys: &Keys, user: &str, device: &str) -> BTreeSet<u64> {
    let members: Vec<String> =
        redis.zrange(keys.pending(TENANT, user, device), 0, -1, None, false, None, false).await.expect("zrange");
    members.iter().map(|m| m.parse::<u64>().expect("fixed-width id member")).collect()
}
