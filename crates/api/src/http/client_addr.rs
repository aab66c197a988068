//! The caller's address behind load balancers (`FITORDER_TRUSTED_PROXIES`).
//!
//! The TCP peer is the caller unless it is one of our own proxies. A trusted proxy reports the
//! chain it saw in `X-Forwarded-For` (each hop appends the address it received the request
//! from), so the caller is the right-most entry that is not itself a trusted proxy: anything to
//! the left of it was written by the client and proves nothing.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;

/// The caller's IP: the peer's unless the peer is a trusted proxy; then the right-most
/// `X-Forwarded-For` entry that is not itself trusted. None when the peer is trusted but no
/// usable header says who sent the request.
pub fn client_addr(peer: SocketAddr, headers: &HeaderMap, trusted: &[ipnet::IpNet]) -> Option<IpAddr> {
    let peer_ip = canonical(peer.ip());
    if !is_trusted(peer_ip, trusted) {
        return Some(peer_ip);
    }
    // Several X-Forwarded-For headers are one list, in order.
    let mut hops: Vec<&str> = vec![];
    for value in headers.get_all("x-forwarded-for") {
        let Ok(text) = value.to_str() else { return None };
        hops.extend(text.split(','));
    }
    for hop in hops.iter().rev() {
        let ip = parse_hop(hop)?;
        if !is_trusted(ip, trusted) {
            return Some(ip);
        }
    }
    None
}

/// Whether the peer is one of our trusted proxies (so what it reports is the caller's address,
/// as `client_addr` reads it): the WeChat H5 payer's address is taken only from one.
pub fn from_trusted_proxy(peer: SocketAddr, trusted: &[ipnet::IpNet]) -> bool {
    is_trusted(canonical(peer.ip()), trusted)
}

fn is_trusted(ip: IpAddr, trusted: &[ipnet::IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// An IPv4 address in IPv6 clothing (`::ffff:10.0.0.1`, as a dual-stack socket reports it) is
/// the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` entry: an address, maybe with a port (`1.2.3.4:5678`, `[::1]:80`).
/// Anything else (`unknown`, an obfuscated name, junk) makes the header unusable.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    hop.parse::<SocketAddr>().ok().map(|s| canonical(s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn nets(s: &str) -> Vec<ipnet::IpNet> {
        crate::config::parse_trusted_proxies(s).unwrap()
    }

    fn peer(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 40000)
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_untrusted_peer_is_the_caller_whatever_it_claims() {
        let t = nets("10.0.0.0/8");
        assert_eq!(
            client_addr(peer("203.0.113.9"), &xff(&["1.1.1.1"]), &t),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_addr(peer("203.0.113.9"), &HeaderMap::new(), &[]),
            ip("203.0.113.9")
        );
        // Without trusted proxies nobody's header is believed.
        assert_eq!(client_addr(peer("10.0.0.2"), &xff(&["1.1.1.1"]), &[]), ip("10.0.0.2"));
    }

    #[test]
    fn behind_trusted_proxies_the_right_most_untrusted_hop_is_the_caller() {
        let t = nets("10.0.0.0/8, 192.168.1.7");
        // The client wrote 6.6.6.6 itself; our balancer appended what it saw.
        let h = xff(&["6.6.6.6, 198.51.100.4, 10.1.2.3"]);
        assert_eq!(client_addr(peer("192.168.1.7"), &h, &t), ip("198.51.100.4"));
        // Several headers are one list.
        let h = xff(&["6.6.6.6", "198.51.100.4", "10.1.2.3"]);
        assert_eq!(client_addr(peer("10.0.0.1"), &h, &t), ip("198.51.100.4"));
        // Ports and IPv6 are understood.
        let h = xff(&["[2001:db8::1]:443, 10.9.9.9:80"]);
        assert_eq!(client_addr(peer("10.0.0.1"), &h, &t), ip("2001:db8::1"));
        // A v4-mapped peer is its IPv4 address.
        assert_eq!(
            client_addr(peer("::ffff:10.0.0.1"), &xff(&["198.51.100.4"]), &t),
            ip("198.51.100.4")
        );
    }

    #[test]
    fn a_trusted_peer_without_a_usable_header_gives_no_address() {
        let t = nets("10.0.0.0/8");
        assert_eq!(client_addr(peer("10.0.0.1"), &HeaderMap::new(), &t), None);
        assert_eq!(client_addr(peer("10.0.0.1"), &xff(&["10.0.0.5, 10.0.0.6"]), &t), None);
        assert_eq!(
            client_addr(peer("10.0.0.1"), &xff(&["198.51.100.4, unknown"]), &t),
            None
        );
        assert_eq!(client_addr(peer("10.0.0.1"), &xff(&[""]), &t), None);
        // Junk left of the caller does not matter: the caller is found first.
        assert_eq!(
            client_addr(peer("10.0.0.1"), &xff(&["junk, 198.51.100.4"]), &t),
            ip("198.51.100.4")
        );
    }
}
