//! `probe`: a canary between two hidden probe accounts (platform `probe`), sending
//! numbered messages to each other through the public path all the time, and exporting
//! what it sees on its own `/metrics`:
//! `herald_probe_sent_total`, `herald_probe_received_total`, `herald_probe_lost_total`
//! (a send the gateway acknowledged and that did not arrive within `--loss-after-ms`),
//! `herald_probe_duplicates_total` (one number under two ids: shown twice),
//! `herald_probe_disorder_total` (a number arriving after a higher one),
//! `herald_probe_repeats_total` (the same id again: allowed), and
//! `herald_probe_latency_seconds` (send to receipt).
//! Each side reconnects with jittered backoff when its session ends. A timed run
//! (`--duration`) stops sending at its end and waits up to the loss window for what was
//! acknowledged; with `--fail-on-loss` it then exits non-zero unless messages went both
//! ways and none was lost, duplicated or reordered (`helm test` relies on it).
//!
//! # Layout
//! - this module: the two sides and their sockets.
//! - `accounts`: the two accounts, from narrow tokens or from the shared secret.
//! - [`ledger`]: what is awaited and received, bounded, tested on its own.

mod accounts;
pub mod ledger;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use herald_client::{HttpClient, WsClient, WsEvent};
use herald_shared::ids::now_ms;
use herald_shared::protocol::{AckFrame, ClientFrame, SendFrame, ServerFrame};
use serde_json::json;
use serde_json::value::RawValue;

use self::accounts::accounts;
use self::ledger::{Ledger, Receipt, Unacked};
use crate::cli;

/// What the probe writes into each message's body.
#[derive(serde::Deserialize)]
struct ProbeBody {
    probe_n: u64,
    t0: u64,
}

/// The settings both sides share.
#[derive(Clone)]
struct Plan {
    conv: String,
    interval: Duration,
    loss_after: Duration,
    deadline: Option<Instant>,
}

pub async fn probe(args: &cli::Probe) -> Result<()> {
    if args.fail_on_loss && args.duration == 0 {
        bail!("--fail-on-loss judges a timed run: give --duration");
    }
    let gateways = args.gateways.urls.clone();
    let tls = args.gateways.tls()?;
    let name = &args.name;
    let accounts = accounts(args)?;
    let (a, b) = (accounts.a.sub.clone(), accounts.b.sub.clone());
    let plan = Plan {
        conv: format!("probe-{name}"),
        interval: Duration::from_millis(args.interval_ms),
        loss_after: Duration::from_millis(args.loss_after_ms),
        deadline: (args.duration > 0).then(|| Instant::now() + Duration::from_secs(args.duration)),
    };

    let metrics = herald_shared::telemetry::init_metrics();
    let ready = herald_shared::process::Readiness::default();
    let app = herald_shared::ops::router(metrics, ready.clone());
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!("probe metrics on http://{}/metrics", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let http = tls.http().timeout(Duration::from_secs(30)).build()?;
    HttpClient::with_http(http, gateways[0].clone(), accounts.a.token.clone())
        .create_conversation(Some(&plan.conv), "direct", &[&a, &b])
        .await?;
    ready.set_dependencies(true);

    let to_b: Arc<Mutex<Ledger>> = Arc::default();
    let to_a: Arc<Mutex<Ledger>> = Arc::default();
    let side_a =
        tokio::spawn(side(gateways.clone(), tls.clone(), accounts.a.token, plan.clone(), to_b.clone(), to_a.clone()));
    let side_b = tokio::spawn(side(
        gateways[1 % gateways.len()..].to_vec(),
        tls,
        accounts.b.token,
        plan,
        to_a.clone(),
        to_b.clone(),
    ));
    let faults_a = side_a.await?;
    let faults_b = side_b.await?;
    let (to_a, to_b) = (to_a.lock().expect("ledger"), to_b.lock().expect("ledger"));
    let verdict = format!(
        "received {} and {} (a to b, b to a), lost {}, duplicated or reordered {}",
        to_b.received,
        to_a.received,
        to_a.lost + to_b.lost,
        faults_a + faults_b
    );
    eprintln!("probe finished: {verdict}");
    if args.fail_on_loss
        && (to_a.received == 0 || to_b.received == 0 || to_a.lost + to_b.lost + faults_a + faults_b > 0)
    {
        bail!("the probe failed: {verdict}");
    }
    Ok(())
}

/// One probe account: sends numbers (expected by `peer_expects` once acknowledged) and
/// receives the other's (checked against `mine`) until the plan's deadline and the wait
/// after it. Returns the duplicates and disorders it saw.
async fn side(
    gateways: Vec<String>,
    tls: herald_client::Tls,
    tok: String,
    plan: Plan,
    peer_expects: Arc<Mutex<Ledger>>,
    mine: Arc<Mutex<Ledger>>,
) -> u64 {
    // After the deadline: at least `settle` for the peer's last acknowledgements to be
    // recorded, at most the loss window for what they promise to arrive.
    let settle = plan.loss_after.min(Duration::from_secs(3));
    let finished = |now: Instant| match plan.deadline {
        None => false,
        Some(d) => now >= d + plan.loss_after || (now >= d + settle && mine.lock().expect("ledger").outstanding() == 0),
    };
    let (mut n, mut attempt, mut faults) = (0u64, 0u32, 0u64);
    let mut unacked = Unacked::default();
    while !finished(Instant::now()) {
        let gw = &gateways[attempt as usize % gateways.len()];
        let Ok(mut ws) = WsClient::connect_with(gw, &tok, None, &tls).await else {
            attempt += 1;
            let backoff = 100u64 << attempt.min(6);
            tokio::time::sleep(Duration::from_millis(backoff + rand::random::<u64>() % backoff)).await;
            continue;
        };
        attempt = 0;
        let mut tick = tokio::time::interval(plan.interval);
        loop {
            let now = Instant::now();
            if finished(now) {
                ws.close().await;
                break;
            }
            tokio::select! {
                _ = tick.tick() => {
                    let lost = mine.lock().expect("ledger").expire(now, plan.loss_after);
                    report_lost(lost, plan.loss_after);
                    unacked.forget_older(now, plan.loss_after);
                    if plan.deadline.is_some_and(|d| now >= d) {
                        continue;
                    }
                    n += 1;
                    let body = json!({"probe_n": n, "t0": now_ms()}).to_string();
                    let cmid = format!("p{}-{n}", now_ms());
                    let frame = ClientFrame::Send(SendFrame {
                        cmid: cmid.clone(),
                        conv: plan.conv.clone(),
                        body: RawValue::from_string(body).expect("JSON"),
                    });
                    if ws.send(&frame).await.is_err() { break; }
                    unacked.sent(cmid, n, now);
                    metrics::counter!("herald_probe_sent_total").increment(1);
                }
                ev = ws.next(Duration::from_secs(3600)) => match ev {
                    Some(WsEvent::Frame(ServerFrame::Sent(s))) => {
                        if let Some(n) = unacked.answered(&s.cmid) {
                            peer_expects.lock().expect("ledger").acknowledged(n, Instant::now());
                        }
                    }
                    Some(WsEvent::Frame(ServerFrame::Error(e))) => {
                        // A refused send is not expected anywhere.
                        if let Some(cmid) = &e.reference {
                            unacked.answered(cmid);
                        }
                    }
                    Some(WsEvent::Frame(ServerFrame::Msg(m))) => {
                        let _ = ws.send(&ClientFrame::Ack(AckFrame { ids: vec![m.id] })).await;
                        let Ok(ProbeBody { probe_n: num, t0 }) = serde_json::from_str(m.body.get()) else { continue };
                        let receipt = mine.lock().expect("ledger").received(num, &m.id.to_string());
                        match receipt {
                            Receipt::Repeat => metrics::counter!("herald_probe_repeats_total").increment(1),
                            Receipt::Duplicate => {
                                faults += 1;
                                metrics::counter!("herald_probe_duplicates_total").increment(1);
                            }
                            Receipt::New { disorder } => {
                                if disorder {
                                    faults += 1;
                                    metrics::counter!("herald_probe_disorder_total").increment(1);
                                }
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
        // Sends still unanswered on a closed session may or may not have committed.
        unacked.clear();
    }
    let lost = mine.lock().expect("ledger").expire(Instant::now(), plan.loss_after);
    report_lost(lost, plan.loss_after);
    faults
}

/// Counts (zero included: the series exists from the start, so the first loss shows as
/// an increase) and logs what [`Ledger::expire`] found lost.
fn report_lost(lost: u64, window: Duration) {
    metrics::counter!("herald_probe_lost_total").increment(lost);
    if lost > 0 {
        eprintln!("probe: {lost} acknowledged message(s) not received within {window:?}");
    }
}
