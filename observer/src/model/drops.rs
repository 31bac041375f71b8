//! Drop rows: the kernel's `DropKey`/`DropValue` decoded into identities
//! with reason names (classifier reasons by our name, kernel reasons by the
//! running kernel's), and the one-line explanation an SRE acts on.

use std::{fmt, net::IpAddr};

use anyhow::{Context, Result};
use aya::maps::{MapData, PerCpuHashMap};
use observer_common::{ClassifierDrop, DROPS_MAP, DropKey, DropValue, Proto, drop_origin};

use crate::{bpf::Observer, model::flows::decode_addr};

/// Where a drop was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// Flagged by the ingress classifier; the packet itself passed the
    /// observer (the node's own rules drop it later).
    Classifier,
    /// Freed by the kernel with a drop reason.
    Kernel,
}

impl Origin {
    /// Name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Classifier => "classifier",
            Origin::Kernel => "kernel",
        }
    }
}

/// Identity of one drop row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DropId {
    /// Interface the packet arrived on.
    pub ifindex: u32,
    /// Outer protocol.
    pub proto: Proto,
    /// Outer source (`None` for the `other` aggregate).
    pub peer: Option<IpAddr>,
    /// VNI when the encapsulation has one.
    pub vni: u32,
    /// Classifier or kernel.
    pub origin: Origin,
    /// `ClassifierDrop` value or the kernel's drop reason value.
    pub reason: u32,
}

impl DropId {
    fn from_key(key: &DropKey) -> DropId {
        DropId {
            ifindex: key.ifindex,
            proto: Proto::from_u8(key.proto),
            peer: decode_addr(&key.peer, key.peer_family),
            vni: key.vni,
            origin: if key.origin == drop_origin::KERNEL {
                Origin::Kernel
            } else {
                Origin::Classifier
            },
            reason: key.reason,
        }
    }

    /// Reason name: ours for the classifier, the kernel's for the kernel.
    pub fn reason_name(&self, observer: &Observer) -> String {
        match self.origin {
            Origin::Classifier => classifier_reason(self.reason).map_or_else(
                || format!("classifier_{}", self.reason),
                |r| r.name().to_string(),
            ),
            Origin::Kernel => observer.drop_reason_name(self.reason),
        }
    }
}

/// Packets and bytes of a drop row, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Reads every drop row.
pub fn read(observer: &Observer) -> Result<Vec<(DropId, DropCounters)>> {
    let map: PerCpuHashMap<&MapData, DropKey, DropValue> = PerCpuHashMap::try_from(
        observer
            .ebpf()
            .map(DROPS_MAP)
            .context("DROPS map missing")?,
    )?;
    let mut rows = Vec::new();
    for item in map.iter() {
        match item {
            Ok((key, values)) => {
                let mut total = DropCounters::default();
                for value in values.iter() {
                    total.packets += value.packets;
                    total.bytes += value.bytes;
                }
                rows.push((DropId::from_key(&key), total));
            }
            // Evicted between listing and reading.
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(e) => return Err(e).context("reading the DROPS map"),
        }
    }
    Ok(rows)
}

fn classifier_reason(value: u32) -> Option<ClassifierDrop> {
    u16::try_from(value).ok().and_then(ClassifierDrop::from_u16)
}

/// What a classifier reason means, for the one-line message.
fn classifier_meaning(reason: ClassifierDrop, vni: u32, allow_sets: &str) -> String {
    match reason {
        ClassifierDrop::CalicoAllowSet => format!("source not in {allow_sets}"),
        ClassifierDrop::VxlanNoIFlag => "VXLAN header without the I flag".to_string(),
        ClassifierDrop::VniUnknown => "VNI configured on no local vxlan device".to_string(),
        ClassifierDrop::OuterFragment => "outer IP packet is a fragment".to_string(),
        ClassifierDrop::OverMtu => "outer IP packet larger than the interface MTU".to_string(),
        ClassifierDrop::PathMtu => {
            format!("too big for the path (a router reported next-hop MTU {vni})")
        }
    }
}

/// The sentence for a drop row, e.g. "579 VXLAN packets from 10.10.10.244
/// dropped: source not in cali40all-vxlan-net". `allow_sets` names the sets
/// of the row's protocol.
pub fn message(id: &DropId, packets: u64, reason: &str, allow_sets: &str) -> String {
    let what = match id.proto {
        Proto::Other => "non-tunnel".to_string(),
        proto => proto.name().to_uppercase(),
    };
    let path_mtu = id.origin == Origin::Classifier && id.reason == ClassifierDrop::PathMtu as u32;
    // A path_mtu row counts packets this node sent: its peer is the destination.
    let from = id.peer.map_or(String::new(), |p| {
        format!(" {} {p}", if path_mtu { "to" } else { "from" })
    });
    let plural = if packets == 1 { "packet" } else { "packets" };
    let verb = match id.origin {
        Origin::Classifier if path_mtu => "dropped on the path",
        Origin::Classifier if id.reason != ClassifierDrop::CalicoAllowSet as u32 => "flagged",
        _ => "dropped",
    };
    let why = match (id.origin, classifier_reason(id.reason)) {
        (Origin::Classifier, Some(r)) => classifier_meaning(r, id.vni, allow_sets),
        _ => format!("kernel drop reason {reason}"),
    };
    format!("{packets} {what} {plural}{from} {verb}: {why}")
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(origin: Origin, reason: u32) -> DropId {
        DropId {
            ifindex: 2,
            proto: Proto::Vxlan,
            peer: Some("10.10.10.244".parse().unwrap()),
            vni: 4096,
            origin,
            reason,
        }
    }

    #[test]
    fn the_incident_in_one_line() {
        let msg = message(
            &id(Origin::Classifier, ClassifierDrop::CalicoAllowSet as u32),
            579,
            "calico_allow_set",
            "cali40all-vxlan-net",
        );
        assert_eq!(
            msg,
            "579 VXLAN packets from 10.10.10.244 dropped: source not in cali40all-vxlan-net"
        );
    }

    #[test]
    fn kernel_reasons_use_the_kernel_name() {
        let msg = message(&id(Origin::Kernel, 12), 1, "NETFILTER_DROP", "");
        assert_eq!(
            msg,
            "1 VXLAN packet from 10.10.10.244 dropped: kernel drop reason NETFILTER_DROP"
        );
    }

    #[test]
    fn other_checks_are_flags_not_drops() {
        let msg = message(
            &id(Origin::Classifier, ClassifierDrop::VniUnknown as u32),
            3,
            "vni_unknown",
            "",
        );
        assert_eq!(
            msg,
            "3 VXLAN packets from 10.10.10.244 flagged: VNI configured on no local vxlan device"
        );
    }
}
