//! Redis connections: URL parsing (standalone or `redis-cluster://h1:p1,h2:p2`; TLS
//! with `rediss://` and `rediss-cluster://`) and client settings that fail fast while
//! Redis is down instead of queueing forever.

use std::time::Duration;

use fred::interfaces::{ClusterInterface, ConfigInterface, PubsubInterface};
use fred::prelude::*;
use fred::types::config::{ReconnectPolicy, TlsConfig, TlsHostMapping, UnresponsiveConfig};

use crate::tls::{ClientTls, TlsError};

mod batch;
pub use batch::Batch;

/// Turns Herald's `redis-cluster://h1:p1,h2:p2` (or `rediss-cluster://`) into fred's
/// `?node=` form.
fn fred_url(url: &str) -> String {
    let cluster = ["redis-cluster://", "rediss-cluster://"].into_iter().find_map(|s| Some((s, url.strip_prefix(s)?)));
    if let Some((scheme, rest)) = cluster {
        let (hosts, query) = rest.split_once('?').map_or((rest, None), |(h, q)| (h, Some(q)));
        let (auth, hosts) = hosts.rsplit_once('@').map_or(("", hosts), |(a, h)| (a, h));
        let mut nodes = hosts.trim_end_matches('/').split(',');
        let first = nodes.next().unwrap_or_default();
        let mut out = format!("{scheme}{}{}{first}", auth, if auth.is_empty() { "" } else { "@" });
        let extra: Vec<String> = nodes.map(|n| format!("node={n}")).chain(query.map(str::to_owned)).collect();
        if !extra.is_empty() {
            out.push('?');
            out.push_str(&extra.join("&"));
        }
        out
    } else {
        url.to_owned()
    }
}

fn tls_error(e: TlsError) -> Error {
    Error::new(ErrorKind::Tls, format!("TLS settings: {e}"))
}

/// True for the URL schemes that connect with TLS.
pub fn uses_tls(url: &str) -> bool {
    url.starts_with("rediss://") || url.starts_with("rediss-cluster://")
}

/// A builder with Herald's settings: commands time out after `command_timeout`,
/// reconnects retry forever with capped backoff. A `rediss://` URL connects with TLS
/// as `tls` says (never in plaintext); other URLs ignore `tls`.
pub fn builder(url: &str, tls: &ClientTls, command_timeout: Duration) -> Result<Builder, Error> {
    let mut config = Config::from_url(&fred_url(url))?;
    if uses_tls(url) {
        // Cluster nodes are verified under the addresses CLUSTER SLOTS gives, as
        // `redis-cli --tls` does: their certificates must name them.
        config.tls =
            Some(TlsConfig { connector: tls.config().map_err(tls_error)?.into(), hostnames: TlsHostMapping::None });
    }
    let mut b = Builder::from_config(config);
    b.with_performance_config(|p| {
        p.default_command_timeout = command_timeout;
    })
    .with_connection_config(|c| {
        c.connection_timeout = Duration::from_secs(2);
        c.internal_command_timeout = Duration::from_secs(2);
        c.max_command_attempts = 2;
        c.unresponsive =
            UnresponsiveConfig { max_timeout: Some(Duration::from_secs(5)), interval: Duration::from_secs(1) };
    })
    .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2));
    Ok(b)
}

/// Publishes `payload` on a gateway's node channel (or queues it, on a pipeline). In a
/// cluster it is a sharded publish (SPUBLISH, Redis 7 and later): the message goes to
/// the masters of the channel's shard only, where a PUBLISH travels the cluster bus to
/// every master. Standalone Redis gets PUBLISH. The gateway subscribes to match
/// (SSUBSCRIBE in a cluster).
pub async fn publish_to_node<C: PubsubInterface>(client: &C, channel: String, payload: String) -> Result<(), Error> {
    if client.is_clustered() {
        client.spublish::<(), _, _>(channel, payload).await
    } else {
        client.publish::<(), _, _>(channel, payload).await
    }
}

/// A connected pool for ordinary (non-blocking) commands.
pub async fn pool(url: &str, tls: &ClientTls, size: usize) -> Result<Pool, Error> {
    let pool = builder(url, tls, Duration::from_secs(3))?.build_pool(size)?;
    pool.init().await.map_err(|e| connect_error(url, e))?;
    Ok(pool)
}

/// A failed first connection, with a hint when a plaintext URL may have reached a
/// TLS-only server (which just closes the connection) or the other way round.
pub fn connect_error(url: &str, e: Error) -> Error {
    let hint = if uses_tls(url) {
        "the URL asks for TLS: does the server speak TLS on that port, and is its certificate trusted (redis.tls_ca_file) and issued for that host name?"
    } else {
        "the URL is plaintext: a server that requires TLS needs rediss:// (or rediss-cluster://)"
    };
    Error::new(e.kind().clone(), format!("{e} ({hint})"))
}

/// Checks `maxmemory-policy`: pending sets must never be evicted. In a cluster every
/// master is asked (each holds some users' pending sets); the first policy that is not
/// `noeviction` is the answer.
pub async fn eviction_policy(client: &Client) -> Result<String, Error> {
    async fn policy_of<C: ConfigInterface>(c: &C) -> Result<String, Error> {
        let v: std::collections::HashMap<String, String> = c.config_get("maxmemory-policy").await?;
        Ok(v.into_values().next().unwrap_or_default())
    }
    if !client.is_clustered() {
        return policy_of(client).await;
    }
    let masters = client.cached_cluster_state().map(|s| s.unique_primary_nodes()).unwrap_or_default();
    let mut policy = String::new();
    for server in masters {
        policy = policy_of(&client.with_cluster_node(server)).await?;
        if policy != "noeviction" {
            break;
        }
    }
    Ok(policy)
}

/// Groups the items of one Lua script's work into calls: each call's items share a
/// cluster slot (any items on a single Redis), at most `bound` of size in all per call
/// (an item larger than that gets a call of its own). An item is the key its slot is
/// read from and its size; a call is indexes into the items, in their order.
pub fn calls_by_slot<K: AsRef<[u8]>>(
    items: impl IntoIterator<Item = (K, usize)>,
    clustered: bool,
    bound: usize,
) -> Vec<Vec<usize>> {
    let mut by_slot: std::collections::BTreeMap<u16, Vec<(usize, usize)>> = std::collections::BTreeMap::new();
    for (i, (key, size)) in items.into_iter().enumerate() {
        let slot = if clustered { fred::util::redis_keyslot(key.as_ref()) } else { 0 };
        by_slot.entry(slot).or_default().push((i, size));
    }
    let mut calls = Vec::new();
    for in_slot in by_slot.into_values() {
        let (mut call, mut total) = (Vec::new(), 0);
        for (i, size) in in_slot {
            if !call.is_empty() && total + size > bound {
                calls.push(std::mem::take(&mut call));
                total = 0;
            }
            call.push(i);
            total += size;
        }
        calls.push(call);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_become_fred_node_lists() {
        assert_eq!(fred_url("redis-cluster://h1:1,h2:2,h3:3"), "redis-cluster://h1:1?node=h2:2&node=h3:3");
        assert_eq!(fred_url("redis-cluster://u:p@h1:1,h2:2"), "redis-cluster://u:p@h1:1?node=h2:2");
        assert_eq!(fred_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(fred_url("rediss-cluster://h1:1,h2:2"), "rediss-cluster://h1:1?node=h2:2");
    }

    #[test]
    fn tls_urls_get_a_tls_connector_and_plain_ones_none() {
        let tls = ClientTls::default();
        let config = |url: &str| builder(url, &tls, Duration::from_secs(1)).unwrap().get_config().unwrap().clone();
        assert!(config("rediss://127.0.0.1:6380/0").tls.is_some());
        assert!(config("rediss-cluster://127.0.0.1:1,127.0.0.1:2").tls.is_some());
        assert!(config("redis://127.0.0.1:6379/0").tls.is_none());
        let missing = ClientTls::trusting(Some("/nonexistent/ca.pem".into()));
        let err = builder("rediss://127.0.0.1:6380", &missing, Duration::from_secs(1)).err().unwrap().to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
