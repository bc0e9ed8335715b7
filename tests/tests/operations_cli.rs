//! The operator's command line of the gateway and the worker, as real processes with a
//! clean environment: `--version`, `check-config`, and a misspelt `HERALD_*` variable
//! refused at start instead of silently running with the default.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use herald_tests::bin;

const SECRET: (&str, &str) = ("HERALD_JWT_SECRET", "operations-cli-secret-0123456789");

/// Runs `name args` with only `env`, and fails the test if it has not exited within 20 s
/// (a process that starts serving instead of refusing its configuration).
fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(bin(name))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            let out = child.wait_with_output().expect("output");
            panic!("{name} {args:?} still runs after 20 s:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_names_the_release_and_needs_no_configuration() {
    for name in ["herald-gateway", "herald-worker"] {
        for flag in ["--version", "-V"] {
            let out = run(name, &[flag], &[]);
            assert!(out.status.success(), "{name} {flag}: {:?}\n{}", out.status, text(&out.stderr));
            let line = text(&out.stdout);
            assert!(line.starts_with(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"))), "{line}");
        }
    }
}

#[test]
fn check_config_accepts_a_valid_configuration_without_connecting() {
    // Nothing listens at these URLs: check-config must not try them.
    let env =
        [SECRET, ("HERALD_MYSQL_URL", "mysql://nobody@127.0.0.1:1/none"), ("HERALD_REDIS_URL", "redis://127.0.0.1:1")];
    for name in ["herald-gateway", "herald-worker"] {
        let out = run(name, &["check-config", "--set", "outbox.max_attempts=3"], &env);
        assert!(out.status.success(), "{name}: {:?}\n{}", out.status, text(&out.stderr));
        assert!(text(&out.stdout).contains("the configuration is valid"), "{}", text(&out.stdout));
    }
}

#[test]
fn check_config_reports_every_bad_key_with_status_2() {
    let dir = std::env::temp_dir().join(format!("herald-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("herald.toml");
    std::fs::write(&file, "listen = \"nowhere\"\n[outbox]\nmax_attempt = 3\n").unwrap();
    let env = [SECRET, ("HERALD_GATEWAY__HEARTBEAT", "1000")];
    for name in ["herald-gateway", "herald-worker"] {
        let out = run(name, &["check-config", "--config", file.to_str().unwrap(), "--set", "log_format=xml"], &env);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        for expected in [
            "listen (in ",
            "outbox.max_attempt (in ",
            "did you mean outbox.max_attempts",
            "gateway.heartbeat (HERALD_GATEWAY__HEARTBEAT): unknown key; did you mean gateway.heartbeat_ms",
            "log_format (flag)",
        ] {
            assert!(err.contains(expected), "{name}: {expected:?} missing from:\n{err}");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A typo in a variable's name was a warning: the gateway started with the default.
#[test]
fn a_misspelt_environment_variable_stops_the_start() {
    for name in ["herald-gateway", "herald-worker"] {
        let out = run(name, &[], &[SECRET, ("HERALD_GATEWAY__HEARTBEAT", "1000"), ("HERALD_LISTEN", "127.0.0.1:0")]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("HERALD_GATEWAY__HEARTBEAT_MS"), "{}", text(&out.stderr));
    }
}

/// The variables Kubernetes sets for a Service named `herald-gateway` are not typos.
#[test]
fn kubernetes_service_links_are_not_refused() {
    let env = [
        SECRET,
        ("HERALD_GATEWAY_SERVICE_HOST", "10.0.0.1"),
        ("HERALD_GATEWAY_SERVICE_PORT", "8080"),
        ("HERALD_GATEWAY_PORT", "tcp://10.0.0.1:8080"),
        ("HERALD_GATEWAY_PORT_8080_TCP_ADDR", "10.0.0.1"),
    ];
    let out = run("herald-gateway", &["check-config"], &env);
    assert!(out.status.success(), "{:?}\n{}", out.status, text(&out.stderr));
    assert!(text(&out.stdout).contains("HERALD_GATEWAY_PORT: not a configuration key"), "{}", text(&out.stdout));
}

/// `runtime_threads` out of range or not a number: refused with its key before any
/// thread starts, not a runtime of 5 000 threads or a panic.
#[test]
fn a_bad_runtime_threads_stops_the_start() {
    for name in ["herald-gateway", "herald-worker"] {
        for (value, expected) in [("5000", "runtime_threads: must be 0..=1024"), ("many", "runtime_threads")] {
            let out = run(name, &[], &[SECRET, ("HERALD_RUNTIME_THREADS", value), ("HERALD_LISTEN", "127.0.0.1:0")]);
            assert_eq!(out.status.code(), Some(2), "{name} {value}: {}", text(&out.stderr));
            let err = text(&out.stderr);
            assert!(err.contains(expected), "{name} {value}: {expected:?} missing from:\n{err}");
            assert!(!err.contains("panicked"), "{name} {value}: {err}");
        }
    }
}
