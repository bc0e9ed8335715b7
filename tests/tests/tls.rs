//! TLS on every hop, against real servers started with certificates the test makes
//! (rcgen): a Redis that speaks only TLS, a MariaDB that requires secure transport, and
//! the gateway's own TLS listener. A message goes end to end over `https://` and
//! `wss://`; a plaintext client, a client trusting another CA and a bad certificate
//! file are refused with a clear error, never downgraded to plaintext.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use herald_client::{HttpClient, Tls, WsClient, WsEvent};
use herald_shared::protocol::{Hello, ServerFrame};
use herald_shared::tls::ClientTls;
use herald_tests::faults::MariaDb;
use herald_tests::{bin, free_port, Cluster};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::json;
use sqlx::Connection;
use tokio::io::AsyncReadExt;

/// A test CA, a certificate it signed for `localhost` and `127.0.0.1` (servers and
/// clients alike), and another CA that signed nothing here.
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_ca: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("herald-tls-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca_params = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            p
        };
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params("Herald test CA").self_signed(&ca_key).unwrap();
        let other_key = KeyPair::generate().unwrap();
        let other = ca_params("Another CA").self_signed(&other_key).unwrap();
        let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, "localhost");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf.signed_by(&leaf_key, &ca, &ca_key).unwrap();
        Pki {
            ca: write("ca.pem", ca.pem()),
            cert: write("server.pem", leaf.pem()),
            key: write("server-key.pem", leaf_key.serialize_pem()),
            other_ca: write("other-ca.pem", other.pem()),
            dir,
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

/// A `redis-server` with TLS on a free port and no plaintext port at all.
struct TlsRedis {
    port: u16,
    child: std::process::Child,
}

impl TlsRedis {
    /// A TLS-only Redis of this test's CA. Up when it answers over TLS trusting that CA:
    /// a port that merely accepts could be another test's server (a free port is free
    /// only until someone binds it), and then ours exits and another port is tried.
    async fn start(pki: &Pki) -> TlsRedis {
        let trusted = ClientTls::trusting(Some(pki.ca.clone()));
        for _ in 0..5 {
            let port = free_port();
            let mut child = std::process::Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--tls-cert-file", text(&pki.cert), "--tls-key-file", text(&pki.key)])
                .args(["--tls-ca-cert-file", text(&pki.ca), "--tls-auth-clients", "no"])
                .args(["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let url = format!("rediss://127.0.0.1:{port}/0");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && child.try_wait().expect("redis-server's status").is_none() {
                if herald_shared::redis::pool(&url, &trusted, 1).await.is_ok() {
                    return TlsRedis { port, child };
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("no TLS redis-server came up on any of 5 ports");
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to MySQL at `url` and asks which TLS version the session uses.
async fn mysql_tls_version(url: &str) -> Result<String, sqlx::Error> {
    let mut conn = sqlx::MySqlConnection::connect(url).await?;
    let (_, version): (String, String) =
        sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'").fetch_one(&mut conn).await?;
    Ok(version)
}

/// Gateway and worker on a TLS-only Redis and a MariaDB that refuses plaintext, the
/// gateway serving TLS itself: a send over `https://` reaches a device over `wss://`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_crosses_every_hop_over_tls() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki).await;
    let ssl = [
        format!("--ssl-cert={}", text(&pki.cert)),
        format!("--ssl-key={}", text(&pki.key)),
        format!("--ssl-ca={}", text(&pki.ca)),
        "--require-secure-transport=ON".to_string(),
    ];
    let db = MariaDb::start_with(&ssl.iter().map(String::as_str).collect::<Vec<_>>()).await;

    let mut c = Cluster::with_redis("tls", format!("rediss://127.0.0.1:{}/0", redis.port));
    let base_db = format!("{}/{}", db.base_url(), c.db_name);
    c.mysql_url = format!("{base_db}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}", text(&pki.ca));
    c.redis_tls = ClientTls::trusting(Some(pki.ca.clone()));
    c.set("HERALD_REDIS__TLS_CA_FILE", text(&pki.ca));
    c.start_worker(&[]).await;
    let gateway_tls =
        [("HERALD_GATEWAY__TLS_CERT_FILE", text(&pki.cert)), ("HERALD_GATEWAY__TLS_KEY_FILE", text(&pki.key))];
    c.start_gateway(&[&gateway_tls[..], &[("HERALD_GATEWAY__HANDSHAKE_TIMEOUT_MS", "500")]].concat()).await;

    // MySQL: the server refuses plaintext, and Herald's URL verified its certificate.
    let version = mysql_tls_version(&c.mysql_url).await.expect("TLS to MariaDB");
    assert!(version.starts_with("TLSv1."), "{version}");
    let plain = mysql_tls_version(&format!("{base_db}?ssl-mode=DISABLED")).await;
    assert!(plain.is_err(), "MariaDB requires secure transport");
    let other = format!("{base_db}?ssl-mode=VERIFY_CA&ssl-ca={}", text(&pki.other_ca));
    let err = mysql_tls_version(&other).await.expect_err("another CA's trust fails").to_string();
    assert!(err.to_lowercase().contains("certificate") || err.contains("issuer"), "{err}");

    // The gateway: https:// and wss://, trusting the test CA.
    let base = format!("https://127.0.0.1:{}", c.gateways[0].listen().port());
    let tls = Tls::trusting(Some(&pki.ca)).unwrap();
    let alice = HttpClient::with_http(tls.http().build().unwrap(), base.clone(), c.token("alice", "a1"));
    alice.create_conversation(Some("ab"), "direct", &["alice", "bob"]).await.expect("https");
    let mut ws = WsClient::connect_with(&base, &c.token("bob", "phone"), None, &tls).await.expect("wss");
    ws.next_of::<Hello>(Duration::from_secs(5)).await.expect("hello over wss");
    let sent = alice.send_until_committed("m1", "ab", &json!({ "text": "over TLS" }), 50).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.next(left).await {
            Some(WsEvent::Frame(ServerFrame::Msg(m))) if m.id == sent.id => break,
            Some(WsEvent::Closed(code)) => panic!("closed {code:?}"),
            None => panic!("the message did not arrive over wss"),
            Some(_) => {}
        }
    }

    // ...but not with another CA, nor in plaintext.
    let other = Tls::trusting(Some(&pki.other_ca)).unwrap();
    let refused = WsClient::connect_with(&base, &c.token("bob", "tablet"), None, &other).await;
    assert!(refused.is_err(), "a client trusting another CA must not connect");
    let plain = reqwest::get(format!("http://127.0.0.1:{}/v1/conversations", c.gateways[0].listen().port())).await;
    assert!(plain.is_err(), "plain HTTP to the TLS listener: {plain:?}");

    // A connection that never starts its handshake is closed at the handshake deadline.
    let mut idle = tokio::net::TcpStream::connect(c.gateways[0].listen()).await.unwrap();
    let started = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut [0u8; 16])).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed, not held: {read:?}");
    assert!(started.elapsed() >= Duration::from_millis(400), "closed at the deadline, {:?}", started.elapsed());
}

/// `redis://` to a TLS-only Redis, or `rediss://` trusting another CA, fails at once
/// with an error that says why, and a gateway with the plaintext URL exits at start; a
/// gateway given a certificate file that is no PEM exits with a configuration error
/// naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_untrusted_redis_clients_and_bad_files_are_refused() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki).await;
    let trusted = ClientTls::trusting(Some(pki.ca.clone()));
    let tls_url = format!("rediss://127.0.0.1:{}/0", redis.port);
    herald_shared::redis::pool(&tls_url, &trusted, 1).await.expect("rediss:// with the test CA");

    let plain_url = format!("redis://127.0.0.1:{}/0", redis.port);
    let err = herald_shared::redis::pool(&plain_url, &trusted, 1).await.expect_err("plaintext is refused").to_string();
    assert!(err.contains("a server that requires TLS needs rediss://"), "{err}");

    let other = ClientTls::trusting(Some(pki.other_ca.clone()));
    let err = herald_shared::redis::pool(&tls_url, &other, 1).await.expect_err("another CA is refused").to_string();
    assert!(err.contains("UnknownIssuer") || err.to_lowercase().contains("certificate"), "{err}");

    // The gateway itself stops at start with that error; it never serves over plaintext.
    let stderr = gateway_start_error(&[("HERALD_REDIS_URL", &plain_url)]).await;
    assert!(stderr.contains("a server that requires TLS needs rediss://"), "{stderr}");

    let garbage = pki.dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let stderr = gateway_start_error(&[
        ("HERALD_GATEWAY__TLS_CERT_FILE", text(&garbage)),
        ("HERALD_GATEWAY__TLS_KEY_FILE", text(&pki.key)),
    ])
    .await;
    assert!(stderr.contains("gateway.tls_cert_file") && stderr.contains("no `BEGIN CERTIFICATE` block"), "{stderr}");
}

/// Starts a gateway with only `env` (and a JWT secret) and expects it to exit at once
/// without a panic; what it printed.
async fn gateway_start_error(env: &[(&str, &str)]) -> String {
    let out = tokio::process::Command::new(bin("herald-gateway"))
        .env_clear()
        .env("HERALD_JWT_SECRET", herald_tests::SECRET)
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_ADMIN_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out).await.expect("the gateway exits").unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}
