//! The load-test scenarios, small, against a real cluster: each runs the
//! `herald-loadtest` binary, which must end with a clean integrity check, and writes
//! its JSON, Markdown and SVG report; `chaos` SIGKILLs a gateway and a worker under load;
//! `soak` runs 30 s with windows of seconds and must find the kept state flat.

use std::path::Path;

use herald_tests::{assert_clean, bin, run_scenario, scenario_cluster, scenario_out, Cluster};
use serde_json::Value;

fn assert_charts(dir: &Path, scenario: &str) {
    for chart in ["latency", "throughput"] {
        let svg = std::fs::read_to_string(dir.join(format!("{scenario}-{chart}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<polyline"), "{scenario}-{chart}.svg has lines");
    }
    assert!(dir.join(format!("{scenario}.md")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_fanout_storm_and_idle_deliver_everything_and_report() {
    let c = scenario_cluster("lt-scenarios", 1).await;
    let dir = scenario_out(&c);

    let (code, r) = run_scenario(&c, &["steady", "--conversations", "20", "--rate", "200", "--duration", "3"]).await;
    let r = r.expect("steady report");
    assert_eq!(code, 0, "steady");
    assert_clean(&r);
    assert!(
        r["deliveries"].as_u64().unwrap() >= r["acknowledged_sends"].as_u64().unwrap(),
        "1:1: one delivery per send"
    );
    assert!(r["delivery_realtime_ms"]["count"].as_u64().unwrap() > 0);
    assert!(r["series"].as_array().unwrap().len() >= 3, "a tick per second");
    assert_charts(&dir, "steady");

    let (code, r) =
        run_scenario(&c, &["fanout", "--receivers", "60", "--group", "30", "--rate", "20", "--duration", "3"]).await;
    let r = r.expect("fanout report");
    assert_eq!(code, 0, "fanout");
    assert_clean(&r);
    let sends = r["acknowledged_sends"].as_u64().unwrap();
    assert!(r["deliveries"].as_u64().unwrap() >= 30 * sends, "every group message reaches its 30 members");

    let (code, r) = run_scenario(
        &c,
        &[
            "storm",
            "--devices",
            "60",
            "--backlog",
            "20",
            "--group",
            "30",
            "--realtime",
            "4",
            "--rate",
            "20",
            "--warm-up",
            "0.5",
            "--baseline",
            "1",
        ],
    )
    .await;
    let r = r.expect("storm report");
    assert_eq!(code, 0, "storm");
    assert_clean(&r);
    assert_eq!(r["extra"]["drained"].as_u64(), Some(60 * 20), "the whole backlog arrives as backlog");
    assert!(r["delivery_backlog_ms"]["count"].as_u64().unwrap() >= 1200);
    assert!(r["extra"]["drain_s"].as_f64().unwrap() > 0.0);
    let (sending, baseline) =
        (r["extra"]["realtime_from_s"].as_f64().unwrap(), r["extra"]["realtime_baseline_from_s"].as_f64().unwrap());
    assert!(baseline >= sending + 0.5, "the baseline leaves out the senders' warm-up: {sending} -> {baseline}");
    assert!(dir.join("storm-drain.svg").exists(), "the drain curve");

    let pid = c.gateways[0].pid().to_string();
    let (code, r) =
        run_scenario(&c, &["idle", "--connections", "150", "--group", "50", "--hold", "1", "--gateway-pid", &pid])
            .await;
    let r = r.expect("idle report");
    assert_eq!(code, 0, "idle");
    assert_clean(&r);
    assert_eq!(r["extra"]["connections"].as_u64(), Some(150));
    assert!(r["extra"]["rss_kib_per_connection"].as_f64().is_some());

    let md = c.log_dir.join("capacity-report.md");
    let status = tokio::process::Command::new(bin("herald-loadtest"))
        .args(["report", "--dir", dir.to_str().unwrap(), "--out", md.to_str().unwrap()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let md = std::fs::read_to_string(md).unwrap();
    for row in
        ["durable sends, 1:1", "deliveries + acks per second", "idle connections", "login storm", "lost / shown twice"]
    {
        assert!(md.contains(row), "the capacity report has the target row {row:?}:\n{md}");
    }
    assert!(md.contains("| `storm` |"), "an integrity row per scenario");
}

/// `--admin NAME=URL` of every process and the cluster's `--redis-url`, for the CPU table.
fn measure(c: &Cluster) -> Vec<String> {
    let mut args: Vec<String> = c
        .workers
        .iter()
        .chain(&c.gateways)
        .flat_map(|p| ["--admin".to_string(), format!("{}={}", p.name, p.admin_url())])
        .collect();
    args.extend(["--redis-url".to_string(), c.redis_url.clone()]);
    args
}

fn with<'a>(args: &[&'a str], more: &'a [String]) -> Vec<&'a str> {
    args.iter().copied().chain(more.iter().map(String::as_str)).collect()
}

/// A total's CPU microseconds per acknowledged message.
fn us_per_message(r: &Value, total: &str) -> f64 {
    r["cpu"]["us_per_message"][total].as_f64().unwrap_or_else(|| panic!("no CPU per message for {total}: {}", r["cpu"]))
}

fn pct(r: &Value, field: &str) -> (u64, f64, f64) {
    let p = &r[field];
    (
        p["count"].as_u64().unwrap_or_else(|| panic!("no {field}")),
        p["p50"].as_f64().unwrap(),
        p["p99"].as_f64().unwrap(),
    )
}

/// The CPU table of a report: per message for the gateways, the workers, Redis, the
/// server and the load-test, and a row per process measured.
fn assert_cpu(c: &Cluster, r: &Value) {
    let cpu = &r["cpu"];
    assert!(cpu["messages"].as_u64().unwrap() > 0 && cpu["window_s"].as_f64().unwrap() > 2.5, "{cpu}");
    for total in ["gateways", "workers", "redis", "server", "loadtest"] {
        assert!(us_per_message(r, total) > 0.0, "{total}: {cpu}");
    }
    assert!(us_per_message(r, "server") >= us_per_message(r, "gateways") + us_per_message(r, "workers"));
    let names: Vec<&str> = cpu["processes"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    for p in c.workers.iter().chain(&c.gateways) {
        assert!(names.contains(&p.name.as_str()), "{} has its row: {names:?}", p.name);
    }
    assert!(names.contains(&"redis (INFO cpu)"), "{names:?}");
}

/// Offered against achieved: the schedule was kept at this small rate, latencies count
/// from the due time (never less than from the actual send), and a verdict says so.
fn assert_load(r: &Value, via: &str) {
    let load = &r["load"];
    let (offered, achieved) = (load["offered_per_s"].as_f64().unwrap(), load["achieved_per_s"].as_f64().unwrap());
    assert!(achieved > 0.0 && achieved <= offered * 1.05, "achieved {achieved} of {offered}");
    assert_eq!(load["via"], via);
    assert_eq!(load["sent"].as_u64(), r["acknowledged_sends"].as_u64(), "every send that went out was acknowledged");
    let verdict = load["verdict"].as_str().unwrap();
    assert!(["not saturated", "limit: "].iter().any(|v| verdict.starts_with(v)), "{verdict}");
    assert!(load["generator_cores"].as_f64().unwrap() > 0.0, "{load}");
    let (lags, ..) = pct(load, "send_lag_ms");
    assert_eq!(lags, load["sent"].as_u64().unwrap(), "a send lag per send");
    for (due, sent) in
        [("send_ack_ms", "send_ack_from_actual_ms"), ("delivery_realtime_ms", "delivery_realtime_from_actual_ms")]
    {
        let ((n_due, p50_due, p99_due), (n_sent, p50_sent, p99_sent)) = (pct(r, due), pct(r, sent));
        assert!(n_due > 0 && n_due == n_sent, "{due} {n_due} / {sent} {n_sent}");
        assert!(
            p50_due >= p50_sent && p99_due >= p99_sent,
            "{due} {p50_due}/{p99_due} >= {sent} {p50_sent}/{p99_sent}"
        );
    }
}

/// `steady` over HTTP with every process measured: the CPU each spent per message,
/// offered against achieved, and the latencies from the due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_reports_cpu_per_message_and_offered_against_achieved() {
    let c = scenario_cluster("lt-measure", 1).await;
    let m = measure(&c);
    let (code, r) =
        run_scenario(&c, &with(&["steady", "--conversations", "20", "--rate", "200", "--duration", "3"], &m)).await;
    let r = r.expect("steady report");
    assert_eq!(code, 0, "steady");
    assert_clean(&r);
    assert_cpu(&c, &r);
    assert_load(&r, "http");
    let md = std::fs::read_to_string(scenario_out(&c).join("steady.md")).unwrap();
    for text in [
        "| process | CPU s | cores busy | µs per message | µs per delivery |",
        "| **server** |",
        "Offered 200 msg/s (open loop, 20 senders over http, up to 1 in flight each)",
        "| send to ack (HTTP 200), from the due time |",
        "| send to ack (HTTP 200), from the actual send |",
        "| send lag (actual send after its due time) |",
    ] {
        assert!(md.contains(text), "{text:?} in:\n{md}");
    }
}

/// `typing`: every typing frame is shown to the group's other online members, every
/// reconnect to the user's followers as two presence changes, and the report says what
/// each cost the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_and_presence_are_relayed_and_their_cost_reported() {
    let c = scenario_cluster("lt-typing", 1).await;
    let m = measure(&c);
    let args = ["typing", "--receivers", "20", "--group", "5", "--rate", "8", "--duration", "3", "--churn", "2"];
    let (code, r) = run_scenario(&c, &with(&args, &m)).await;
    let r = r.expect("typing report");
    assert_eq!(code, 0, "typing");
    let i = &r["integrity"];
    assert_eq!((i["lost"].as_u64(), i["shown_twice"].as_u64()), (Some(0), Some(0)), "{i}");
    let e = &r["extra"];
    let (sent, shown, owed) =
        (e["typing_sent"].as_u64().unwrap(), e["typing_shown"].as_u64().unwrap(), e["typing_owed"].as_u64().unwrap());
    assert!(sent >= 20, "8 frames/s for 3 s: {e}");
    assert_eq!(owed, 4 * sent, "each frame is owed to the group's 4 other members");
    assert!(shown * 100 >= owed * 95 && shown <= owed, "typing shown {shown} of {owed}");
    assert_eq!(e["presence_followed"], 20 * 4, "every device follows its group's 4 other members");
    let at_start = e["presence_shown_at_start"].as_u64().unwrap();
    assert!(at_start >= 20 * 4, "each follower told each followed user's presence: {at_start}");
    let reconnects = e["presence_reconnects"].as_u64().unwrap();
    assert!(reconnects >= 4, "2 reconnects/s for 3 s: {e}");
    // Each reconnect: offline and online to its 4 followers, and its own 4 followed users again.
    let presence = e["presence_shown"].as_u64().unwrap();
    assert!(presence >= reconnects * 4 * 2, "presence frames {presence} for {reconnects} reconnects");
    for phase in ["typing_server_us_per_frame", "typing_server_us_per_shown", "presence_server_us_per_reconnect"] {
        for total in ["gateways", "server"] {
            assert!(e[phase][total].as_f64().is_some_and(|v| v > 0.0), "{phase}.{total}: {e}");
        }
    }
    let md = std::fs::read_to_string(scenario_out(&c).join("typing.md")).unwrap();
    assert!(md.contains("typing_shown"), "{md}");
}

/// Senders over their own WebSocket sessions (`send` answered by `sent`), a few sends in
/// flight each: everything is delivered once and in order, measured as over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_over_websocket_deliver_everything_and_are_measured() {
    let c = scenario_cluster("lt-ws", 1).await;
    let m = measure(&c);
    let (code, r) = run_scenario(
        &c,
        &with(
            &["steady", "--conversations", "20", "--rate", "200", "--duration", "3", "--via", "ws", "--in-flight", "4"],
            &m,
        ),
    )
    .await;
    let r = r.expect("steady report");
    assert_eq!(code, 0, "steady over ws");
    assert_clean(&r);
    assert_eq!(r["send_errors"].as_u64(), Some(0));
    assert!(
        r["deliveries"].as_u64().unwrap() >= r["acknowledged_sends"].as_u64().unwrap(),
        "1:1: one delivery per send"
    );
    assert_eq!(r["load"]["in_flight"].as_u64(), Some(4));
    assert_cpu(&c, &r);
    assert_load(&r, "ws");
    let md = std::fs::read_to_string(scenario_out(&c).join("steady.md")).unwrap();
    assert!(md.contains("| send to ack (`sent`), from the due time |"), "{md}");

    let (code, r) = run_scenario(
        &c,
        &with(&["fanout", "--receivers", "60", "--group", "30", "--rate", "20", "--duration", "3", "--via", "ws"], &m),
    )
    .await;
    let r = r.expect("fanout report");
    assert_eq!(code, 0, "fanout over ws");
    assert_clean(&r);
    let sends = r["acknowledged_sends"].as_u64().unwrap();
    assert!(r["deliveries"].as_u64().unwrap() >= 30 * sends, "every group message reaches its 30 members");
    assert_cpu(&c, &r);
    assert_load(&r, "ws");
    let server = r["cpu"]["totals"].as_array().unwrap().iter().find(|t| t["name"] == "server").unwrap();
    assert!(server["us_per_delivery"].as_f64().unwrap() > 0.0, "fan-out is costed per delivery too: {server}");
}

/// `steady` with timeline changes: every fifth message is edited, then recalled, by its
/// sender. The integrity check counts each change's event like a message (owed to the
/// receiver, shown once, in its place), and each change is committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeline_changes_under_load_are_checked_like_messages() {
    let c = scenario_cluster("lt-changes", 1).await;
    let args = ["steady", "--conversations", "10", "--rate", "100", "--duration", "3", "--change-every", "5"];
    let (code, r) = run_scenario(&c, &args).await;
    let r = r.expect("steady report");
    assert_eq!(code, 0, "steady with changes");
    assert_clean(&r);
    assert_eq!(r["send_errors"].as_u64(), Some(0));
    let db = c.db().await;
    let (messages, events): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*) - COUNT(event), COUNT(event) FROM messages").fetch_one(&db).await.unwrap();
    assert!(events >= 10, "{events} changes in 3 s");
    assert_eq!(events, messages / 5, "one change every five messages, each committed once");
    let acknowledged = r["integrity"]["acknowledged"].as_i64().unwrap();
    assert_eq!(acknowledged, messages + events, "the check counted every event: {}", r["integrity"]);
    let edited: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE edited_seq IS NOT NULL").fetch_one(&db).await.unwrap();
    let recalled: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE recalled_seq IS NOT NULL")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(edited + recalled, events, "edits and recalls, alternately");
    assert!((edited - recalled).abs() <= 10, "{edited} edited, {recalled} recalled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_a_gateway_and_a_worker_under_load_and_loses_nothing() {
    let c = scenario_cluster("lt-chaos", 2).await;
    let (code, _) = run_scenario(&c, &["chaos", "--duration", "1"]).await;
    assert_eq!(code, 2, "chaos without an action is a usage error");

    let kill_gw = format!("2=kill -9 {}", c.gateways[1].pid());
    let kill_wk = format!("4=kill -9 {}", c.workers[0].pid());
    let (code, r) = run_scenario(
        &c,
        &[
            "chaos",
            "--conversations",
            "20",
            "--rate",
            "100",
            "--duration",
            "8",
            "--action",
            &kill_gw,
            "--action",
            &kill_wk,
        ],
    )
    .await;
    let r = r.expect("chaos report");
    assert_eq!(code, 0, "chaos: {r}");
    assert_clean(&r);
    let actions = r["extra"]["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2);
    assert!(actions.iter().all(|a| a["status"] == "ok"), "{actions:?}");
    assert!(r["extra"]["sessions"].as_u64().unwrap() > 20, "devices on the killed gateway reconnected");
    assert!(r["reconnect_catch_up_ms"]["count"].as_u64().unwrap() > 0, "catch-up after reconnect is measured");
}

/// `soak` with windows scaled down to seconds: frames live 3 s, SENT outbox rows 5 s,
/// fan-out markers the 9 s retry window. Devices leave, join and reconnect; what the
/// cluster keeps must stay flat after the warm-up, while the messages table, kept for
/// days, is reported growing and exempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_churn_keeps_state_flat_and_delivers_everything() {
    let mut c = Cluster::new("lt-soak");
    for (k, v) in [
        ("HERALD_WORKER__MESSAGE_TTL_S", "3"),
        // Purged every 0.5 s: the count swings by a tenth of what 5 s of rows make.
        ("HERALD_OUTBOX__SENT_RETENTION_S", "5"),
        ("HERALD_OUTBOX__FIXED_DELAY_MS", "500"),
        ("HERALD_OUTBOX__BACKOFF_MS", "1000"),
        ("HERALD_OUTBOX__MAX_ATTEMPTS", "2"),
        ("HERALD_OUTBOX__SENDING_STALE_MS", "2000"),
        ("HERALD_GATEWAY__WATERMARK_MARGIN_MS", "10000"),
        ("HERALD_GATEWAY__WATERMARK_FLUSH_MS", "2000"),
        ("HERALD_DELIVERY__DEVICE_TTL_S", "60"),
        ("HERALD_WORKER__JANITOR_INTERVAL_MS", "1000"),
        // A transaction per batch at this rate, so the outbox's row count follows the
        // send rate and not the machine's load: with fewer commits in flight, or a
        // second one only after an overlap, batches group up while the box is busy
        // (another test beside this one), which changes the rows written per second,
        // not what is kept.
        ("HERALD_WORKER__COMMITS_IN_FLIGHT", "8"),
        ("HERALD_WORKER__COMMIT_OVERLAP_MS", "0"),
        ("HERALD_GATEWAY__SEND_RATE", "100000"),
        ("HERALD_GATEWAY__SEND_BURST", "100000"),
    ] {
        c.set(k, v);
    }
    c.start_worker(&[]).await;
    c.start_gateway(&[]).await;
    c.start_gateway(&[]).await;
    let admins: Vec<String> =
        c.workers.iter().chain(&c.gateways).map(|p| format!("{}={}", p.name, p.admin_url())).collect();
    let mut args = vec![
        "soak",
        "--conversations",
        "20",
        "--rate",
        "100",
        "--duration",
        "30",
        "--warmup",
        "12",
        "--churn-every",
        "5",
        "--sample-every",
        "2",
        "--redis-url",
        &c.redis_url,
        "--redis-prefix",
        &c.prefix,
        "--mysql-url",
        &c.mysql_url,
    ];
    for a in &admins {
        args.extend(["--admin", a]);
    }
    let (code, r) = run_scenario(&c, &args).await;
    let r = r.expect("soak report");
    let soak = &r["extra"]["soak"];
    assert_eq!(code, 0, "soak: growing {} / integrity {}", soak["growing"], r["integrity"]);
    assert_clean(&r);
    for churned in ["left", "joined", "reconnected"] {
        assert!(r["extra"][churned].as_u64().unwrap() >= 4, "{churned}: {}", r["extra"]);
    }
    assert_eq!(soak["bounded"], true);
    let series = soak["series"].as_array().unwrap();
    let row = |name: &str| series.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name}"));
    for name in ["redis.used_memory", "keys.m", "keys.fo", "rows.outbox_events", "rows.devices_live", "rss.gw-2"] {
        assert_eq!(row(name)["verdict"], "flat", "{name}: {}", row(name));
        assert!(row(name)["samples"].as_u64().unwrap() >= 7, "{}", row(name));
    }
    assert_eq!(row("rows.messages")["verdict"], "grows", "the slope test sees history grow");
    assert_eq!(row("rows.messages")["exempt"], true);
    assert!(row("writes.mysql_insert")["mean"].as_f64().unwrap() > 0.0);
    let dir = scenario_out(&c);
    assert_charts(&dir, "soak");
    for chart in ["redis-memory", "keys", "rows", "rss", "cpu", "mysql-writes", "redis-commands"] {
        let svg = std::fs::read_to_string(dir.join(format!("soak-{chart}.svg"))).unwrap();
        assert!(svg.contains("<polyline"), "soak-{chart}.svg has lines");
    }
    let md = std::fs::read_to_string(dir.join("soak.md")).unwrap();
    assert!(
        md.contains("Bounded state: **every checked series is flat**") && md.contains("| `keys.m` (count) |"),
        "{md}"
    );
}
