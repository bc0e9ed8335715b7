//! The gateway section's checks and defaults, against `load` as a process runs it.

use super::super::testing::{env, SECRET};
use super::super::{load, Role};

#[test]
fn the_heartbeat_must_stay_below_the_nat_idle_timeout() {
    let e = env(&[SECRET, ("HERALD_GATEWAY__HEARTBEAT_MS", "30000")]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    assert!(err.contains("gateway.heartbeat_ms"), "{err}");
    let e = env(&[SECRET, ("HERALD_GATEWAY__HEARTBEAT_MS", "30000"), ("HERALD_GATEWAY__NAT_IDLE_TIMEOUT_MS", "45000")]);
    assert_eq!(load(Role::Gateway, &[], &e).unwrap().0.gateway.heartbeat_ms, 30_000);
}

#[test]
fn abuse_limits_are_validated() {
    let e = env(&[
        SECRET,
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_USER", "0"),
        ("HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP", "0"),
        ("HERALD_GATEWAY__HANDSHAKE_TIMEOUT_MS", "50"),
        ("HERALD_GATEWAY__TENANT_SEND_RATE", "0"),
        ("HERALD_GATEWAY__TENANT_SEND_BURST", "x"),
    ]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    for key in [
        "gateway.max_connections_per_user",
        "gateway.max_connections_per_ip",
        "gateway.handshake_timeout_ms",
        "gateway.tenant_send_rate",
        "gateway.tenant_send_burst",
    ] {
        assert!(err.contains(key), "{key} missing from:\n{err}");
    }
    let (cfg, _) = load(Role::Gateway, &[], &env(&[SECRET])).unwrap();
    assert_eq!(cfg.gateway.handshake_timeout_ms, 10_000);
    assert_eq!(cfg.gateway.max_connections_per_user, 32);
}

#[test]
fn the_backlog_budget_floor_and_targets_are_validated() {
    let e = env(&[
        SECRET,
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE", "5000"),
        ("HERALD_GATEWAY__BACKLOG_RATE_NODE_FLOOR", "6000"),
        ("HERALD_GATEWAY__BACKLOG_LAG_TARGET_MS", "0"),
        ("HERALD_GATEWAY__BACKLOG_REALTIME_TARGET_MS", "60001"),
    ]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    assert!(err.contains("gateway.backlog_rate_node_floor: must be 1..=gateway.backlog_rate_node (5000)"), "{err}");
    assert!(err.contains("gateway.backlog_lag_target_ms: must be 1..=10000"), "{err}");
    assert!(err.contains("gateway.backlog_realtime_target_ms: must be 1..=60000"), "{err}");
    let g = super::GatewayConfig::default();
    assert_eq!((g.backlog_rate_node_floor, g.backlog_lag_target_ms, g.backlog_realtime_target_ms), (2_000, 10, 25));
}

#[test]
fn listener_tls_needs_both_files_readable() {
    let e = env(&[SECRET, ("HERALD_GATEWAY__TLS_CERT_FILE", "/nonexistent/gateway.pem")]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    assert!(err.contains("gateway.tls_key_file: required with gateway.tls_cert_file"), "{err}");
    let e = env(&[
        SECRET,
        ("HERALD_GATEWAY__TLS_CERT_FILE", "/nonexistent/gateway.pem"),
        ("HERALD_GATEWAY__TLS_KEY_FILE", "/nonexistent/gateway-key.pem"),
    ]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    assert!(err.contains("gateway.tls_cert_file: cannot read /nonexistent/gateway.pem"), "{err}");
    assert!(err.contains("gateway.tls_key_file: cannot read /nonexistent/gateway-key.pem"), "{err}");
    assert_eq!(load(Role::Gateway, &[], &env(&[SECRET])).unwrap().0.gateway.tls_files(), None);
}

#[test]
fn trusted_proxies_are_networks_and_a_bad_one_is_named() {
    let e = env(&[SECRET, ("HERALD_GATEWAY__TRUSTED_PROXIES", "10.0.0.0/8, 10.1.2.3/16")]);
    let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
    assert!(err.contains("gateway.trusted_proxies") && err.contains("10.1.2.3/16"), "{err}");
    let e = env(&[SECRET, ("HERALD_GATEWAY__TRUSTED_PROXIES", "10.0.0.0/8,fd00::/8")]);
    let cfg = load(Role::Gateway, &[], &e).unwrap().0;
    assert_eq!(format!("{:?}", cfg.gateway.trusted_proxies), "[10.0.0.0/8, fd00::/8]");
    assert!(super::GatewayConfig::default().trusted_proxies.is_empty());
}

#[test]
fn cors_origins_are_a_list_any_or_none() {
    use super::CorsOrigins;
    let cors = |v: &str| load(Role::Gateway, &[], &env(&[SECRET, ("HERALD_GATEWAY__CORS_ORIGINS", v)]));
    assert_eq!(cors("").unwrap().0.gateway.cors(), CorsOrigins::None);
    assert_eq!(cors("*").unwrap().0.gateway.cors(), CorsOrigins::Any);
    let list = cors("https://chat.example.com, http://localhost:5173").unwrap().0.gateway.cors();
    assert_eq!(list, CorsOrigins::List(vec!["https://chat.example.com".into(), "http://localhost:5173".into()]));
    for wrong in ["chat.example.com", "https://chat.example.com/", "*,https://a.example", "ftp://x"] {
        let err = cors(wrong).unwrap_err().to_string();
        assert!(err.contains("gateway.cors_origins"), "{wrong}: {err}");
    }
}

#[test]
fn the_defaults_are_the_documented_ones() {
    let g = super::GatewayConfig::default();
    assert_eq!((g.send_timeout_ms, g.max_body_bytes, g.require_noeviction), (5_000, 32 * 1024, true));
    assert_eq!((g.heartbeat_ms, g.nat_idle_timeout_ms, g.realtime_queue), (25_000, 30_000, 1_024));
    assert_eq!((g.backlog_rate_node, g.tenant_send_burst), (100_000, 10_000));
}

#[test]
fn the_group_size_is_bounded_by_what_its_largest_event_needs() {
    let at = |n: &str| load(Role::Gateway, &[], &env(&[SECRET, ("HERALD_GATEWAY__MAX_GROUP_SIZE", n)]));
    let (cfg, _) = at("100000").unwrap();
    assert!(cfg.gateway.largest_member_list_bytes() < 16 << 20, "the largest event fits MEDIUMTEXT");
    let err = at("100001").unwrap_err().to_string();
    assert!(err.contains("gateway.max_group_size: must be 2..=100000"), "{err}");
    // The default group's largest change fits a request and a frame.
    let (cfg, _) = load(Role::Gateway, &[], &env(&[SECRET])).unwrap();
    let ids = 1_000 * (64 * 2 + 3);
    assert!(cfg.gateway.largest_members_body_bytes() >= 2 * ids);
    assert!(cfg.gateway.largest_frame_bytes() >= cfg.gateway.history_page_bytes + ids);
}

#[test]
fn the_ingress_pack_bound_is_validated() {
    for bad in ["0", "4097"] {
        let e = env(&[SECRET, ("HERALD_GATEWAY__INGRESS_PACK_MAX", bad)]);
        let err = load(Role::Gateway, &[], &e).unwrap_err().to_string();
        assert!(err.contains("gateway.ingress_pack_max: must be 1..=4096"), "{bad}: {err}");
    }
    let e = env(&[SECRET, ("HERALD_GATEWAY__INGRESS_PACK_MAX", "1")]);
    assert_eq!(load(Role::Gateway, &[], &e).unwrap().0.gateway.ingress_pack_max, 1);
    assert_eq!(super::GatewayConfig::default().ingress_pack_max, 256);
}
