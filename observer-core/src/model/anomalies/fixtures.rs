//! What the module's tests share: the incident's cluster as this node
//! knows it, the thresholds, rows built on `model::rows::testing`, and a
//! driver that feeds the engine one read a second.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use observer_common::{ClassifierDrop, Direction, Proto, TcpCounts};

use super::{Engine, Event, Kind, Known, Thresholds};
use crate::model::{
    facts::{AllowSet, AllowSets, ExpectedPeer, SetSource},
    rows::{DropId, DropRow, FlowId, Origin, Row, Tally, testing},
};

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The row of `packets` since attach between this node and `peer`.
pub(super) fn flow(peer: &str, proto: Proto, direction: Direction, packets: u64) -> Row {
    testing::row(
        FlowId {
            proto,
            direction,
            ..testing::flow_id(peer)
        },
        packets,
    )
}

/// The tunnel row of `packets` since attach whose inner TCP said `tcp`.
pub(super) fn tcp_flow(peer: &str, direction: Direction, packets: u64, tcp: TcpCounts) -> Row {
    Row {
        tcp,
        ..flow(peer, Proto::Vxlan, direction, packets)
    }
}

/// A classifier drop row; `vni_or_mtu` is the MTU of a `path_mtu` row,
/// else its VNI.
pub(super) fn drop(
    peer: &str,
    proto: Proto,
    reason: ClassifierDrop,
    packets: u64,
    vni_or_mtu: u32,
) -> DropRow {
    let path_mtu = reason == ClassifierDrop::PathMtu;
    let id = DropId {
        proto,
        vni: if path_mtu { 0 } else { vni_or_mtu },
        mtu: path_mtu.then_some(vni_or_mtu),
        ..testing::drop_id(peer, Origin::Classifier, reason as u32)
    };
    testing::drop_row(id, packets, reason.name())
}

/// Two nodes, .127 by VXLAN and .209 by IPIP, both in both allow-sets;
/// this node is 10.10.10.62; the default ports.
pub(super) fn known() -> Known {
    let mut nodes = BTreeMap::new();
    nodes.insert(
        ip("10.10.60.127"),
        ExpectedPeer {
            blocks: vec!["10.42.168.192/26".parse().unwrap()],
            encaps: BTreeSet::from([Proto::Vxlan]),
            devices: vec!["vxlan.calico".into()],
            route_mtu: None,
        },
    );
    nodes.insert(
        ip("10.10.60.209"),
        ExpectedPeer {
            blocks: vec!["10.42.10.0/26".parse().unwrap()],
            encaps: BTreeSet::from([Proto::Ipip]),
            devices: vec!["tunl0".into()],
            route_mtu: None,
        },
    );
    let set = |prefixes: &[&str]| AllowSet {
        ipv4: true,
        ipv6: false,
        prefixes: prefixes.iter().map(|p| p.parse().unwrap()).collect(),
        sources: vec![SetSource::Ipset("cali40all-vxlan-net".into())],
    };
    Known {
        nodes,
        local: BTreeSet::from([ip("10.10.10.62")]),
        allow: Some(AllowSets {
            vxlan: set(&["10.10.60.127/32", "10.10.60.209/32"]),
            ipip: set(&["10.10.60.127/32", "10.10.60.209/32"]),
            ..AllowSets::default()
        }),
        ..Known::default()
    }
}

/// Spelled out rather than `Thresholds::default()`: the tests' numbers
/// depend on these, not on whatever the defaults become.
pub(super) fn th() -> Thresholds {
    Thresholds {
        window: Duration::from_secs(5),
        min_packets: 5,
        drop_spike_pps: 5.0,
        ..Thresholds::default()
    }
}

/// Runs reads at t = 1, 2, ... with rows from `read(t)`; returns all events.
pub(super) fn drive(
    engine: &mut Engine,
    known: &Known,
    seconds: u32,
    read: impl Fn(u32) -> (Vec<Row>, Vec<DropRow>),
) -> Vec<Event> {
    let mut events = Vec::new();
    // Each row's packets at the previous read: what moved since is its
    // interval's, as the aggregator says.
    let mut flows_before: HashMap<FlowId, Tally> = HashMap::new();
    let mut drops_before: HashMap<DropId, u64> = HashMap::new();
    for t in 1..=seconds {
        let (mut rows, mut drops) = read(t);
        for row in &mut rows {
            let now = Tally {
                packets: row.packets,
                bytes: 0,
                tcp: row.tcp,
            };
            let before = flows_before.insert(row.id, now).unwrap_or_default();
            let moved = now.since(&before).unwrap_or(now);
            row.interval_packets = moved.packets;
            row.interval_tcp = moved.tcp;
        }
        for drop in &mut drops {
            let before = drops_before
                .insert(drop.row.id, drop.row.packets)
                .unwrap_or(0);
            drop.row.interval_packets = drop.row.packets.saturating_sub(before);
        }
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(t as u64);
        events.extend(engine.observe(t as f64, wall, &rows, &drops, known));
    }
    events
}

/// The (kind, peer) of every raised event, in order.
pub(super) fn raised(events: &[Event]) -> Vec<(Kind, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Raised(a) => Some((a.kind, a.peer.to_string())),
            Event::Cleared { .. } => None,
        })
        .collect()
}
