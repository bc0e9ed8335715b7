//! CPU accounting on made-up readings, and the readers of `/proc`.

use super::*;

fn reading(name: &str, group: Group, cpu_s: Option<f64>) -> Reading {
    Reading { name: name.into(), group, cpu_s, counted: true }
}

fn snapshot(at: Instant, readings: Vec<Reading>, machine: (f64, f64)) -> Snapshot {
    Snapshot { at, readings, machine: Some(machine), errors: Vec::new() }
}

#[test]
fn cpu_per_message_is_the_difference_over_the_messages() {
    let t0 = Instant::now();
    let before = snapshot(
        t0,
        vec![
            reading("gw-1", Group::Gateway, Some(10.0)),
            reading("gw-2", Group::Gateway, Some(5.0)),
            reading("wk-1", Group::Worker, Some(20.0)),
            reading("mariadbd (pid 1)", Group::Mariadb, Some(100.0)),
            Reading { counted: false, ..reading("redis-server (pid 2)", Group::Redis, Some(50.0)) },
            reading("redis (INFO cpu)", Group::Redis, Some(49.0)),
            reading("herald-loadtest (this process)", Group::Loadtest, Some(1.0)),
        ],
        (1000.0, 4000.0),
    );
    let after = snapshot(
        t0 + Duration::from_secs(10),
        vec![
            reading("gw-1", Group::Gateway, Some(12.0)),
            reading("gw-2", Group::Gateway, Some(6.0)),
            reading("wk-1", Group::Worker, Some(24.0)),
            reading("mariadbd (pid 1)", Group::Mariadb, Some(108.0)),
            Reading { counted: false, ..reading("redis-server (pid 2)", Group::Redis, Some(52.5)) },
            reading("redis (INFO cpu)", Group::Redis, Some(51.0)),
            reading("herald-loadtest (this process)", Group::Loadtest, Some(2.5)),
        ],
        (2500.0, 6000.0),
    );
    let c = account(&before, &after, 10_000, 20_000, 2);
    assert!((c.window_s - 10.0).abs() < 1e-6);
    let per = |n: &str| c.us_per_message[n];
    // 3 s of gateways over 10 000 messages: 300 us each.
    assert!((per("gateways") - 300.0).abs() < 1e-6);
    assert!((per("workers") - 400.0).abs() < 1e-6);
    assert!((per("mariadb") - 800.0).abs() < 1e-6);
    // Redis counted once, from INFO (2 s), not from /proc (2.5 s).
    assert!((per("redis") - 200.0).abs() < 1e-6);
    assert!((per("server") - 1700.0).abs() < 1e-6);
    assert!((per("loadtest") - 150.0).abs() < 1e-6);
    let gw1 = c.processes.iter().find(|r| r.name == "gw-1").unwrap();
    assert_eq!((gw1.cpu_s, gw1.us_per_message, gw1.us_per_delivery), (Some(2.0), Some(200.0), Some(100.0)));
    assert!((gw1.cores.unwrap() - 0.2).abs() < 1e-9);
    let redis_proc = c.processes.iter().find(|r| r.name.starts_with("redis-server")).unwrap();
    assert!(!redis_proc.counted);
    assert!((c.machine_busy.unwrap() - 0.75).abs() < 1e-9);
    let md = markdown(&c);
    assert!(md.contains("| **server** | 17.00 | 1.70 | **1700** | 850.0 |"), "{md}");
    assert!(md.contains("(not in the totals)"));
}

#[test]
fn unreadable_or_restarted_processes_are_left_out_and_said() {
    let t0 = Instant::now();
    let before = snapshot(
        t0,
        vec![reading("gw-1", Group::Gateway, Some(10.0)), reading("wk-1", Group::Worker, Some(20.0))],
        (0.0, 0.0),
    );
    let after = snapshot(
        t0 + Duration::from_secs(1),
        vec![reading("gw-1", Group::Gateway, None), reading("wk-1", Group::Worker, Some(1.0))],
        (0.0, 0.0),
    );
    let c = account(&before, &after, 0, 0, 2);
    assert!(c.processes.iter().all(|r| r.cpu_s.is_none()));
    assert!(c.total("server").is_none(), "nothing measured, no total");
    assert!(c.us_per_message.is_empty(), "no messages, nothing per message");
    assert!(c.notes.iter().any(|n| n.contains("wk-1") && n.contains("restarted")), "{:?}", c.notes);
    assert!(c.notes.iter().any(|n| n.starts_with("mariadb not measured")), "{:?}", c.notes);
    assert_eq!(c.machine_busy, None);
}

#[test]
fn gateways_and_workers_are_told_apart() {
    assert_eq!(group_of("a", "# TYPE x\nherald_gateway_sessions 3\n"), Group::Gateway);
    assert_eq!(group_of("a", "herald_worker_owned_shards 8\n"), Group::Worker);
    assert_eq!(group_of("gw-9", "process_cpu_seconds_total 1\n"), Group::Gateway);
    assert_eq!(group_of("wk-2", ""), Group::Worker);
    assert_eq!(group_of("127.0.0.1:9190", ""), Group::Other);
}

#[test]
fn the_machine_s_ticks_leave_out_idle_and_iowait() {
    let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n";
    assert_eq!(machine_ticks(stat), Some((150.0, 1000.0)));
    assert_eq!(machine_ticks("intr 1"), None);
}

#[test]
fn this_process_is_found_in_proc() {
    assert!(proc_cpu_seconds("/proc/self/stat").is_some());
    assert!(cores() >= 1);
}
