//! The probe canary against a real cluster: numbered messages between two probe
//! accounts, counted on the probe's own `/metrics`.

use std::time::Duration;

use herald_tests::{bin, eventually, Cluster, SECRET};
use tokio::io::AsyncBufReadExt;

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_counts_messages_both_ways_and_sees_no_loss() {
    let mut c = Cluster::new("probe");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let gateways = format!("{},{}", c.gateways[0].base_url(), c.gateways[1].base_url());
    let mut probe = tokio::process::Command::new(bin("herald-loadtest"))
        .args(["probe", "--gateways", &gateways, "--interval-ms", "100", "--duration", "30", "--listen", "127.0.0.1:0"])
        .env("HERALD_JWT_SECRET", SECRET)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // It says where it listens; the rest of its output goes on to the test's.
    let mut lines = tokio::io::BufReader::new(probe.stderr.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("{line}");
            if let Some(url) = line.strip_prefix("probe metrics on ") {
                return url.to_owned();
            }
        }
        panic!("the probe exited before it listened");
    })
    .await
    .expect("the probe listens within 30 s");
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
        }
    });
    let metrics = eventually(Duration::from_secs(30), "the probe has exchanged 40 messages", || {
        let url = url.clone();
        async move {
            let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
            (counter(&text, "herald_probe_received_total") >= 40.0).then_some(text)
        }
    })
    .await;
    assert!(counter(&metrics, "herald_probe_sent_total") >= 40.0, "{metrics}");
    // Past the loss window (2 s) for everything sent so far: a lost message would count now.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let metrics = reqwest::get(&url).await.unwrap().text().await.unwrap();
    assert!(counter(&metrics, "herald_probe_received_total") >= 60.0, "the canary kept flowing: {metrics}");
    assert_eq!(counter(&metrics, "herald_probe_lost_total"), 0.0);
    assert_eq!(counter(&metrics, "herald_probe_duplicates_total"), 0.0);
    assert_eq!(counter(&metrics, "herald_probe_disorder_total"), 0.0);
    assert!(metrics.contains("herald_probe_latency_seconds"), "{metrics}");
    let _ = probe.kill().await;
}

/// A timed run with `--fail-on-loss` (`helm test`): its exit status and last line.
async fn timed_run(gateways: &str) -> (bool, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin("herald-loadtest"))
            // The chart's loss window: two test clusters share two cores, a debug build's
            // delivery can take a second or two.
            .args(["probe", "--gateways", gateways, "--interval-ms", "100", "--loss-after-ms", "5000"])
            .args(["--duration", "3", "--fail-on-loss", "--listen", "127.0.0.1:0"])
            .env("HERALD_JWT_SECRET", SECRET)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a timed probe ends by itself")
    .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `--fail-on-loss` passes a healthy cluster, and fails one where nothing gets through;
/// sends the gateway never acknowledged (no worker commits them) are not counted lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_probe_fails_when_messages_do_not_get_through() {
    let mut c = Cluster::new("probe-verdict");
    c.start_worker(&[]).await;
    c.start_gateway(&[("HERALD_GATEWAY__SEND_TIMEOUT_MS", "1000")]).await;
    let gw = c.gateways[0].base_url();
    let (ok, log) = timed_run(&gw).await;
    assert!(ok, "a healthy cluster passes:\n{log}");
    assert!(log.contains("lost 0, duplicated or reordered 0"), "{log}");

    c.workers[0].kill().await;
    let (ok, log) = timed_run(&gw).await;
    assert!(!ok, "nothing is committed without a worker, so nothing arrives:\n{log}");
    assert!(log.contains("received 0 and 0") && log.contains("lost 0,"), "unacknowledged is not lost:\n{log}");
}

/// The probe and `helm test` run with two tokens of the probe tenant (a narrow
/// credential), not with the key that signs every tenant's tokens; tokens of two
/// tenants, or only one token, are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_runs_with_its_narrow_tokens_and_no_secret() {
    let mut c = Cluster::new("probe-tokens");
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    let gw = c.gateways[0].base_url();
    let mint = |tenant: &str, user: &str| {
        let out = std::process::Command::new(bin("herald-loadtest"))
            .args(["token", "--tenant", tenant, "--user", user, "--device", "probe", "--platform", "probe"])
            .args(["--ttl-s", "600", "--secret", SECRET])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let run = |a: String, b: Option<String>| {
        let mut cmd = tokio::process::Command::new(bin("herald-loadtest"));
        cmd.args(["probe", "--gateways", &gw, "--interval-ms", "100", "--loss-after-ms", "5000"])
            .args(["--duration", "3", "--fail-on-loss", "--listen", "127.0.0.1:0"])
            .env_remove("HERALD_JWT_SECRET")
            .env("PROBE_TOKEN_A", a)
            .kill_on_drop(true);
        if let Some(b) = b {
            cmd.env("PROBE_TOKEN_B", b);
        }
        async move {
            let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.unwrap().unwrap();
            (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    let (ok, log) = run(mint("probe", "canary-a"), Some(mint("probe", "canary-b"))).await;
    assert!(ok, "the probe passes with its two tokens:\n{log}");
    assert!(log.contains("lost 0, duplicated or reordered 0"), "{log}");
    let (ok, log) = run(mint("probe", "canary-a"), Some(mint("acme", "canary-b"))).await;
    assert!(!ok && log.contains("two users of one tenant"), "{log}");
    let (ok, log) = run(mint("probe", "canary-a"), None).await;
    assert!(!ok && log.contains("or neither"), "{log}");
}
