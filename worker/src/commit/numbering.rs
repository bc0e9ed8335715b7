//! Numbering a batch: each new message gets its conversation's next `seq` and a
//! snowflake id, in stream order; every entry gets its answer (repeats answered with
//! their first commit, refusals with their reason).

use std::collections::{BTreeMap, HashMap};

use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::names::Names3;
use herald_shared::protocol::{IngressEntry, SendResult};

use super::{BatchResult, CommitError, ConvState, Outcome, Repeats, CMID_REUSED};
use crate::lease::IdSource;

/// A new message of the batch: (entry, conversation, seq, id).
pub(super) type Planned = (usize, (String, String), u64, MsgId);

/// Numbers the batch's new messages in stream order and answers every entry: repeats
/// with their first commit, refusals with their reason.
pub(super) fn number(
    entries: &[IngressEntry],
    existing: &Repeats,
    convs: &mut BTreeMap<(String, String), ConvState>,
    ids: &IdSource,
    now: u64,
) -> Result<(BatchResult, Vec<Planned>), CommitError> {
    let mut result = BatchResult::default();
    let mut planned: Vec<Planned> = Vec::new();
    // Keyed by borrowed names: no copies per message.
    let mut seen_in_batch: HashMap<(&str, &str, &str), usize> = HashMap::new();
    // (entry, earlier entry of the batch with the same cmid): answered like it.
    let mut repeats: Vec<(usize, usize)> = Vec::new();
    let mut floors = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some(r) = existing.get(&Names3(&e.tenant, &e.user, &e.cmid)) {
            result.outcomes.push(if r.answers(e) {
                Outcome::Done(r.result.clone())
            } else {
                // Not a repeat: another request under a cmid already used.
                Outcome::Rejected(ErrorCode::Conflict, CMID_REUSED.into())
            });
            continue;
        }
        let dedup_key = (e.tenant.as_str(), e.user.as_str(), e.cmid.as_str());
        if let Some(&first) = seen_in_batch.get(&dedup_key) {
            // A placeholder until the first occurrence has its id (below).
            repeats.push((i, first));
            result.outcomes.push(Outcome::Rejected(ErrorCode::Internal, String::new()));
            continue;
        }
        let key = (e.tenant.clone(), e.conv.clone());
        let Some(conv) = convs.get_mut(&key) else {
            result.outcomes.push(Outcome::Rejected(ErrorCode::NotFound, "no such conversation".into()));
            continue;
        };
        if !conv.members.users.contains(&e.user) {
            result.outcomes.push(Outcome::Rejected(ErrorCode::Forbidden, "not a member of this conversation".into()));
            continue;
        }
        conv.last_seq += 1;
        conv.changed = true;
        conv.last_active_at = now as i64;
        floors.push(conv.last_id);
        planned.push((i, key, conv.last_seq, MsgId(0)));
        seen_in_batch.insert(dedup_key, i);
        result.outcomes.push(Outcome::Done(SendResult {
            id: MsgId(0),
            conv: e.conv.clone(),
            seq: conv.last_seq,
            ts: now,
            dup: false,
        }));
    }
    let new_ids = ids.next_ids(&floors)?;
    for (p, id) in planned.iter_mut().zip(new_ids) {
        p.3 = id;
        if let Some(c) = convs.get_mut(&p.1) {
            c.last_id = c.last_id.max(id);
        }
        if let Outcome::Done(r) = &mut result.outcomes[p.0] {
            r.id = id;
        }
    }
    for (i, first) in repeats {
        if let Outcome::Done(r) = &result.outcomes[first] {
            let same = (&entries[i].conv, &entries[i].body) == (&entries[first].conv, &entries[first].body);
            result.outcomes[i] = if same {
                Outcome::Done(SendResult { dup: true, ..r.clone() })
            } else {
                Outcome::Rejected(ErrorCode::Conflict, CMID_REUSED.into())
            };
        }
    }
    Ok((result, planned))
}
