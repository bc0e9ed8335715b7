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
    let port = port.to_string();
    let mut args = vec!["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    args.extend(["--maxmemory-policy", "noeviction"]);
    args.extend(extra);
    std::process::Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed")
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
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut r = RedisServer { port: free_port(), child: None, extra };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts it (again) on the same port, empty: no persistence. (The port is below the
    /// ephemeral range, so no outgoing connection can hold it meanwhile.)
    pub async fn restart(&mut self) {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = Some(spawn_redis_server(self.port, &extra));
        let port = self.port;
        eventually(Duration::from_secs(10), "private redis answers", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
        })
        .await;
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
    }
}
