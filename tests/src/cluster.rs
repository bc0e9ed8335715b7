//! One test's Herald cluster: its own database and Redis key prefix, and the real
//! gateway and worker processes it spawns. Each binds port 0 and reports the addresses
//! it got in its log, and is ready before it is handed out.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_client::{token, HttpClient};
use herald_shared::auth::Platform;
use herald_shared::keys::Keys;
use sqlx::mysql::MySqlPool;
use tokio::process::{Child, Command};

use crate::{AdminClient, ADMIN_TOKEN, SECRET, SERVICE_SECRET, TENANT};

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

/// A real process of the cluster, with the addresses it reported.
pub struct Proc {
    pub name: String,
    pub child: Child,
    /// The public listener: gateways only.
    listen: Option<SocketAddr>,
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

    /// The gateway's public listener.
    pub fn listen(&self) -> SocketAddr {
        self.listen.unwrap_or_else(|| panic!("{} has no public listener", self.name))
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.listen())
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
    /// How the test itself reaches a `rediss://` Redis (the processes get `env`).
    pub redis_tls: herald_shared::tls::ClientTls,
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
            redis_tls: Default::default(),
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

    /// Spawns a process of `kind` and waits until it has logged the addresses it is
    /// listening on and is ready. Its listeners bind port 0 (the kernel picks a free
    /// port) unless `addrs` (listen, admin) says where. The process's log when it exited
    /// first.
    async fn launch(
        &mut self,
        kind: Kind,
        extra: &[(&str, &str)],
        addrs: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<Proc, String> {
        self.started += 1;
        let name = format!("{}-{}", kind.prefix(), self.started);
        let log_path = self.log_dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut cmd = Command::new(bin(kind.binary()));
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
            .env("HERALD_SERVICE_SECRET", SERVICE_SECRET)
            .env("HERALD_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("HERALD_NODE_ID", &name)
            .env("HERALD_LISTEN", "127.0.0.1:0")
            .env("HERALD_ADMIN_LISTEN", "127.0.0.1:0");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        // Last, so that they win over any setting.
        if let Some((listen, admin)) = addrs {
            cmd.env("HERALD_LISTEN", listen.to_string()).env("HERALD_ADMIN_LISTEN", admin.to_string());
        }
        cmd.stdout(log.try_clone().expect("log")).stderr(log).kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn process");
        let (listen, admin) = wait_started(&mut child, &log_path, &name, kind).await?;
        let mut p = Proc { name, child, listen, admin };
        wait_ready(&mut p, &log_path).await?;
        Ok(p)
    }

    /// Starts a worker and waits until it is ready (migrations applied, leases held).
    pub async fn start_worker(&mut self, extra: &[(&str, &str)]) -> usize {
        let p = self.launch(Kind::Worker, extra, None).await.unwrap_or_else(|log| panic!("{log}"));
        self.workers.push(p);
        self.workers.len() - 1
    }

    /// Starts a worker that may refuse to start: its log when it exited first.
    pub async fn try_start_worker(&mut self, extra: &[(&str, &str)]) -> Result<usize, String> {
        let p = self.launch(Kind::Worker, extra, None).await?;
        self.workers.push(p);
        Ok(self.workers.len() - 1)
    }

    /// Starts a gateway that may refuse to start: its log when it exited first.
    pub async fn try_start_gateway(&mut self, extra: &[(&str, &str)]) -> Result<usize, String> {
        let p = self.launch(Kind::Gateway, extra, None).await?;
        self.gateways.push(p);
        Ok(self.gateways.len() - 1)
    }

    pub async fn start_gateway(&mut self, extra: &[(&str, &str)]) -> usize {
        let p = self.launch(Kind::Gateway, extra, None).await.unwrap_or_else(|log| panic!("{log}"));
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
        let c = herald_shared::redis::builder(&self.redis_url, &self.redis_tls, Duration::from_secs(5))
            .and_then(|b| b.build())
            .expect("redis client");
        c.init().await.expect("redis connects");
        c
    }

    /// A pool like the processes' own, for the shared helpers that take one.
    pub async fn redis_pool(&self) -> fred::clients::Pool {
        herald_shared::redis::pool(&self.redis_url, &self.redis_tls, 1).await.expect("redis pool")
    }

    pub fn keys(&self) -> Keys {
        Keys::new(self.prefix.clone())
    }

    pub fn admin(&self, worker: usize) -> AdminClient {
        AdminClient::new(self.workers[worker].admin_url())
    }

    /// Starts gateway `i` again, after its process exited, on the listen and admin
    /// addresses it had (clients keep the addresses they know; a rolling restart).
    ///
    /// Those ports are in the kernel's ephemeral range, where an outgoing connection may
    /// take one meanwhile as its local port: then it tries again for a while.
    pub async fn respawn_gateway(&mut self, i: usize) {
        self.respawn_gateway_with(i, &[]).await
    }

    /// [`Cluster::respawn_gateway`] with settings of its own (its node id, say).
    pub async fn respawn_gateway_with(&mut self, i: usize, extra: &[(&str, &str)]) {
        let addrs = (self.gateways[i].listen(), self.gateways[i].admin);
        let deadline = Instant::now() + Duration::from_secs(30);
        let p = loop {
            match self.launch(Kind::Gateway, extra, Some(addrs)).await {
                Ok(p) => break p,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(log) => panic!("{log}"),
            }
        };
        assert_eq!((p.listen(), p.admin), addrs, "{} came back on other addresses", p.name);
        self.gateways[i] = p;
    }
}

/// The processes a cluster runs.
#[derive(Clone, Copy)]
enum Kind {
    Worker,
    Gateway,
}

impl Kind {
    fn binary(self) -> &'static str {
        match self {
            Kind::Worker => "herald-worker",
            Kind::Gateway => "herald-gateway",
        }
    }

    /// Of the process names (`gw-3`), node ids and log files.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Worker => "wk",
            Kind::Gateway => "gw",
        }
    }

    /// The message the process logs once its listeners are bound, with their addresses
    /// as fields (`listen=` for a gateway, `admin=` for both).
    fn started(self) -> &'static str {
        match self {
            Kind::Worker => "worker started",
            Kind::Gateway => "gateway started",
        }
    }
}

/// Waits until the process logs its `started` line and reads the addresses it is
/// listening on from it: (listen, admin). The process's log when it exited first.
async fn wait_started(
    child: &mut Child,
    log_path: &Path,
    name: &str,
    kind: Kind,
) -> Result<(Option<SocketAddr>, SocketAddr), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        if let Some(line) = log.lines().map(strip_ansi).find(|l| l.contains(kind.started())) {
            let listen = field_addr(&line, "listen");
            return match (kind, listen, field_addr(&line, "admin")) {
                (Kind::Worker, _, Some(admin)) => Ok((None, admin)),
                (Kind::Gateway, Some(listen), Some(admin)) => Ok((Some(listen), admin)),
                _ => Err(format!("{name}: no addresses in its `{}` line: {line}", kind.started())),
            };
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{name} exited with {status} before it was ready:\n{log}"));
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not log `{}` within 60 s (IT_LOG must let Herald's info lines through):\n{log}",
            kind.started()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for `/readyz`; the process's log when it exited first.
async fn wait_ready(p: &mut Proc, log_path: &Path) -> Result<(), String> {
    let url = format!("{}/readyz", p.admin_url());
    let deadline = Instant::now() + Duration::from_secs(60);
    let http = reqwest::Client::new();
    loop {
        if let Ok(Some(status)) = p.child.try_wait() {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
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

/// A log line without its colours (the processes' tracing output is ANSI-coloured).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, ended by a letter.
            chars.by_ref().find(char::is_ascii_alphabetic);
        } else {
            out.push(c);
        }
    }
    out
}

/// The address in a `name=addr` field of a tracing line.
fn field_addr(line: &str, name: &str) -> Option<SocketAddr> {
    // `log_format = json`: the fields are members of the line's object.
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(line) {
        return fields.get(name)?.as_str()?.parse().ok();
    }
    line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_coloured_and_plain_started_lines() {
        let coloured = "\x1b[2m2026-11-30T20:38:46.368266Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mherald_gateway\x1b[0m\x1b[2m:\x1b[0m \
            gateway started \x1b[3mnode\x1b[0m\x1b[2m=\x1b[0mgw-2 \x1b[3mlisten\x1b[0m\x1b[2m=\x1b[0m127.0.0.1:29372 \
            \x1b[3madmin\x1b[0m\x1b[2m=\x1b[0m127.0.0.1:21457";
        let line = strip_ansi(coloured);
        assert!(line.contains("gateway started"), "{line}");
        assert_eq!(field_addr(&line, "listen"), Some("127.0.0.1:29372".parse().unwrap()));
        assert_eq!(field_addr(&line, "admin"), Some("127.0.0.1:21457".parse().unwrap()));
        let plain = "2026-11-30T20:38:45Z  INFO herald_worker: worker started node=wk-1 admin=127.0.0.1:20390";
        assert_eq!(field_addr(plain, "admin"), Some("127.0.0.1:20390".parse().unwrap()));
        assert_eq!(field_addr(plain, "listen"), None);
        let json = r#"{"level":"INFO","message":"gateway started","listen":"127.0.0.1:8080","admin":"127.0.0.1:9090"}"#;
        assert_eq!(field_addr(json, "listen"), Some("127.0.0.1:8080".parse().unwrap()));
    }
}
