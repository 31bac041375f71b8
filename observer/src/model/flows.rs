//! Decoded flow keys and counters: the kernel's `FlowKey`/`FlowValue`
//! turned into addresses, names and sums over CPUs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use observer_common::{Direction, FlowKey, FlowValue, Proto, Unclassified, family};

/// Identity of one counter row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId {
    /// Interface index the packet was seen on.
    pub ifindex: u32,
    /// rx or tx.
    pub direction: Direction,
    /// Encapsulation (`Other` for plain IP and unclassified frames).
    pub proto: Proto,
    /// Why the frame was not classified (`None` when it was).
    pub reason: Unclassified,
    /// Outer source (rx) or destination (tx); `None` for aggregates.
    pub peer: Option<IpAddr>,
    /// VNI (VXLAN, VXLAN-GPE, Geneve), else 0.
    pub vni: u32,
}

impl FlowId {
    /// Decodes a kernel key. Unknown enum bytes decode to safe defaults
    /// rather than failing: the map is the kernel's, not ours to trust blindly.
    pub fn from_key(key: &FlowKey) -> FlowId {
        FlowId {
            ifindex: key.ifindex,
            direction: if key.direction == Direction::Tx as u8 {
                Direction::Tx
            } else {
                Direction::Rx
            },
            proto: Proto::from_u8(key.proto),
            reason: Unclassified::from_u8(key.reason),
            peer: decode_addr(&key.peer, key.peer_family),
            vni: key.vni,
        }
    }
}

/// Counters of one row, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// Packets as on the wire.
    pub packets: u64,
    /// Bytes as on the wire (Ethernet header included).
    pub bytes: u64,
    /// One (inner source, inner destination) sample, when the encapsulation has one.
    pub inner: Option<(IpAddr, IpAddr)>,
}

impl FlowCounters {
    /// Sums per-CPU values; the inner sample is taken from any CPU that has one.
    pub fn sum<'a>(values: impl IntoIterator<Item = &'a FlowValue>) -> FlowCounters {
        let mut total = FlowCounters::default();
        for value in values {
            total.packets += value.packets;
            total.bytes += value.bytes;
            if total.inner.is_none()
                && let (Some(src), Some(dst)) = (
                    decode_addr(&value.inner_src, value.inner_family),
                    decode_addr(&value.inner_dst, value.inner_family),
                )
            {
                total.inner = Some((src, dst));
            }
        }
        total
    }
}

/// Turns the kernel's address words (network byte order in memory) into an address.
pub fn decode_addr(words: &[u32; 4], addr_family: u8) -> Option<IpAddr> {
    let mut bytes = [0u8; 16];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    match addr_family {
        family::V4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        family::V6 => Some(IpAddr::V6(Ipv6Addr::from(bytes))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(bytes: [u8; 16]) -> [u32; 4] {
        let mut w = [0u32; 4];
        for (i, chunk) in bytes.chunks_exact(4).enumerate() {
            w[i] = u32::from_ne_bytes(chunk.try_into().unwrap());
        }
        w
    }

    #[test]
    fn decodes_ipv4_and_ipv6_in_network_order() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&[10, 10, 60, 127]);
        assert_eq!(
            decode_addr(&words(b), family::V4),
            Some("10.10.60.127".parse().unwrap())
        );
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            decode_addr(&words(v6.octets()), family::V6),
            Some(IpAddr::V6(v6))
        );
        assert_eq!(decode_addr(&words(b), family::NONE), None);
    }

    #[test]
    fn sums_cpus_and_keeps_first_inner_sample() {
        let mut inner = [0u8; 16];
        inner[..4].copy_from_slice(&[10, 42, 0, 1]);
        let with_sample = FlowValue {
            packets: 2,
            bytes: 200,
            inner_src: words(inner),
            inner_dst: words(inner),
            inner_family: family::V4,
            _pad: [0; 7],
        };
        let without = FlowValue {
            packets: 3,
            bytes: 300,
            ..FlowValue::default()
        };
        let total = FlowCounters::sum([&without, &with_sample]);
        assert_eq!((total.packets, total.bytes), (5, 500));
        let ip: IpAddr = "10.42.0.1".parse().unwrap();
        assert_eq!(total.inner, Some((ip, ip)));
    }

    #[test]
    fn unknown_enum_bytes_decode_safely() {
        let key = FlowKey {
            peer: [0; 4],
            ifindex: 3,
            vni: 0,
            direction: 9,
            proto: 200,
            peer_family: 77,
            reason: 99,
        };
        let id = FlowId::from_key(&key);
        assert_eq!(id.direction, Direction::Rx);
        assert_eq!(id.proto, Proto::Other);
        assert_eq!(id.reason, Unclassified::Unsupported);
        assert_eq!(id.peer, None);
    }
}
