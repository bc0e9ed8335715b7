//! What tests read of the ingress streams.

use fred::prelude::*;

/// Entries ever added to a stream: committed entries leave it, so its length says
/// nothing after the fact, but this counter keeps every one.
pub async fn entries_added(redis: &Client, key: &str) -> u64 {
    let info: Vec<Value> = redis.xinfo_stream(key, false, None).await.expect("the stream exists");
    let mut fields = info.into_iter();
    while let Some(name) = fields.next() {
        let value = fields.next();
        if name.as_str().as_deref() == Some("entries-added") {
            return value.and_then(|v| v.as_u64()).expect("a count");
        }
    }
    panic!("XINFO STREAM without entries-added (Redis 7 has it)");
}
