//! Which users of a fan-out go in which call of the fan-out script.

use herald_shared::keys::Keys;

use super::UserPlan;

/// Pending entries per script call at most: a call runs alone in Redis, so a large
/// fan-out is cut into calls of about this many entries (a few milliseconds each).
pub(super) const CALL_ENTRIES: usize = 2_048;

/// The script calls of a fan-out: indexes into `plans`, each call's users sharing a
/// cluster slot (any users on a single Redis), at most [`CALL_ENTRIES`] pending entries
/// per call (a user larger than that gets a call of its own). One call per user cost
/// Redis more than the entries themselves.
pub(super) fn calls(keys: &Keys, plans: &[(&(&str, &str), &UserPlan)], clustered: bool) -> Vec<Vec<usize>> {
    let users = plans
        .iter()
        .map(|((tenant, user), plan)| (keys.presence(tenant, user), plan.values().map(Vec::len).sum::<usize>()));
    herald_shared::redis::calls_by_slot(users, clustered, CALL_ENTRIES)
}
