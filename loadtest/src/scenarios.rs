//! WebSocket scenarios: `deliver` (realtime and backlog delivery) and `idle` (memory
//! per idle connection).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use herald_shared::auth::Platform;
use herald_shared::client::{token, HttpClient, WsClient, WsEvent};
use herald_shared::ids::now_ms;
use serde_json::json;

use crate::integrity::{self, Acked, EventLog, Received};
use crate::Args;

type Log<T> = Arc<Mutex<Vec<T>>>;

fn micros_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// Counters shared by all receivers.
#[derive(Default)]
struct Tally {
    delivered: AtomicU64,
    caught_up: AtomicU64,
}

/// One receiving device: acks every `msg` at once; records send-to-receipt latency.
async fn receiver(
    base: String,
    (user, tok): (String, String),
    tally: Arc<Tally>,
    latency: Arc<Mutex<Histogram<u64>>>,
    stop: Arc<AtomicBool>,
    log: Log<Received>,
) -> Result<()> {
    let mut events = Vec::new();
    let mut ws = WsClient::connect(&base, &tok).await.context("connect")?;
    let mut local = histogram();
    while !stop.load(Ordering::Relaxed) {
        match ws.next(Duration::from_millis(500)).await {
            Some(WsEvent::Frame(f)) => match f["t"].as_str() {
                Some("msg") => {
                    if let Some(t0) = f["body"]["t0"].as_u64() {
                        let _ = local.record(micros_now().saturating_sub(t0).max(1));
                    }
                    tally.delivered.fetch_add(1, Ordering::Relaxed);
                    events.push(Received {
                        device: (user.clone(), "d".into()),
                        id: f["id"].as_str().and_then(|i| i.parse().ok()).unwrap_or(0),
                        conv: f["conv"].as_str().unwrap_or_default().to_string(),
                        seq: f["seq"].as_u64().unwrap_or(0),
                    });
                    ws.send(&json!({"t": "ack", "ids": [f["id"]]})).await?;
                }
                Some("caught_up") => {
                    tally.caught_up.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            },
            Some(WsEvent::Closed(code)) => anyhow::bail!("closed by the server: {code:?}"),
            None => {}
        }
    }
    latency.lock().expect("histogram").add(&local).expect("same bounds");
    log.lock().expect("log").extend(events);
    ws.close().await;
    Ok(())
}

fn pct(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    json!({"p50": ms(0.5), "p95": ms(0.95), "p99": ms(0.99), "max": h.max() as f64 / 1000.0, "count": h.len()})
}

/// Realtime: receivers online, one sender per group in a closed loop. Backlog: the
/// receivers go offline, each group gets `backlog` messages, everyone reconnects at once.
pub async fn deliver(args: &Args) -> Result<()> {
    let gateways: Vec<String> = args.text("gateways", "http://127.0.0.1:8080").split(',').map(str::to_owned).collect();
    let receivers: usize = args.get("receivers", 1000)?;
    let group: usize = args.get("group", 10)?;
    let duration = Duration::from_secs(args.get("duration", 20)?);
    let backlog: usize = args.get("backlog", 50)?;
    let secret = args.secret()?;
    let tenant = args.text("tenant", "bench");
    let run = format!("{:x}", now_ms());
    let groups = receivers.div_ceil(group);
    let http = reqwest::Client::builder().pool_max_idle_per_host(groups + 16).build()?;
    let sender_of = |g: usize| {
        HttpClient::with_http(
            http.clone(),
            gateways[g % gateways.len()].clone(),
            token(&secret, &tenant, &format!("{run}-s{g}"), "d", Platform::Server),
        )
    };
    let member = |i: usize| format!("{run}-r{i}");

    eprintln!("provisioning {groups} groups of {group} receivers (+1 sender each) ...");
    for g in 0..groups {
        let mut members: Vec<String> = (g * group..((g + 1) * group).min(receivers)).map(member).collect();
        members.push(format!("{run}-s{g}"));
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        sender_of(g).create_conversation(Some(&format!("{run}-g{g}")), "group", &refs).await?;
    }
    let tok = |i: usize| (member(i), token(&secret, &tenant, &member(i), "d", Platform::Desktop));
    let received: Log<Received> = Arc::new(Mutex::new(Vec::new()));
    let acked: Log<Acked> = Arc::new(Mutex::new(Vec::new()));
    let mut recipients = std::collections::HashMap::new();
    for g in 0..groups {
        let devices: Vec<(String, String)> =
            (g * group..((g + 1) * group).min(receivers)).map(|i| (member(i), "d".to_string())).collect();
        recipients.insert(format!("{run}-g{g}"), devices);
    }

    let connect_all = |tally: Arc<Tally>, latency: Arc<Mutex<Histogram<u64>>>, stop: Arc<AtomicBool>| {
        (0..receivers)
            .map(|i| {
                tokio::spawn(receiver(
                    gateways[i % gateways.len()].clone(),
                    tok(i),
                    tally.clone(),
                    latency.clone(),
                    stop.clone(),
                    received.clone(),
                ))
            })
            .collect::<Vec<_>>()
    };

    // Realtime phase.
    let tally = Arc::new(Tally::default());
    let latency = Arc::new(Mutex::new(histogram()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = connect_all(tally.clone(), latency.clone(), stop.clone());
    while tally.caught_up.load(Ordering::Relaxed) < receivers as u64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{receivers} receivers connected; realtime phase for {duration:?}");
    let send_stop = Arc::new(AtomicBool::new(false));
    let send_hist = Arc::new(Mutex::new(histogram()));
    let mut senders = Vec::new();
    for g in 0..groups {
        let (c, stop, hist, acked) = (sender_of(g), send_stop.clone(), send_hist.clone(), acked.clone());
        let conv = format!("{run}-g{g}");
        let sender = format!("{run}-s{g}");
        senders.push(tokio::spawn(async move {
            let mut local = histogram();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let cmid = format!("rt{n}");
                if let Ok(r) = c.send_until_committed(&cmid, &conv, &json!({"t0": micros_now()}), 10).await {
                    let _ = local.record(t.elapsed().as_micros() as u64);
                    acked.lock().expect("log").push(Acked::of(&r, &sender, "d", cmid));
                }
                n += 1;
            }
            hist.lock().expect("histogram").add(&local).expect("same bounds");
        }));
    }
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = tally.delivered.load(Ordering::Relaxed);
        eprintln!("[{:>4.0}s] {:>7} deliveries+acks/s", started.elapsed().as_secs_f64(), now - last);
        last = now;
    }
    send_stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let realtime_secs = started.elapsed().as_secs_f64();
    let delivered = tally.delivered.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        if let Err(e) = t.await? {
            eprintln!("receiver: {e}");
        }
    }

    // Backlog phase: everyone offline, `backlog` messages per group, then a storm.
    let mut backlog_report = serde_json::Value::Null;
    if backlog > 0 {
        eprintln!("queueing {backlog} messages for each of {groups} groups while receivers are offline ...");
        let mut fill = Vec::new();
        for g in 0..groups {
            let (c, acked) = (sender_of(g), acked.clone());
            let conv = format!("{run}-g{g}");
            let sender = format!("{run}-s{g}");
            fill.push(tokio::spawn(async move {
                for n in 0..backlog {
                    let cmid = format!("bl{n}");
                    if let Ok(r) = c.send_until_committed(&cmid, &conv, &json!({"t0": micros_now()}), 20).await {
                        acked.lock().expect("log").push(Acked::of(&r, &sender, "d", cmid));
                    }
                }
            }));
        }
        for f in fill {
            f.await?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let tally = Arc::new(Tally::default());
        let latency_b = Arc::new(Mutex::new(histogram()));
        let stop = Arc::new(AtomicBool::new(false));
        let storm = Instant::now();
        let tasks = connect_all(tally.clone(), latency_b.clone(), stop.clone());
        let expected = (receivers * backlog) as u64;
        while tally.caught_up.load(Ordering::Relaxed) < receivers as u64 && storm.elapsed() < Duration::from_secs(300) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drain = storm.elapsed().as_secs_f64();
        let got = tally.delivered.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await?;
        }
        eprintln!("backlog of {expected} drained in {drain:.2} s ({got} delivered)");
        backlog_report =
            json!({"messages": expected, "delivered": got, "drain_s": drain, "rate_msg_s": got as f64 / drain});
    }

    let log = EventLog {
        acked: std::mem::take(&mut *acked.lock().expect("log")),
        received: std::mem::take(&mut *received.lock().expect("log")),
        recipients,
    };
    let report = integrity::check(&log);
    eprintln!("integrity: {report:?}");
    let summary = json!({
        "scenario": "deliver",
        "integrity": report,
        "receivers": receivers,
        "group_size": group,
        "gateways": gateways.len(),
        "realtime": {
            "duration_s": realtime_secs,
            "deliveries_acked": delivered,
            "deliveries_per_s": delivered as f64 / realtime_secs,
            "delivery_latency_ms": pct(&latency.lock().expect("histogram")),
            "send_ack_ms": pct(&send_hist.lock().expect("histogram")),
        },
        "backlog": backlog_report,
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if let Some(path) = args.0.get("json") {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    anyhow::ensure!(report.is_clean(), "integrity check failed: {report:?}");
    Ok(())
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("no process {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()))
        .context("VmRSS missing")
}

/// Opens idle sessions and reports the gateway's RSS growth per connection.
pub async fn idle(args: &Args) -> Result<()> {
    let gateways: Vec<String> = args.text("gateways", "http://127.0.0.1:8080").split(',').map(str::to_owned).collect();
    let n: usize = args.get("connections", 10_000)?;
    let pid: u32 = args.get("gateway-pid", 0)?;
    anyhow::ensure!(pid > 0, "--gateway-pid is required (the gateway whose memory is measured)");
    let secret = args.secret()?;
    let tenant = args.text("tenant", "bench");
    let run = format!("{:x}", now_ms());
    let before = rss_kib(pid)?;
    let mut conns = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        let tok = token(&secret, &tenant, &format!("{run}-i{i}"), "d", Platform::Web);
        let mut ws = WsClient::connect(&gateways[0], &tok).await.with_context(|| format!("connection {i}"))?;
        match ws.next(Duration::from_secs(10)).await {
            Some(WsEvent::Frame(f)) if f["t"] == "hello" => conns.push(ws),
            Some(WsEvent::Frame(f)) if f["code"] == "rate_limited" => {
                tokio::time::sleep(Duration::from_millis(f["retry_after_ms"].as_u64().unwrap_or(100))).await;
            }
            other => anyhow::bail!("connection {i}: {other:?}"),
        }
        if (i + 1) % 1000 == 0 {
            eprintln!("{} connections open, gateway RSS {} KiB", i + 1, rss_kib(pid)?);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid)?;
    let open = conns.len();
    let per = (after.saturating_sub(before)) as f64 / open.max(1) as f64;
    let summary = json!({
        "scenario": "idle",
        "connections": open,
        "open_s": started.elapsed().as_secs_f64(),
        "gateway_rss_kib_before": before,
        "gateway_rss_kib_after": after,
        "rss_kib_per_connection": per,
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if let Some(path) = args.0.get("json") {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    for c in conns {
        c.close().await;
    }
    Ok(())
}
