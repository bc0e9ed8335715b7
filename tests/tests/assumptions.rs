//! Assumptions Herald's promises rest on, checked at run time (docs/reliability.md,
//! "Assumptions checked at run time").

use std::time::Duration;

use herald_tests::drill::metric;
use herald_tests::{eventually, Cluster};

/// libfaketime (Debian's `faketime` package; `scripts/services.sh` installs it) shifts
/// the wall clock of the process it is preloaded into, leaving its monotonic clock.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Device sync is gap-free only while a worker's and a gateway's clocks agree within
/// half the settle window. A worker whose clock is 3 s ahead (the settle window is 5 s,
/// so each process may be 1.25 s off Redis's clock) shows its offset and warns; the
/// gateway beside it, on the machine's clock, shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_clock_is_off_shows_it_and_warns() {
    assert!(std::path::Path::new(LIBFAKETIME).exists(), "libfaketime is installed ({LIBFAKETIME})");
    let mut c = Cluster::new("clockskew");
    c.start_worker(&[("LD_PRELOAD", LIBFAKETIME), ("FAKETIME", "+3s"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")]).await;
    c.start_gateway(&[]).await;
    let (worker, gateway) = (c.workers[0].admin_url(), c.gateways[0].admin_url());
    let offset = eventually(Duration::from_secs(20), "the worker's clock offset is measured", || {
        let worker = worker.clone();
        async move {
            let offset = metric(&worker, "herald_clock_offset_seconds").await;
            (offset != 0.0).then_some(offset)
        }
    })
    .await;
    assert!((2.5..3.5).contains(&offset), "the worker is 3 s ahead of Redis: {offset}");
    assert_eq!(metric(&worker, "herald_clock_offset_bound_seconds").await, 1.25, "a quarter of the settle window");
    let on_time = metric(&gateway, "herald_clock_offset_seconds").await;
    assert!(on_time.abs() < 0.5, "the gateway runs on Redis's machine clock: {on_time}");
    assert_eq!(metric(&gateway, "herald_clock_offset_bound_seconds").await, 1.25);
    let log_path = c.log_dir.join(format!("{}.log", c.workers[0].name));
    eventually(Duration::from_secs(10), "the worker warns about its clock", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move { log.contains("this clock is off from Redis's").then_some(()) }
    })
    .await;
    let log = std::fs::read_to_string(c.log_dir.join(format!("{}.log", c.gateways[0].name))).unwrap_or_default();
    assert!(!log.contains("this clock is off"), "the gateway's clock is not warned about");
}
