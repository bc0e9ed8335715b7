//! Test harness: a fresh database and Redis key prefix per test, real `herald-worker`
//! and `herald-gateway` processes on free ports, private Redis servers for fault tests.
//!
//! The binaries are the workspace's own (`cargo build --bins` first; the test
//! command in the README does it). Every process is killed when its cluster drops.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fred::prelude::*;
use herald_client::{token, HttpClient, WsClient, WsEvent};
use herald_shared::auth::Platform;
use herald_shared::ids::MsgId;
use herald_shared::keys::Keys;
use herald_shared::protocol::{AckFrame, ClientFrame, SendFrame, ServerFrame};
use sqlx::mysql::MySqlPool;
use tokio::process::{Child, Command};

pub mod drill;
pub mod faults;
pub mod redis_cluster;

pub const SECRET: &str = "test-secret-0123456789abcdef";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const TENANT: &str = "acme";

fn mysql_base() -> String {
    std::env::var("IT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

pub fn shared_redis_url() -> String {
    std::env::var("IT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A free TCP port on loopback, below the kernel's ephemeral range (32768+), so that
/// the many outgoing connections of concurrent tests cannot take it between this check
/// and the process binding it. A listener of another test still can: see `start`.
pub fn free_port() -> u16 {
    loop {
        let port = 15_000 + rand::random::<u16>() % 17_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
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

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        let mut r = RedisServer { port: free_port(), child: None };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts it (again) on the same port, empty: no persistence. (The port is below the
    /// ephemeral range, so no outgoing connection can hold it meanwhile.)
    pub async fn restart(&mut self) {
        self.child = Some(spawn_redis_server(self.port, &[]));
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
        AdminClient { base: self.workers[worker].admin_url(), http: reqwest::Client::new() }
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

/// The worker's admin API.
pub struct AdminClient {
    base: String,
    http: reqwest::Client,
}

impl AdminClient {
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("admin reachable");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("admin reachable");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }
}

/// The ids in a device's pending set.
pub async fn pending_ids(redis: &Client, keys: &Keys, user: &str, device: &str) -> std::collections::BTreeSet<u64> {
    let members: Vec<String> =
        redis.zrange(keys.pending(TENANT, user, device), 0, -1, None, false, None, false).await.expect("zrange");
    members.iter().map(|m| m.parse::<u64>().expect("fixed-width id member")).collect()
}

/// A `send` frame with a JSON body.
pub fn send_frame(cmid: &str, conv: &str, body: &serde_json::Value) -> ClientFrame {
    let body = serde_json::value::to_raw_value(body).expect("a JSON value serializes");
    ClientFrame::Send(SendFrame { cmid: cmid.into(), conv: conv.into(), body })
}

/// An `ack` frame of these ids.
pub fn ack_frame(ids: impl IntoIterator<Item = MsgId>) -> ClientFrame {
    ClientFrame::Ack(AckFrame { ids: ids.into_iter().collect() })
}

/// (conv, seq, id)
pub type Seen = (String, u64, u64);
type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;

/// What a test asks its device to send.
enum Outgoing {
    Frame(ClientFrame),
    /// Any JSON, for frames a well-behaved client never sends.
    Json(serde_json::Value),
}

/// A connected device that acks every `msg` at once and records what it saw.
pub struct AutoDevice {
    pub user: String,
    pub device: String,
    /// Every `msg`, repeats included, in arrival order.
    pub received: Shared<Vec<Seen>>,
    /// Answers to this device's sends, by cmid.
    pub sent: Shared<std::collections::HashMap<String, Seen>>,
    outbox: tokio::sync::mpsc::Sender<Outgoing>,
    pub closed: Shared<Option<Option<u16>>>,
    /// Every frame after `hello` other than `msg` and `sent`, in arrival order.
    pub others: Shared<Vec<ServerFrame>>,
    task: tokio::task::JoinHandle<()>,
}

impl AutoDevice {
    pub async fn connect(base: &str, token: &str, user: &str, device: &str) -> AutoDevice {
        Self::connect_soft(base, token, user, device).await.expect("websocket connects and says hello")
    }

    /// `None` when the gateway is unreachable or closes before `hello`.
    pub async fn connect_soft(base: &str, token: &str, user: &str, device: &str) -> Option<AutoDevice> {
        let mut ws = WsClient::connect(base, token).await.ok()?;
        let hello = ws.next(Duration::from_secs(10)).await;
        if !matches!(&hello, Some(WsEvent::Frame(ServerFrame::Hello(_)))) {
            return None;
        }
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sent = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let closed = std::sync::Arc::new(std::sync::Mutex::new(None));
        let others = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (outbox, mut rx) = tokio::sync::mpsc::channel::<Outgoing>(1024);
        let (r, s, cl, o) = (received.clone(), sent.clone(), closed.clone(), others.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    out = rx.recv() => {
                        let sent = match out {
                            Some(Outgoing::Frame(f)) => ws.send(&f).await,
                            Some(Outgoing::Json(v)) => ws.send_json(&v).await,
                            None => { ws.close().await; break; }
                        };
                        if sent.is_err() { break; }
                    }
                    ev = ws.next(Duration::from_secs(3600)) => match ev {
                        Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                            r.lock().unwrap().push((m.conv.clone(), m.seq, m.id.0));
                            if ws.send(&ack_frame([m.id])).await.is_err() { break; }
                        }
                        Some(WsEvent::Frame(ServerFrame::Sent(a))) => {
                            s.lock().unwrap().insert(a.cmid.clone(), (a.conv.clone(), a.seq, a.id.0));
                        }
                        Some(WsEvent::Frame(f)) => o.lock().unwrap().push(f),
                        Some(WsEvent::Other(_)) | None => {}
                        Some(WsEvent::Closed(code)) => { *cl.lock().unwrap() = Some(code); break; }
                    },
                }
            }
        });
        Some(AutoDevice { user: user.into(), device: device.into(), received, sent, outbox, closed, others, task })
    }

    /// Sends any frame.
    pub async fn send_frame(&self, frame: ClientFrame) {
        self.outbox.send(Outgoing::Frame(frame)).await.expect("device running");
    }

    /// Sends any JSON (for frames a well-behaved client never sends).
    pub async fn send_raw(&self, frame: serde_json::Value) {
        self.outbox.send(Outgoing::Json(frame)).await.expect("device running");
    }

    pub async fn send(&self, cmid: &str, conv: &str, body: serde_json::Value) {
        self.send_frame(send_frame(cmid, conv, &body)).await;
    }

    /// Ids received so far (repeats dropped).
    pub fn ids(&self) -> std::collections::BTreeSet<u64> {
        self.received.lock().unwrap().iter().map(|(_, _, id)| *id).collect()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.lock().unwrap().is_some()
    }

    pub async fn stop(self) {
        drop(self.outbox);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}
