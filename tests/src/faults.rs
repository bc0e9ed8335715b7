//! The faults of the drills that the cluster itself cannot inject: a gateway stopped
//! with SIGTERM and started again on its addresses, Redis paused with SIGSTOP, a private
//! MariaDB killed and restarted on its data, and a TCP proxy that cuts a client's
//! network without FIN or RST.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{eventually, free_port, Cluster, RedisServer};

pub fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill(1) runs");
    assert!(status.success(), "kill {sig} {pid} failed");
}

/// SIGTERM to gateway `i`, then waits (bounded by its drain period and a margin) until
/// it has exited: the first half of a rolling restart.
pub async fn terminate_gateway(c: &mut Cluster, i: usize, within: Duration) {
    let p = &mut c.gateways[i];
    signal(p.pid(), "-TERM");
    let exited = tokio::time::timeout(within, p.child.wait()).await;
    assert!(matches!(exited, Ok(Ok(_))), "{} did not exit within {within:?} of SIGTERM", p.name);
}

/// A rolling restart of gateway `i`: drained with SIGTERM, started again on the same
/// listen and admin addresses, ready before this returns.
pub async fn restart_gateway(c: &mut Cluster, i: usize, drain_within: Duration) {
    terminate_gateway(c, i, drain_within).await;
    c.respawn_gateway(i).await;
}

/// SIGSTOP: the server holds its connections and answers nothing, as a Redis stuck in
/// a long fork, a swap storm or a frozen VM does.
pub fn pause_redis(r: &RedisServer) {
    signal(r.pid().expect("redis is running"), "-STOP");
}

/// SIGCONT: the paused server carries on where it stopped.
pub fn resume_redis(r: &RedisServer) {
    signal(r.pid().expect("redis is running"), "-CONT");
}

/// A private MariaDB on a free port, with its data in a directory of its own, so a test
/// can kill and restart it. Removed when dropped.
pub struct MariaDb {
    pub port: u16,
    dir: PathBuf,
    child: Option<tokio::process::Child>,
    /// Server options of this test (TLS files, say).
    extra: Vec<String>,
}

impl MariaDb {
    /// Initializes a data directory (`root` without a password) and starts the server.
    pub async fn start() -> MariaDb {
        Self::start_with(&[]).await
    }

    /// [`MariaDb::start`] with more server options (`--ssl-cert=...`).
    pub async fn start_with(extra: &[&str]) -> MariaDb {
        let dir = std::env::temp_dir().join(format!("herald-mariadb-{:08x}", rand::random::<u32>()));
        // A temporary directory of its own: bootstraps running side by side in the shared
        // /tmp can collide on their temporary tables' names and abort.
        std::fs::create_dir_all(dir.join("tmp")).expect("mariadb dir");
        let mut failures = Vec::new();
        for _ in 0..3 {
            let _ = std::fs::remove_dir_all(dir.join("data"));
            let out = tokio::process::Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.join("data").display()))
                .arg(format!("--tmpdir={}", dir.join("tmp").display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                .args(run_as_root())
                .output()
                .await
                .expect("mariadb-install-db is installed");
            if out.status.success() {
                break;
            }
            failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert!(failures.len() < 3, "mariadb-install-db failed: {}", failures.join("\n---\n"));
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut db = MariaDb { port: free_port(), dir, child: None, extra };
        db.restart().await;
        db
    }

    /// `mysql://root@127.0.0.1:PORT`, without a database.
    pub fn base_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no shutdown; InnoDB recovers from its log on the next start.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// Starts the server (again) on the same port and data, and waits until it answers
    /// SQL.
    pub async fn restart(&mut self) {
        let d = &self.dir;
        let log = std::fs::File::options().create(true).append(true).open(d.join("stderr.log")).expect("log");
        let child = tokio::process::Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--port={}", self.port))
            // Small and quick: this server holds one test's few thousand rows.
            .args(run_as_root())
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
                "--max-connections=500",
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("mariadbd is installed");
        self.child = Some(child);
        let url = format!("{}/mysql", self.base_url());
        eventually(Duration::from_secs(60), "the private MariaDB answers SQL", || {
            let url = url.clone();
            async move {
                use sqlx::Connection;
                let mut conn = sqlx::MySqlConnection::connect(&url).await.ok()?;
                sqlx::query("SELECT 1").execute(&mut conn).await.ok().map(|_| ())
            }
        })
        .await;
    }
}

/// MariaDB refuses to run as root unless told to; as anyone else it runs as that user.
fn run_as_root() -> Option<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next());
    (uid == Some("0")).then_some("--user=root")
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        if let Some(pid) = self.child.as_ref().and_then(tokio::process::Child::id) {
            // Wait until it has let go of the files before they are removed.
            for _ in 0..50 {
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy in front of one upstream (a gateway), standing for the client's network.
/// [`TcpProxy::cut`] drops every packet from then on, both ways, without closing
/// anything: open connections stay open and silent for good (as when a NAT or a mobile
/// network loses the flow), and new connections are accepted and then held without
/// being forwarded. [`TcpProxy::restore`] lets new connections through again.
pub struct TcpProxy {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, _) = watch::channel(false);
        let rx = cut.subscribe();
        let task = tokio::spawn(async move {
            // Dropping the set (when the proxy is dropped) closes every held socket.
            let mut conns = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                while conns.try_join_next().is_some() {}
                conns.spawn(forward(inbound, upstream, rx.clone()));
            }
        });
        TcpProxy { addr, cut, task }
    }

    /// `http://ADDR`, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: forwarded until the network is cut, then held open and silent.
async fn forward(mut inbound: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        return hold(&[&inbound]).await;
    }
    let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
    let _ = outbound.set_nodelay(true);
    let _ = inbound.set_nodelay(true);
    let was_cut = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
        r = cut.wait_for(|c| *c) => r.is_ok(),
    };
    if was_cut {
        hold(&[&inbound, &outbound]).await;
    }
}

/// Keeps sockets open, unread and unwritten: neither end learns anything.
async fn hold(_sockets: &[&TcpStream]) {
    std::future::pending::<()>().await
}

/// A TCP proxy whose upstream can be switched, standing for the address clients use for
/// Redis (a DNS name or a virtual IP): after a failover it leads to the promoted
/// replica. New connections go to the upstream of the moment; open ones stay where they
/// are until that end closes them.
pub struct SwitchProxy {
    pub addr: SocketAddr,
    upstream: std::sync::Arc<std::sync::Mutex<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl SwitchProxy {
    pub async fn start(upstream: SocketAddr) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let upstream = std::sync::Arc::new(std::sync::Mutex::new(upstream));
        let current = upstream.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                while conns.try_join_next().is_some() {}
                let to = *current.lock().unwrap();
                conns.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(to).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        SwitchProxy { addr, upstream, task }
    }

    /// `redis://ADDR/0`, for Herald.
    pub fn redis_url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    pub fn switch(&self, to: SocketAddr) {
        *self.upstream.lock().unwrap() = to;
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
