//! Envelopes to gateways: what the worker tells the nodes holding the devices and the
//! waiting senders (answers, statuses), sent together in one socket write.

use std::collections::BTreeMap;

use fred::prelude::*;
use herald_shared::keys::Keys;
use herald_shared::redis::Batch;
use serde::Serialize;

/// Publishes envelopes to their nodes' channels, together ([`Batch`]): a
/// `NodeEnvelope`, or a borrowed form that serializes as one (`NoticesOut`).
pub async fn publish<N: AsRef<str>, E: Serialize>(
    redis: &Pool,
    keys: &Keys,
    by_node: &BTreeMap<N, E>,
) -> Result<(), Error> {
    if by_node.is_empty() {
        return Ok(());
    }
    let client = redis.next();
    let mut batch = Batch::new();
    for (node, env) in by_node {
        let payload = serde_json::to_string(env).expect("envelope serializes");
        let channel = keys.node_channel(node.as_ref());
        batch.publish_to_node(client, channel, payload);
    }
    batch.run().await.into_iter().collect::<Result<Vec<Value>, Error>>().map(|_| ())
}
