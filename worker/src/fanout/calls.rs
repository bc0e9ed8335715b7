//! Which users of a fan-out go in which call of the fan-out script.

use std::collections::BTreeMap;

use herald_shared::keys::Keys;

use super::UserPlan;

/// Pending entries per script call at most: a call runs alone in Redis, so a large
/// fan-out is cut into calls of about this many entries (a few milliseconds each).
pub(super) const CALL_ENTRIES: usize = 2_048;

/// The script calls of a fan-out: indexes into `plans`, each call's users sharing a
/// cluster slot (any users on a single Redis), at most [`CALL_ENTRIES`] pending entries
/// per call (a user larger than that gets a call of its own). One call per user cost
/// Redis more than the entries themselves.
pub(super) fn calls(keys: &Keys, plans: &[(&(String, String), &UserPlan)], clustered: bool) -> Vec<Vec<usize>> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, ((tenant, user), _)) in plans.iter().enumerate() {
        let slot = if clustered { fred::util::redis_keyslot(keys.presence(tenant, user).as_bytes()) } else { 0 };
        by_slot.entry(slot).or_default().push(i);
    }
    let mut calls = Vec::new();
    for users in by_slot.into_values() {
        let (mut call, mut entries) = (Vec::new(), 0);
        for i in users {
            let size: usize = plans[i].1.values().map(Vec::len).sum();
            if !call.is_empty() && entries + size > CALL_ENTRIES {
                calls.push(std::mem::take(&mut call));
                entries = 0;
            }
            call.push(i);
            entries += size;
        }
        calls.push(call);
    }
    calls
}
