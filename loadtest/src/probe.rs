//! `probe`: a canary between two hidden probe accounts (platform `probe`), sending
//! numbered messages to each other through the public path all the time, and exporting
//! what it sees on its own `/metrics`:
//! `herald_probe_sent_total`, `herald_probe_received_total`, `herald_probe_lost_total`
//! (a number not received within `--loss-after-ms`), `herald_probe_duplicates_total`
//! (one number under two ids: shown twice), `herald_probe_disorder_total` (a number
//! arriving after a higher one), `herald_probe_repeats_total` (the same id again: allowed),
//! and `herald_probe_latency_seconds` (send to receipt).
//! Each side reconnects with jittered backoff when its session ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use herald_client::{token, HttpClient, WsClient, WsEvent};
use herald_shared::auth::Platform;
use herald_shared::ids::now_ms;
use herald_shared::protocol::{AckFrame, ClientFrame, SendFrame, ServerFrame};
use serde_json::json;
use serde_json::value::RawValue;

use crate::cli;

/// What one side expects from the other: numbers sent and not yet seen.
/// What the probe writes into each message's body.
#[derive(serde::Deserialize)]
struct ProbeBody {
    probe_n: u64,
    t0: u64,
}

/// Numbers remembered per side: the probe runs for months, its memory must not grow.
const REMEMBERED: u64 = 10_000;

impl Expect {
    /// Forgets numbers far below the highest seen, in batches.
    fn forget_old(&mut self) {
        if self.seen.len() as u64 > 2 * REMEMBERED {
            self.forgotten_below = self.highest.saturating_sub(REMEMBERED);
            let floor = self.forgotten_below;
            self.seen.retain(|n, _| *n >= floor);
        }
    }
}

#[derive(Default)]
struct Expect {
    outstanding: BTreeMap<u64, Instant>,
    seen: HashMap<u64, String>,
    /// Numbers below this are no longer remembered (see [`REMEMBERED`]).
    forgotten_below: u64,
    highest: u64,
}

pub async fn probe(args: &cli::Probe) -> Result<()> {
    let gateways = args.gateways.urls.clone();
    let tls = args.gateways.tls()?;
    let tenant = &args.tenant;
    let interval = Duration::from_millis(args.interval_ms);
    let loss_after = Duration::from_millis(args.loss_after_ms);
    let (duration, listen) = (args.duration, args.listen);
    let secret = args.secret.get()?;
    let name = &args.name;
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));
    let conv = format!("probe-{name}");

    let metrics = herald_shared::telemetry::init_metrics();
    let ready = herald_shared::process::Readiness::default();
    let app = herald_shared::ops::router(metrics, ready.clone());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("probe metrics on http://{}/metrics", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let tok = |user: &str| token(&secret, tenant, user, "probe", Platform::Probe);
    let http = tls.http().timeout(Duration::from_secs(30)).build()?;
    HttpClient::with_http(http, gateways[0].clone(), tok(&a))
        .create_conversation(Some(&conv), "direct", &[&a, &b])
        .await?;
    ready.set_dependencies(true);

    let deadline = (duration > 0).then(|| Instant::now() + Duration::from_secs(duration));
    let to_b: Arc<Mutex<Expect>> = Arc::default();
    let to_a: Arc<Mutex<Expect>> = Arc::default();
    let side_a = tokio::spawn(side(
        gateways.clone(),
        tls.clone(),
        tok(&a),
        conv.clone(),
        to_b.clone(),
        to_a.clone(),
        interval,
        loss_after,
        deadline,
    ));
    let side_b = tokio::spawn(side(
        gateways[1 % gateways.len()..].to_vec(),
        tls,
        tok(&b),
        conv,
        to_a,
        to_b,
        interval,
        loss_after,
        deadline,
    ));
    side_a.await??;
    side_b.await??;
    Ok(())
}

/// One probe account: sends numbers (recorded in `peer_expects`), receives the other's
/// (checked against `mine`).
#[allow(clippy::too_many_arguments)]
async fn side(
    gateways: Vec<String>,
    tls: herald_client::Tls,
    tok: String,
    conv: String,
    peer_expects: Arc<Mutex<Expect>>,
    mine: Arc<Mutex<Expect>>,
    interval: Duration,
    loss_after: Duration,
    deadline: Option<Instant>,
) -> Result<()> {
    let mut n: u64 = 0;
    let mut attempt: u32 = 0;
    while deadline.is_none_or(|d| Instant::now() < d) {
        let gw = &gateways[attempt as usize % gateways.len()];
        let Ok(mut ws) = WsClient::connect_with(gw, &tok, None, &tls).await else {
            attempt += 1;
            let backoff = 100u64 << attempt.min(6);
            tokio::time::sleep(Duration::from_millis(backoff + rand::random::<u64>() % backoff)).await;
            continue;
        };
        attempt = 0;
        let mut tick = tokio::time::interval(interval);
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                ws.close().await;
                return Ok(());
            }
            tokio::select! {
                _ = tick.tick() => {
                    n += 1;
                    let body = json!({"probe_n": n, "t0": now_ms()}).to_string();
                    let frame = ClientFrame::Send(SendFrame {
                        cmid: format!("p{}-{n}", now_ms()),
                        conv: conv.clone(),
                        body: RawValue::from_string(body).expect("JSON"),
                    });
                    if ws.send(&frame).await.is_err() { break; }
                    peer_expects.lock().expect("expect").outstanding.insert(n, Instant::now());
                    metrics::counter!("herald_probe_sent_total").increment(1);
                    // Numbers outstanding too long are lost.
                    let mut e = mine.lock().expect("expect");
                    let late: Vec<u64> = e.outstanding.iter().filter(|(_, t)| t.elapsed() > loss_after).map(|(k, _)| *k).collect();
                    for k in late {
                        e.outstanding.remove(&k);
                        metrics::counter!("herald_probe_lost_total").increment(1);
                    }
                }
                ev = ws.next(Duration::from_secs(3600)) => match ev {
                    Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                        let _ = ws.send(&ClientFrame::Ack(AckFrame { ids: vec![m.id] })).await;
                        let id = m.id.to_string();
                        let Ok(ProbeBody { probe_n: num, t0 }) = serde_json::from_str(m.body.get()) else { continue };
                        let mut e = mine.lock().expect("expect");
                        if num < e.forgotten_below {
                            // Older than what is remembered: a late repeat.
                            metrics::counter!("herald_probe_repeats_total").increment(1);
                            continue;
                        }
                        match e.seen.get(&num) {
                            Some(prev) if *prev == id => metrics::counter!("herald_probe_repeats_total").increment(1),
                            Some(_) => metrics::counter!("herald_probe_duplicates_total").increment(1),
                            None => {
                                if num < e.highest {
                                    metrics::counter!("herald_probe_disorder_total").increment(1);
                                }
                                e.highest = e.highest.max(num);
                                e.seen.insert(num, id);
                                e.outstanding.remove(&num);
                                e.forget_old();
                                metrics::counter!("herald_probe_received_total").increment(1);
                                metrics::histogram!("herald_probe_latency_seconds").record(now_ms().saturating_sub(t0) as f64 / 1000.0);
                            }
                        }
                    }
                    Some(WsEvent::Frame(_) | WsEvent::Other(_)) => {}
                    Some(WsEvent::Closed(_)) | None => break,
                },
            }
        }
    }
    Ok(())
}
