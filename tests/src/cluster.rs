//! One test's Herald cluster: its own database and Redis key prefix, and the real
//! gateway and worker processes it spawns, each ready before it is handed out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_client::{token, HttpClient};
use herald_shared::auth::Platform;
use herald_shared::keys::Keys;
use sqlx::mysql::MySqlPool;
use tokio::process::{Child, Command};

use crate::{free_port, AdminClient, ADMIN_TOKEN, SECRET, TENANT};

fn mysql_base() -> String {
    std::env::var("IT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

pub fn shared_redis_url() -> String {
    std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/<test-binary>
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().and_then(|p| p.parent()).expect("target dir").to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --bins` before the tests (the README's test command does)",
        p.display()
    );
    p
}

/// A real process of the cluster.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running process")
    }

    /// SIGKILL: no shutdown path runs.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.listen)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }
}

/// One test's Herald cluster: its own database, key prefix and processes.
pub struct Cluster {
    pub db_name: String,
    pub mysql_url: String,
    pub redis_url: String,
    pub prefix: String,
    pub workers: Vec<Proc>,
    pub gateways: Vec<Proc>,
    pub log_dir: PathBuf,
    /// Extra settings applied to every process started (`HERALD_*` names).
    pub env: Vec<(String, String)>,
    started: usize,
}

impl Cluster {
    pub fn new(test: &str) -> Cluster {
        Self::with_redis(test, shared_redis_url())
    }

    pub fn with_redis(test: &str, redis_url: String) -> Cluster {
        let id: u32 = rand::random();
        let db_name = format!("herald_it_{}_{id:08x}", test.replace('-', "_"));
        let log_dir = target_dir().join("test-logs").join(format!("{test}-{id:08x}"));
        std::fs::create_dir_all(&log_dir).expect("log dir");
        Cluster {
            mysql_url: format!("{}/{db_name}", mysql_base()),
            db_name,
            redis_url,
            prefix: format!("it{id:08x}"),
            workers: Vec::new(),
            gateways: Vec::new(),
            log_dir,
            env: Vec::new(),
            started: 0,
        }
    }

    pub fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.env.push((key.into(), value.into()));
        self
    }

    async fn spawn(&mut self, binary: &str, kind: &str, extra: &[(&str, &str)]) -> Proc {
        self.started += 1;
        let name = format!("{kind}-{}", self.started);
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let log = std::fs::File::create(self.log_dir.join(format!("{name}.log"))).expect("log file");
        let mut cmd = Command::new(bin(binary));
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RUST_LOG", std::env::var("IT_LOG").unwrap_or_else(|_| "info".into()))
            .env("HERALD_MYSQL_URL", &self.mysql_url)
            .env("HERALD_REDIS_URL", &self.redis_url)
            .env("HERALD_REDIS_KEY_PREFIX", &self.prefix)
            .env("HERALD_JWT_SECRET", SECRET)
            .env("HERALD_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("HERALD_NODE_ID", &name)
            .env("HERALD_LISTEN", listen.to_string())
            .env("HERALD_ADMIN_LISTEN", admin.to_string());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.stdout(log.try_clone().expect("log")).stderr(log).kill_on_drop(true);
        let child = cmd.spawn().expect("spawn process");
        Proc { name, child, listen, admin }
    }

    /// Waits for `/readyz`; the process's log when it exited first.
    async fn wait_ready(p: &mut Proc, log_dir: &std::path::Path) -> Result<(), String> {
        let url = format!("{}/readyz", p.admin_url());
        let deadline = Instant::now() + Duration::from_secs(60);
        let http = reqwest::Client::new();
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                let log = std::fs::read_to_string(log_dir.join(format!("{}.log", p.name))).unwrap_or_default();
                return Err(format!("{} exited with {status} before it was ready:\n{log}", p.name));
            }
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            assert!(Instant::now() < deadline, "{} not ready within 60 s", p.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Spawns until ready; a port taken meanwhile by another test's listener means a
    /// new pair of ports, anything else fails the test.
    async fn start(&mut self, binary: &str, kind: &str, extra: &[(&str, &str)]) -> Proc {
        for _ in 0..5 {
            let mut p = self.spawn(binary, kind, extra).await;
            match Self::wait_ready(&mut p, &self.log_dir).await {
                Ok(()) => return p,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("{log}"),
            }
        }
        panic!("{kind}: no free ports after 5 attempts");
    }

    /// Starts a worker and waits until it is ready (migrations applied, leases held).
    pub async fn start_worker(&mut self, extra: &[(&str, &str)]) -> usize {
        let p = self.start("herald-worker", "wk", extra).await;
        self.workers.push(p);
        self.workers.len() - 1
    }

    pub async fn start_gateway(&mut self, extra: &[(&str, &str)]) -> usize {
        let p = self.start("herald-gateway", "gw", extra).await;
        self.gateways.push(p);
        self.gateways.len() - 1
    }

    pub fn token(&self, user: &str, device: &str) -> String {
        token(SECRET, TENANT, user, device, Platform::Ios)
    }

    /// A device's HTTP client against gateway `gw`.
    pub fn client(&self, gw: usize, user: &str, device: &str) -> HttpClient {
        HttpClient::new(self.gateways[gw].base_url(), self.token(user, device))
    }

    pub fn client_in(&self, gw: usize, tenant: &str, user: &str, device: &str) -> HttpClient {
        HttpClient::new(self.gateways[gw].base_url(), token(SECRET, tenant, user, device, Platform::Web))
    }

    pub async fn db(&self) -> MySqlPool {
        MySqlPool::connect(&self.mysql_url).await.expect("test database")
    }

    pub async fn redis(&self) -> Client {
        // Herald's own URL parsing: `redis-cluster://h1:p1,h2:p2` too.
        let c = herald_shared::redis::builder(&self.redis_url, Duration::from_secs(5))
            .and_then(|b| b.build())
            .expect("redis client");
        c.init().await.expect("redis connects");
        c
    }

    pub fn keys(&self) -> Keys {
        Keys::new(self.prefix.clone())
    }

    pub fn admin(&self, worker: usize) -> AdminClient {
        AdminClient::new(self.workers[worker].admin_url())
    }

    /// Starts gateway `i` again, after its process exited, on the listen and admin
    /// addresses it had (clients keep the addresses they know; a rolling restart).
    pub async fn respawn_gateway(&mut self, i: usize) {
        let (listen, admin) = (self.gateways[i].listen, self.gateways[i].admin);
        let (l, a) = (listen.to_string(), admin.to_string());
        // The process's own settings come after the defaults, so these addresses win.
        let mut p = self.spawn("herald-gateway", "gw", &[("HERALD_LISTEN", &l), ("HERALD_ADMIN_LISTEN", &a)]).await;
        p.listen = listen;
        p.admin = admin;
        if let Err(log) = Self::wait_ready(&mut p, &self.log_dir).await {
            panic!("{log}");
        }
        self.gateways[i] = p;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.workers.iter_mut().chain(self.gateways.iter_mut()) {
            let _ = p.child.start_kill();
        }
        if std::env::var("IT_KEEP_DB").is_err() {
            // Drop runs inside the test's runtime: use a thread with its own.
            let (url, name) = (mysql_base(), self.db_name.clone());
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    use sqlx::Connection;
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&format!("{url}/information_schema")).await {
                        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{name}`")).execute(&mut conn).await;
                    }
                });
            })
            .join();
        }
    }
}
