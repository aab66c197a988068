//! The caller's address: the peer's IP, unless the peer is one of the trusted proxies
//! (`FITORDER_TRUSTED_PROXIES`); then the right-most `X-Forwarded-For` entry that is not itself
//! a trusted proxy (entries left of it could be written by anyone).

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

/// The client's IP as far as it can be believed; `None` when the peer is a trusted proxy that
/// sent no usable `X-Forwarded-For`.
pub fn client_addr(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer_ip = canonical(peer.ip());
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer_ip) {
        return Some(peer_ip);
    }
    let mut hops: Vec<IpAddr> = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let Ok(text) = value.to_str() else { return None };
        for entry in text.split(',') {
            match parse_hop(entry.trim()) {
                Some(ip) => hops.push(ip),
                // A malformed entry: nothing left of it can be told apart from a forgery.
                None => hops.clear(),
            }
        }
    }
    hops.into_iter().rev().find(|ip| !is_trusted(ip))
}

/// An entry as proxies write them: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_hop(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    s.parse::<SocketAddr>().ok().map(|a| canonical(a.ip()))
}

/// An IPv4 address seen through an IPv6 socket (`::ffff:1.2.3.4`) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_peer_unless_it_is_a_trusted_proxy() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: SocketAddr = "203.0.113.7:5000".parse().unwrap();
        assert_eq!(
            client_addr(peer, &headers(&["1.1.1.1"]), &trusted),
            Some("203.0.113.7".parse().unwrap())
        );
        let lb: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert_eq!(
            client_addr(lb, &headers(&["6.6.6.6, 198.51.100.2, 10.9.9.9"]), &trusted),
            Some("198.51.100.2".parse().unwrap())
        );
        assert_eq!(
            client_addr(lb, &headers(&["6.6.6.6", "[2001:db8::1]:443"]), &trusted),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(client_addr(lb, &headers(&[]), &trusted), None);
        assert_eq!(client_addr(lb, &headers(&["10.2.2.2"]), &trusted), None);
        assert_eq!(client_addr(lb, &headers(&["6.6.6.6, garbage"]), &trusted), None);
        let mapped: SocketAddr = "[::ffff:203.0.113.9]:1".parse().unwrap();
        assert_eq!(
            client_addr(mapped, &headers(&[]), &trusted),
            Some("203.0.113.9".parse().unwrap())
        );
    }
}
