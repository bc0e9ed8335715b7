//! An IP network in CIDR notation (`10.0.0.0/8`, `fd00::/8`, or one address), the
//! value type of `gateway.trusted_proxies`.

use std::fmt;
use std::net::IpAddr;

use super::table::Setting;

/// An IPv4 or IPv6 network: an address and a prefix length. Host bits are refused,
/// as a typo in them usually means a wrong prefix.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside this network. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    /// how a dual-stack socket reports an IPv4 peer) counts as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(ip)), 32, self.prefix) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => masked(u128::from(ip), 128, self.prefix) == u128::from(net),
            _ => false,
        }
    }
}

/// `bits` (an address `width` bits wide) with everything after `prefix` cleared.
fn masked(bits: u128, width: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        bits & (u128::MAX << (width - prefix)) & (u128::MAX >> (128 - width))
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?} is not an IP network such as 10.0.0.0/8"))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0..={width}"))?,
        };
        let bits = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        if masked(bits, width, prefix) != bits {
            return Err(format!("{s:?} has host bits set after /{prefix}"));
        }
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A comma-separated list (a TOML array is flattened to one); empty is no network.
impl Setting for Vec<Cidr> {
    fn parse(v: &str) -> Result<Self, String> {
        v.split(',').filter(|s| !s.trim().is_empty()).map(str::parse).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let net: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains(ip("10.1.255.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")), "an IPv4-mapped peer is its IPv4 address");
        assert!(!net.contains(ip("fd00::1")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.1")) && !all.contains(ip("::1")));
        assert_eq!(format!("{v6}, {one}"), "fd00::/8, 192.0.2.7/32");
    }

    #[test]
    fn bad_networks_are_refused_with_the_reason() {
        for (bad, why) in [
            ("10.0.0.1/8", "host bits"),
            ("10.0.0.0/33", "0..=32"),
            ("fd00::/129", "0..=128"),
            ("10.0.0.0/x", "prefix length"),
            ("ingress", "not an IP network"),
            ("10.0.0/8", "not an IP network"),
        ] {
            let err = bad.parse::<Cidr>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_list_may_be_empty() {
        assert!(<Vec<Cidr>>::parse("").unwrap().is_empty());
        let list = <Vec<Cidr>>::parse("10.0.0.0/8, fd00::/8").unwrap();
        assert_eq!(list.len(), 2);
        assert!(<Vec<Cidr>>::parse("10.0.0.0/8,nonsense").is_err());
    }
}
