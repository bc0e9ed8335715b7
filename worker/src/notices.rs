//! Envelopes to gateways: what the worker tells the nodes holding the devices and the
//! waiting senders (answers, statuses), one pipeline for every node.

use std::collections::BTreeMap;

use fred::prelude::*;
use herald_shared::keys::Keys;
use herald_shared::protocol::NodeEnvelope;

/// Publishes envelopes to their nodes' channels in one pipeline.
pub async fn publish<N: AsRef<str>>(
    redis: &Pool,
    keys: &Keys,
    by_node: &BTreeMap<N, NodeEnvelope>,
) -> Result<(), Error> {
    if by_node.is_empty() {
        return Ok(());
    }
    let pipe = redis.next().pipeline();
    for (node, env) in by_node {
        let payload = serde_json::to_string(env).expect("envelope serializes");
        herald_shared::redis::publish_to_node(&pipe, keys.node_channel(node.as_ref()), payload).await?;
    }
    pipe.all::<Value>().await.map(|_| ())
}
