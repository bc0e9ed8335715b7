//! A private 3-master Redis Cluster on free ports, for running Herald against Redis
//! Cluster (`redis-cluster://` URLs). Every node is killed and its directory removed
//! when the cluster drops.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::{eventually, free_port, spawn_redis_server};

/// One `redis-server --cluster-enabled yes` of the cluster.
struct Node {
    port: u16,
    /// The cluster bus port (not the default port + 10 000).
    bus: u16,
    child: Child,
}

/// Three masters, all 16384 slots assigned; no replicas unless a test adds one.
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl RedisCluster {
    pub async fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!("herald-redis-cluster-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let mut rc = RedisCluster { nodes: Vec::new(), dir };
        for _ in 0..3 {
            let node = rc.start_node().await;
            rc.nodes.push(node);
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(rc.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = rc.cli(rc.nodes[0].port, &create);
        assert!(out.status.success(), "redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        // Every node must see every slot covered before a client reads the slot map.
        for port in rc.ports() {
            eventually(Duration::from_secs(20), "every cluster node reports cluster_state:ok", || {
                let info = rc.cli_text(port, &["cluster", "info"]);
                async move { info.contains("cluster_state:ok").then_some(()) }
            })
            .await;
        }
        rc
    }

    /// Starts one node on fresh ports (client and bus), again when a port was taken.
    async fn start_node(&self) -> Node {
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let (bus_port, config) = (bus.to_string(), format!("nodes-{port}.conf"));
            let dir = self.dir.to_str().expect("utf-8 temp dir");
            let child = spawn_redis_server(
                port,
                &[
                    "--cluster-port",
                    &bus_port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &config,
                    "--cluster-node-timeout",
                    "5000",
                    "--dir",
                    dir,
                ],
            );
            let mut node = Node { port, bus, child };
            if crate::redis_server::started(&mut node.child, port).await {
                return node;
            }
            let _ = node.child.wait();
        }
        panic!("no cluster node could bind free ports after 5 attempts");
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Herald's form: `redis-cluster://h1:p1,h2:p2,h3:p3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    fn cli<S: AsRef<std::ffi::OsStr>>(&self, port: u16, args: &[S]) -> Output {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is installed")
    }

    fn cli_text(&self, port: u16, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.cli(port, args).stdout).into_owned()
    }

    /// `redis-cli -c` against the first node: follows MOVED redirections, so any key
    /// can be read from there.
    pub fn cli_follow(&self, args: &[&str]) -> String {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        self.cli_text(self.nodes[0].port, &all)
    }

    /// The keys matching `pattern` held by each master (a SCAN per node), in node order.
    pub fn keys_by_node(&self, pattern: &str) -> Vec<Vec<String>> {
        self.ports()
            .into_iter()
            .map(|port| {
                let out = self.cli_text(port, &["--scan", "--pattern", pattern]);
                let mut keys: Vec<String> = out.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
                keys.sort();
                keys
            })
            .collect()
    }

    /// The master (index into [`ports`](Self::ports)) that serves `key`'s slot.
    pub fn node_of(&self, key: &str) -> usize {
        let slot = self.slot_of(key);
        self.ports()
            .into_iter()
            .position(|port| {
                let nodes = self.cli_text(port, &["cluster", "nodes"]);
                let me = nodes.lines().find(|l| l.contains("myself")).expect("CLUSTER NODES names myself");
                me.split(' ').skip(8).any(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
                })
            })
            .expect("every slot is served")
    }

    /// FLUSHALL on one master: it loses its data, the others keep theirs.
    pub fn flush(&self, node: usize) {
        let out = self.cli_text(self.nodes[node].port, &["flushall"]);
        assert!(out.contains("OK"), "FLUSHALL: {out}");
    }

    /// Closes every pub/sub connection on every master (`CLIENT KILL TYPE pubsub`), as a
    /// network blip or a master restart would; returns how many were closed.
    pub fn kill_subscribers(&self) -> u64 {
        self.ports()
            .into_iter()
            .map(|port| self.cli_text(port, &["client", "kill", "type", "pubsub"]).trim().parse::<u64>().unwrap_or(0))
            .sum()
    }

    /// Calls of `command` (lower case, as INFO names it) on every master together.
    pub fn calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.ports()
            .into_iter()
            .map(|port| {
                let stats = self.cli_text(port, &["info", "commandstats"]);
                let line = stats.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
                line.and_then(|l| l.split(',').next()).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)
            })
            .sum()
    }

    /// Adds a replica of master `master` (a fourth node, `CLUSTER REPLICATE`) and waits
    /// until it is in sync; returns its index.
    pub async fn add_replica(&mut self, master: usize) -> usize {
        let node = self.start_node().await;
        let (port, master_port, master_bus) = (node.port, self.nodes[master].port, self.nodes[master].bus);
        self.nodes.push(node);
        let meet =
            self.cli_text(port, &["cluster", "meet", "127.0.0.1", &master_port.to_string(), &master_bus.to_string()]);
        assert!(meet.contains("OK"), "CLUSTER MEET: {meet}");
        let id = self.cli_text(master_port, &["cluster", "myid"]).trim().to_owned();
        eventually(Duration::from_secs(20), "the new node replicates the master", || {
            let done = self.cli_text(port, &["cluster", "replicate", &id]).contains("OK");
            async move { done.then_some(()) }
        })
        .await;
        eventually(Duration::from_secs(20), "the replica is in sync", || {
            let info = self.cli_text(port, &["info", "replication"]);
            async move { info.contains("master_link_status:up").then_some(()) }
        })
        .await;
        self.nodes.len() - 1
    }

    /// Cuts node `replica`'s replication link for good: it reconnects with a password
    /// the master refuses, so the master's writes from now on stay behind.
    pub async fn cut_replication(&self, replica: usize) {
        let port = self.nodes[replica].port;
        let set = self.cli_text(port, &["config", "set", "masterauth", "not-the-password"]);
        assert!(set.contains("OK"), "CONFIG SET masterauth: {set}");
        self.cli_text(port, &["client", "kill", "type", "master"]);
        eventually(Duration::from_secs(10), "the replication link is down", || {
            let info = self.cli_text(port, &["info", "replication"]);
            async move { info.contains("master_link_status:down").then_some(()) }
        })
        .await;
    }

    /// SIGKILLs node `i` (its data is gone with it).
    pub fn kill(&mut self, i: usize) {
        let _ = self.nodes[i].child.kill();
        let _ = self.nodes[i].child.wait();
    }

    /// Promotes replica `replica` without its master (`CLUSTER FAILOVER TAKEOVER`, as an
    /// operator or a failover does once the master is gone), and waits until every
    /// other live node sees it serve the slots.
    pub async fn take_over(&self, replica: usize, alive: &[usize]) {
        let port = self.nodes[replica].port;
        let out = self.cli_text(port, &["cluster", "failover", "takeover"]);
        assert!(out.contains("OK"), "CLUSTER FAILOVER TAKEOVER: {out}");
        for &i in alive {
            let p = self.nodes[i].port;
            eventually(Duration::from_secs(20), "the promoted replica serves its slots everywhere", || {
                let nodes = self.cli_text(p, &["cluster", "nodes"]);
                let promoted = nodes.lines().any(|l| l.contains(&format!(":{port}@")) && l.contains("master"));
                let info = self.cli_text(p, &["cluster", "info"]);
                async move { (promoted && info.contains("cluster_state:ok")).then_some(()) }
            })
            .await;
        }
    }

    /// The hash slot of `key` (CLUSTER KEYSLOT).
    pub fn slot_of(&self, key: &str) -> u16 {
        self.cli_text(self.nodes[0].port, &["cluster", "keyslot", key]).trim().parse().expect("CLUSTER KEYSLOT answers")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
