//! The metric handles of the per-delivery path, made once. `counter!` and `histogram!`
//! look their key up in the recorder's registry at every call (a hash of the name and
//! labels, a lock, a handle made and dropped), which a realtime delivery paid five or
//! six times: the push queued, the frame written, the delivery counted, the ack frame
//! read, its latency and the acks counted. Each handle is made at its first use, which
//! comes after the process installed its recorder (sessions start after it).

use std::sync::LazyLock;

use metrics::{Counter, Histogram};

pub static PUSHES_QUEUED: LazyLock<Counter> =
    LazyLock::new(|| metrics::counter!("herald_pushes_total", "outcome" => "queued"));
pub static FRAMES_OUT: LazyLock<Counter> = LazyLock::new(|| metrics::counter!("herald_frames_out_total"));
pub static REALTIME_DELIVERIES: LazyLock<Counter> =
    LazyLock::new(|| metrics::counter!("herald_deliveries_total", "kind" => "realtime"));
pub static ACK_FRAMES_IN: LazyLock<Counter> =
    LazyLock::new(|| metrics::counter!("herald_frames_in_total", "type" => "ack"));
pub static ACKS: LazyLock<Counter> = LazyLock::new(|| metrics::counter!("herald_acks_total"));
pub static REALTIME_DELIVERY_SECONDS: LazyLock<Histogram> =
    LazyLock::new(|| metrics::histogram!("herald_delivery_seconds", "kind" => "realtime"));
pub static BACKLOG_DELIVERY_SECONDS: LazyLock<Histogram> =
    LazyLock::new(|| metrics::histogram!("herald_delivery_seconds", "kind" => "backlog"));

/// Counts a frame read from a device, by its type: an ack (one per delivery) through
/// its handle, the rarer types through the registry.
pub fn frame_in(kind: &'static str) {
    if kind == "ack" {
        ACK_FRAMES_IN.increment(1);
    } else {
        metrics::counter!("herald_frames_in_total", "type" => kind).increment(1);
    }
}
