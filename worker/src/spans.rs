//! The worker's spans of traced sends (`otel.*`): `herald.commit`, a child of the
//! gateway's `herald.send` whose context came in the ingress entry, and
//! `herald.fanout`, a child of the commit's. Work is done for many sends at once (a
//! transaction, a fan-out), so each traced send gets a span of its own over the shared
//! work, with the send's own outcome. Sends that are not traced carry no context and
//! cost nothing here; with tracing off nothing here runs past its first check.
//!
//! `herald.push` is the push dispatcher's (`push::traces`).

use std::collections::HashMap;
use std::time::SystemTime;

use herald_shared::ids::MsgId;
use herald_shared::otel::span::{COMMIT, FANOUT};
use herald_shared::otel::{attr, HeraldSpan, SpanKind, TraceParent, Tracer};
use herald_shared::protocol::IngressEntry;

use crate::commit::{BatchResult, Outcome};
use crate::fanout::FanoutError;

/// When the shared work began; `None` with tracing off (not even the clock is read).
pub fn begin(tracer: &Tracer) -> Option<SystemTime> {
    tracer.is_on().then(SystemTime::now)
}

/// Records the commit span of every traced send of a committed group (`started` to
/// now), and makes each committed message's span its parent for the fan-out. `results`
/// are the group's batches: each one's entries and their outcomes, in order.
pub fn commits(
    tracer: &Tracer,
    started: Option<SystemTime>,
    results: &[(&[IngressEntry], &[Outcome])],
    committed: &mut [BatchResult],
) {
    let Some(started) = started else { return };
    let batch: usize = results.iter().map(|(entries, _)| entries.len()).sum();
    let mut parents: HashMap<MsgId, TraceParent> = HashMap::new();
    for (e, outcome) in results.iter().flat_map(|(entries, outcomes)| entries.iter().zip(outcomes.iter())) {
        let Some(send) = e.trace else { continue };
        let mut span = tracer.start_at(COMMIT, SpanKind::Consumer, Some(send), &[], Some(started));
        span.set_str(attr::TENANT, &e.tenant);
        span.set_str(attr::CONV, &e.conv);
        span.set_str(attr::CMID, &e.cmid);
        span.set_u64(attr::BATCH_SIZE, batch as u64);
        match outcome {
            Outcome::Done(r) => {
                span.set_u64(attr::SEQ, r.seq);
                span.set_str(attr::MSG_ID, &r.id.0.to_string());
                span.succeed(if r.dup { "dup" } else { "ok" });
                // A repeat is not fanned out again.
                if let (false, Some(cx)) = (r.dup, span.context()) {
                    parents.insert(r.id, cx);
                }
            }
            Outcome::Rejected(code, _) => span.fail(code.as_str()),
        }
        span.end();
    }
    if parents.is_empty() {
        return;
    }
    for c in committed.iter_mut().flat_map(|r| r.committed.iter_mut()) {
        c.trace = parents.get(&c.id).copied();
    }
}

/// The fan-out spans of the traced messages about to be fanned out together; each
/// message's context becomes its fan-out span's (the parent of its push).
pub fn fanouts(tracer: &Tracer, results: &mut [BatchResult]) -> Vec<HeraldSpan> {
    if !tracer.is_on() {
        return Vec::new();
    }
    let messages: usize = results.iter().map(|r| r.committed.len()).sum();
    let mut spans = Vec::new();
    for r in results.iter_mut() {
        for c in r.committed.iter_mut() {
            let Some(commit) = c.trace else { continue };
            let mut span = tracer.start(FANOUT, SpanKind::Internal, Some(commit));
            let devices = r
                .recipients
                .iter()
                .filter(|d| {
                    d.tenant == c.tenant && d.conv == c.conv && d.receives(c.seq) && !c.skips(&d.user, &d.device)
                })
                .count();
            span.set_str(attr::MSG_ID, &c.id.0.to_string());
            span.set_u64(attr::SEQ, c.seq);
            span.set_u64(attr::DEVICES, devices as u64);
            span.set_u64(attr::FANOUT_MESSAGES, messages as u64);
            c.trace = span.context();
            spans.push(span);
        }
    }
    spans
}

/// Ends the fan-out spans with the fan-out's outcome.
pub fn fanned_out(spans: Vec<HeraldSpan>, outcome: &Result<(), FanoutError>) {
    for mut span in spans {
        match outcome {
            Ok(()) => span.succeed("ok"),
            Err(e) => span.fail(e.kind()),
        }
        span.end();
    }
}
