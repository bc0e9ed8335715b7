//! Private `redis-server` processes on free ports, for tests that stop, pause or
//! empty Redis (and for the nodes of a Redis Cluster).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use crate::eventually;

/// A free TCP port on loopback, for servers that cannot bind port 0 and say which port
/// they got (redis-server, mariadbd). It is below the kernel's ephemeral range
/// (32768+), where neither the many outgoing connections of concurrent tests nor
/// Herald's processes (port 0) take ports, so only another `free_port` caller could
/// take it between this check and the server binding it.
pub fn free_port() -> u16 {
    loop {
        let port = 15_000 + rand::random::<u16>() % 17_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A `redis-server` on loopback `port` as Herald needs it (no persistence, never
/// evicting), with `extra` arguments (cluster mode).
pub fn spawn_redis_server(port: u16, extra: &[&str]) -> std::process::Child {
    // A directory of its own unless `extra` names one: a replica's full sync writes the
    // master's data there, and a server started where another left a `dump.rdb` would
    // start with that data.
    let dir = scratch_dir(port);
    let dir = dir.to_str().expect("utf-8 temp dir").to_owned();
    let port = port.to_string();
    let mut args = vec!["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    if !extra.contains(&"--dir") {
        std::fs::create_dir_all(&dir).expect("a scratch directory for redis-server");
        args.extend(["--dir", &dir]);
    }
    args.extend(["--maxmemory-policy", "noeviction"]);
    args.extend(extra);
    std::process::Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed")
}

/// The working directory of the private server on `port`.
fn scratch_dir(port: u16) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("herald-redis-{port}"))
}

/// The process id of the Redis answering on loopback `port` (`INFO server`), if one
/// answers within a second.
async fn process_id(port: u16) -> Option<u32> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        conn.write_all(b"INFO server\r\n").await.ok()?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buf[..n]);
            // Only a whole line: a read can end inside the number.
            let text = String::from_utf8_lossy(&answer);
            if let Some((_, rest)) = text.split_once("process_id:") {
                if let Some((pid, _)) = rest.split_once("\r\n") {
                    return pid.parse().ok();
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(1), ask).await.ok().flatten()
}

/// Waits until `child`, a `redis-server` just spawned on loopback `port`, answers there
/// itself; false when it exited instead (another test's server took the port between
/// [`free_port`] and the bind). What answers must be this process: a connection alone
/// could reach the other server, which its test may kill under this one.
pub(crate) async fn started(child: &mut std::process::Child, port: u16) -> bool {
    let pid = child.id();
    eventually(Duration::from_secs(10), "redis-server answers, or exits", || {
        let exited = matches!(child.try_wait(), Ok(Some(_)));
        async move {
            let own = !exited && process_id(port).await == Some(pid);
            (exited || own).then_some(own)
        }
    })
    .await
}

/// A private `redis-server` on a free port, for tests that stop Redis.
pub struct RedisServer {
    pub port: u16,
    child: Option<std::process::Child>,
    extra: Vec<String>,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        Self::start_with(&[]).await
    }

    /// A replica of the master on loopback `port` (asynchronous replication, as Redis
    /// always does it).
    pub async fn replica_of(port: u16) -> RedisServer {
        Self::start_with(&["--replicaof", "127.0.0.1", &port.to_string()]).await
    }

    /// One that refuses `CONFIG`, as managed Redis services do.
    pub async fn without_config() -> RedisServer {
        Self::start_with(&["--rename-command", "CONFIG", ""]).await
    }

    async fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let mut r = RedisServer { port: free_port(), child: None, extra: extra.clone() };
            if r.try_start().await {
                return r;
            }
        }
        panic!("no private redis-server started on a free port in 5 tries");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts it (again) on the same port, empty: no persistence. (The port is below the
    /// ephemeral range, so no outgoing connection can hold it meanwhile.)
    pub async fn restart(&mut self) {
        assert!(self.try_start().await, "the private redis-server did not start again on port {}", self.port);
    }

    /// Starts it on its port and waits until it answers ([`started`]); false when it
    /// exited instead.
    async fn try_start(&mut self) -> bool {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let child = self.child.insert(spawn_redis_server(self.port, &extra));
        started(child, self.port).await
    }

    /// The server's process id while it runs (to pause it with SIGSTOP).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// SIGKILL: everything in it is lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(scratch_dir(self.port));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_whose_port_another_holds_is_not_taken_for_that_one() {
        let there = RedisServer::start().await;
        assert_eq!(process_id(there.port).await, there.pid(), "the server on its port is its own");
        let mut late = RedisServer { port: there.port, child: None, extra: Vec::new() };
        assert!(!late.try_start().await, "the port's other server answered, and this one exited");
        assert!(process_id(there.port).await.is_some(), "the first server still runs");
    }
}
