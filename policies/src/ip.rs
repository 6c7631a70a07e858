//! Classification of IP addresses for SSRF protection (CONTRACT section 4,
//! "Beyond vLLM").
//!
//! [`classify_ip`] says whether an address is publicly routable and, if not,
//! why. Addresses that embed an IPv4 address are judged by the embedded
//! address: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64
//! `64:ff9b::a.b.c.d` and 6to4 `2002:aabb:ccdd::/48`. The tables follow the
//! IANA special-purpose address registries; anything in IPv6 outside global
//! unicast `2000::/3` is treated as reserved.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is (or is not) a public one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpClass {
    /// Globally routable: fetching from it is allowed.
    Public,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `169.254.0.0/16` (incl. the cloud metadata address 169.254.169.254), `fe80::/10`.
    LinkLocal,
    /// Carrier-grade NAT shared space `100.64.0.0/10`.
    SharedCgnat,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `0.0.0.0`, `::`.
    Unspecified,
    /// `255.255.255.255`.
    Broadcast,
    /// `198.18.0.0/15`.
    Benchmarking,
    /// `0.0.0.0/8` ("this network").
    ThisNetwork,
    /// `192.0.0.0/24`, `2001::/23`: IETF protocol assignments.
    ProtocolAssignment,
    /// `fc00::/7`.
    UniqueLocal,
    /// `fec0::/10` (deprecated site-local).
    SiteLocal,
    /// `100::/64`.
    DiscardOnly,
    /// `240.0.0.0/4`, `192.88.99.0/24` and IPv6 outside the ranges above.
    Reserved,
}

impl IpClass {
    /// True for [`IpClass::Public`].
    pub fn is_public(self) -> bool {
        self == IpClass::Public
    }

    /// The class in words, as used in error messages ("loopback").
    pub fn description(self) -> &'static str {
        match self {
            IpClass::Public => "public",
            IpClass::Loopback => "loopback",
            IpClass::Private => "private",
            IpClass::LinkLocal => "link-local",
            IpClass::SharedCgnat => "shared (carrier-grade NAT)",
            IpClass::Multicast => "multicast",
            IpClass::Documentation => "documentation",
            IpClass::Unspecified => "unspecified",
            IpClass::Broadcast => "broadcast",
            IpClass::Benchmarking => "benchmarking",
            IpClass::ThisNetwork => "\"this network\"",
            IpClass::ProtocolAssignment => "IETF protocol assignment",
            IpClass::UniqueLocal => "unique-local",
            IpClass::SiteLocal => "site-local",
            IpClass::DiscardOnly => "discard-only",
            IpClass::Reserved => "reserved",
        }
    }

    /// "a" or "an", to go before [`IpClass::description`].
    pub fn article(self) -> &'static str {
        match self {
            IpClass::Unspecified | IpClass::ProtocolAssignment => "an",
            _ => "a",
        }
    }
}

impl fmt::Display for IpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// Classifies an address (see the module docs).
pub fn classify_ip(ip: IpAddr) -> IpClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: u32, net: [u8; 4], prefix: u32) -> bool {
    let net = u32::from_be_bytes(net);
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    ip & mask == net & mask
}

fn classify_v4(ip: Ipv4Addr) -> IpClass {
    let n = u32::from(ip);
    // Order matters where ranges nest: the specific ones first.
    let table: &[([u8; 4], u32, IpClass)] = &[
        ([0, 0, 0, 0], 32, IpClass::Unspecified),
        ([255, 255, 255, 255], 32, IpClass::Broadcast),
        ([0, 0, 0, 0], 8, IpClass::ThisNetwork),
        ([10, 0, 0, 0], 8, IpClass::Private),
        ([100, 64, 0, 0], 10, IpClass::SharedCgnat),
        ([127, 0, 0, 0], 8, IpClass::Loopback),
        ([169, 254, 0, 0], 16, IpClass::LinkLocal),
        ([172, 16, 0, 0], 12, IpClass::Private),
        ([192, 0, 0, 0], 24, IpClass::ProtocolAssignment),
        ([192, 0, 2, 0], 24, IpClass::Documentation),
        ([192, 88, 99, 0], 24, IpClass::Reserved),
        ([192, 168, 0, 0], 16, IpClass::Private),
        ([198, 18, 0, 0], 15, IpClass::Benchmarking),
        ([198, 51, 100, 0], 24, IpClass::Documentation),
        ([203, 0, 113, 0], 24, IpClass::Documentation),
        ([224, 0, 0, 0], 4, IpClass::Multicast),
        ([240, 0, 0, 0], 4, IpClass::Reserved),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v4(n, *net, *prefix))
        .map_or(IpClass::Public, |(_, _, class)| *class)
}

fn in_v6(ip: u128, net: u128, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    ip & mask == net & mask
}

/// The IPv4 address in the low 32 bits.
fn low_v4(n: u128) -> Ipv4Addr {
    // Truncation to the low 32 bits is the point.
    Ipv4Addr::from((n & 0xffff_ffff) as u32)
}

fn classify_v6(ip: Ipv6Addr) -> IpClass {
    let n = u128::from(ip);
    if n == 0 {
        return IpClass::Unspecified;
    }
    if n == 1 {
        return IpClass::Loopback;
    }
    // IPv4-mapped ::ffff:0:0/96 and IPv4-compatible ::/96: the embedded address.
    if in_v6(n, 0xffff_0000_0000, 96) || in_v6(n, 0, 96) {
        return classify_v4(low_v4(n));
    }
    // NAT64 well-known prefix 64:ff9b::/96.
    if in_v6(n, 0x0064_ff9b_u128 << 96, 96) {
        return classify_v4(low_v4(n));
    }
    // 6to4 2002::/16 embeds the IPv4 address in bits 16..48.
    if in_v6(n, 0x2002_u128 << 112, 16) {
        return classify_v4(low_v4(n >> 80));
    }
    let table: &[(u128, u32, IpClass)] = &[
        (0x0064_ff9b_0001_u128 << 80, 48, IpClass::Private), // local-use NAT64
        (0x0100_u128 << 112, 64, IpClass::DiscardOnly),
        (0x2001_0db8_u128 << 96, 32, IpClass::Documentation),
        (0x3fff_u128 << 112, 20, IpClass::Documentation),
        (0x2001_u128 << 112, 23, IpClass::ProtocolAssignment),
        (0xfc00_u128 << 112, 7, IpClass::UniqueLocal),
        (0xfe80_u128 << 112, 10, IpClass::LinkLocal),
        (0xfec0_u128 << 112, 10, IpClass::SiteLocal),
        (0xff00_u128 << 112, 8, IpClass::Multicast),
    ];
    if let Some((_, _, class)) = table
        .iter()
        .find(|(net, prefix, _)| in_v6(n, *net, *prefix))
    {
        return *class;
    }
    if in_v6(n, 0x2000_u128 << 112, 3) {
        IpClass::Public
    } else {
        IpClass::Reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> IpClass {
        classify_ip(s.parse().expect("address"))
    }

    #[test]
    fn ipv4_classes() {
        let cases = [
            ("8.8.8.8", IpClass::Public),
            ("1.1.1.1", IpClass::Public),
            ("93.184.216.34", IpClass::Public),
            ("127.0.0.1", IpClass::Loopback),
            ("127.255.255.254", IpClass::Loopback),
            ("10.0.0.1", IpClass::Private),
            ("10.255.255.255", IpClass::Private),
            ("172.16.0.1", IpClass::Private),
            ("172.31.255.255", IpClass::Private),
            ("172.15.255.255", IpClass::Public),
            ("172.32.0.0", IpClass::Public),
            ("192.168.1.1", IpClass::Private),
            ("169.254.169.254", IpClass::LinkLocal),
            ("169.254.0.1", IpClass::LinkLocal),
            ("100.64.0.1", IpClass::SharedCgnat),
            ("100.127.255.255", IpClass::SharedCgnat),
            ("100.128.0.0", IpClass::Public),
            ("224.0.0.1", IpClass::Multicast),
            ("239.255.255.255", IpClass::Multicast),
            ("192.0.2.10", IpClass::Documentation),
            ("198.51.100.7", IpClass::Documentation),
            ("203.0.113.200", IpClass::Documentation),
            ("0.0.0.0", IpClass::Unspecified),
            ("0.1.2.3", IpClass::ThisNetwork),
            ("255.255.255.255", IpClass::Broadcast),
            ("198.18.0.1", IpClass::Benchmarking),
            ("198.19.255.255", IpClass::Benchmarking),
            ("198.20.0.0", IpClass::Public),
            ("240.0.0.1", IpClass::Reserved),
            ("255.255.255.254", IpClass::Reserved),
            ("192.0.0.8", IpClass::ProtocolAssignment),
            ("192.88.99.1", IpClass::Reserved),
        ];
        for (addr, expected) in cases {
            assert_eq!(class(addr), expected, "{addr}");
        }
    }

    #[test]
    fn ipv6_classes() {
        let cases = [
            ("2606:4700:4700::1111", IpClass::Public),
            ("2a00:1450:4001:80b::200e", IpClass::Public),
            ("::1", IpClass::Loopback),
            ("::", IpClass::Unspecified),
            ("fe80::1", IpClass::LinkLocal),
            ("febf::1", IpClass::LinkLocal),
            ("fec0::1", IpClass::SiteLocal),
            ("fc00::1", IpClass::UniqueLocal),
            ("fd12:3456::1", IpClass::UniqueLocal),
            ("ff02::1", IpClass::Multicast),
            ("2001:db8::1", IpClass::Documentation),
            ("3fff::1", IpClass::Documentation),
            ("100::1", IpClass::DiscardOnly),
            ("2001::1", IpClass::ProtocolAssignment),
            ("64:ff9b:1::1", IpClass::Private),
            ("4000::1", IpClass::Reserved),
            ("1::1", IpClass::Reserved),
        ];
        for (addr, expected) in cases {
            assert_eq!(class(addr), expected, "{addr}");
        }
    }

    #[test]
    fn embedded_ipv4_is_judged_by_the_ipv4_address() {
        let cases = [
            ("::ffff:127.0.0.1", IpClass::Loopback),
            ("::ffff:10.1.2.3", IpClass::Private),
            ("::ffff:169.254.169.254", IpClass::LinkLocal),
            ("::ffff:8.8.8.8", IpClass::Public),
            ("::127.0.0.1", IpClass::Loopback),
            ("::192.168.0.1", IpClass::Private),
            ("64:ff9b::127.0.0.1", IpClass::Loopback),
            ("64:ff9b::a9fe:a9fe", IpClass::LinkLocal),
            ("64:ff9b::8.8.8.8", IpClass::Public),
            ("2002:7f00:1::", IpClass::Loopback),
            ("2002:c0a8:0101::1", IpClass::Private),
            ("2002:0808:0808::1", IpClass::Public),
        ];
        for (addr, expected) in cases {
            assert_eq!(class(addr), expected, "{addr}");
        }
    }

    #[test]
    fn words() {
        assert_eq!(IpClass::Loopback.description(), "loopback");
        assert_eq!(IpClass::Loopback.article(), "a");
        assert_eq!(IpClass::Unspecified.article(), "an");
        assert!(IpClass::Public.is_public());
        assert!(!IpClass::Private.is_public());
        assert_eq!(IpClass::LinkLocal.to_string(), "link-local");
    }
}
