//! The client's IP address, for the per-IP session limit and logs: the socket peer,
//! unless the peer is a trusted proxy (`gateway.trusted_proxies`), when it is the
//! right-most `X-Forwarded-For` address that is not itself a trusted proxy.
//!
//! Right-most, not left-most: each proxy appends the address it received the request
//! from, so only the entries added by trusted proxies are known to be true; anything to
//! the left of the first untrusted one was written by the client and may be forged.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use herald_shared::config::Cidr;

/// The client behind `peer` (the socket peer, `None` when the request did not come
/// through the listener, as in in-process tests).
pub fn client_ip(trusted: &[Cidr], peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
    let peer = peer?.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(peer) {
        return Some(peer);
    }
    // Several headers are one list in order (RFC 9110, 5.3).
    let hops: Vec<&str> =
        headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        // Garbage in the chain: stop at the last address a trusted proxy vouched for.
        let Some(ip) = parse_hop(hop) else { break };
        client = ip;
        if !is_trusted(ip) {
            break;
        }
    }
    Some(client)
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`[::1]:443` or
/// `192.0.2.1:443`, which some proxies write).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    let ip = hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|a| a.ip()))?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(client_ip(&trusted, ip("192.0.2.9"), &headers(&["203.0.113.1"])), ip("192.0.2.9"));
        assert_eq!(client_ip(&[], ip("10.0.0.1"), &headers(&["203.0.113.1"])), ip("10.0.0.1"));
    }

    #[test]
    fn a_trusted_peer_names_the_right_most_untrusted_hop() {
        let trusted = nets(&["10.0.0.0/8", "fd00::/8"]);
        let forged = headers(&["198.51.100.66, 203.0.113.1, 10.2.0.5"]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &forged), ip("203.0.113.1"));
        let split = headers(&["198.51.100.66", "203.0.113.1", "fd00::7"]);
        assert_eq!(client_ip(&trusted, ip("::ffff:10.0.0.1"), &split), ip("203.0.113.1"));
        let v6 = headers(&["[2001:db8::1]:443"]);
        assert_eq!(client_ip(&trusted, ip("fd00::2"), &v6), ip("2001:db8::1"));
    }

    #[test]
    fn without_a_usable_header_the_last_trusted_hop_is_the_client() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &HeaderMap::new()), ip("10.0.0.1"));
        let all_trusted = headers(&["10.9.9.9, 10.0.0.2"]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &all_trusted), ip("10.9.9.9"));
        let garbage = headers(&["203.0.113.1, unknown, 10.0.0.2"]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &garbage), ip("10.0.0.2"));
        assert_eq!(client_ip(&trusted, None, &headers(&["203.0.113.1"])), None);
    }
}
