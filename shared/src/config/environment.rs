//! Which `HERALD_*` variables are not configuration keys and still allowed: the
//! variables Kubernetes sets for a Service whose name starts with `herald`
//! (`enableServiceLinks`), and the few that Herald's own tooling reads. Any other
//! `HERALD_*` variable that names no key is a typo and refused at start, with the
//! nearest key suggested.

use std::net::IpAddr;

use super::keys;

/// Variables of Herald's tooling, never configuration: the commit a build embeds
/// (read at compile time) and the binaries' folder of the TypeScript client's tests.
const TOOLING: &[&str] = &["HERALD_GIT_COMMIT", "HERALD_BIN_DIR"];

/// Whether `var=value` is allowed although it names no key.
pub(super) fn tolerated(var: &str, value: &str) -> bool {
    TOOLING.contains(&var) || service_link(var, value)
}

/// Whether `var=value` is one of the Docker-link style variables Kubernetes sets for a
/// Service (`<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORT>]`, `<NAME>_PORT`,
/// `<NAME>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR]`). The value must have the shape
/// Kubernetes gives it too, so a misspelt key ending in `_PORT` is still refused.
fn service_link(var: &str, value: &str) -> bool {
    if var.contains("__") {
        return false; // a section's key; Service names give single underscores
    }
    let ip = value.parse::<IpAddr>().is_ok();
    let number = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    let url = ["tcp://", "udp://", "sctp://"].iter().any(|p| value.starts_with(p));
    if var.ends_with("_SERVICE_HOST") {
        return ip;
    }
    if var.ends_with("_SERVICE_PORT") || var.contains("_SERVICE_PORT_") {
        return number;
    }
    if var.ends_with("_PORT") && url {
        return true;
    }
    // <NAME>_PORT_<N>_<PROTO>, then nothing, _PROTO, _PORT or _ADDR.
    var.rmatch_indices("_PORT_").any(|(at, _)| {
        let rest = &var[at + "_PORT_".len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Some(rest) = rest[digits..].strip_prefix('_').filter(|_| digits > 0) else { return false };
        let Some(tail) = ["TCP", "UDP", "SCTP"].iter().find_map(|p| rest.strip_prefix(p)) else { return false };
        match tail {
            "" => url,
            "_PROTO" => ["tcp", "udp", "sctp"].contains(&value),
            "_PORT" => number,
            "_ADDR" => ip,
            _ => false,
        }
    })
}

/// The key nearest to an unknown `name` (at most a third of its letters edited), for
/// "did you mean" hints.
pub(super) fn nearest_key(name: &str) -> Option<&'static str> {
    keys().map(|k| (distance(name, k.name), k.name)).filter(|(d, _)| *d * 3 <= name.len().max(3)).min().map(|(_, k)| k)
}

/// Levenshtein distance, on bytes (keys are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_service_links_are_tolerated_by_name_and_value() {
        for (var, value) in [
            ("HERALD_SERVICE_HOST", "10.0.0.1"),
            ("HERALD_GATEWAY_SERVICE_HOST", "fd00::1"),
            ("HERALD_GATEWAY_SERVICE_PORT", "8080"),
            ("HERALD_GATEWAY_SERVICE_PORT_HTTP", "8080"),
            ("HERALD_GATEWAY_PORT", "tcp://10.0.0.1:8080"),
            ("HERALD_GATEWAY_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
            ("HERALD_GATEWAY_PORT_8080_TCP_PROTO", "tcp"),
            ("HERALD_GATEWAY_PORT_8080_TCP_PORT", "8080"),
            ("HERALD_GATEWAY_PORT_8080_TCP_ADDR", "10.0.0.1"),
            ("HERALD_GIT_COMMIT", "abc"),
        ] {
            assert!(tolerated(var, value), "{var}={value}");
        }
        for (var, value) in [
            ("HERALD_GATEWAY_SERVICE_HOST", "gateway.local"),
            ("HERALD_ADMIN_PORT", "9090"),
            ("HERALD_GATEWAY__HEARTBEAT", "1000"),
            ("HERALD_GATEWAY__PORT_8080_TCP", "tcp://10.0.0.1:8080"),
            ("HERALD_GATEWAY_PORT_X_TCP", "tcp://10.0.0.1:8080"),
            ("HERALD_GATEWAY_PORT_8080_TCP_NAME", "x"),
            ("HERALD_LISTN", "127.0.0.1:1"),
        ] {
            assert!(!tolerated(var, value), "{var}={value}");
        }
    }

    #[test]
    fn the_nearest_key_is_suggested_only_when_near() {
        assert_eq!(nearest_key("gateway.heartbeat"), Some("gateway.heartbeat_ms"));
        assert_eq!(nearest_key("listn"), Some("listen"));
        assert_eq!(nearest_key("service_host"), None);
        assert_eq!(nearest_key("something.else.entirely"), None);
    }
}
