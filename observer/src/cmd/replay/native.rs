//! Classifies captured frames in this process, with the programs' own
//! parser and checks (`observer_common::parse` and `::checks`, compiled
//! natively): no test-run system call per frame, no privileges, and no
//! test-run length limit, so every frame counts all its captured bytes.
//!
//! It does what the programs do to a replayed frame: a received frame is
//! classified as XDP does (rx, then the classifier checks and `path_mtu`),
//! a frame from a `--local` address as tc egress does (tx, no checks).
//! What a test run gives the programs is mirrored too: no interface MTU
//! and no local VNIs (they belong to the node that captured), and the
//! allow-sets replay reads (`--allow-cidr`, `--allow-set` and this node's
//! Calico sets). `tests/differential.rs` runs random and mutated frames
//! through both and fails on any difference.

use std::{collections::HashMap, hash::Hash, net::IpAddr};

use anyhow::{Result, anyhow};
use observer_common::{
    ClassifierDrop, Direction, DropKey, FlowKey, FlowValue,
    checks::{self, CheckFacts},
    drop_origin,
    parse::{self, Classified, PortTable, SliceFrame},
};

use crate::{
    cmd::checks::AllowSetSink,
    cmd::replay::{
        capture::{self, Frame},
        classify::{self, ETH_HLEN, Engine, FileRows, FrameOutcome},
    },
    model::{
        facts::{AllowLookup, AllowSets, SetKind},
        ports::PortConfig,
        rows::{self, DropId, FlowCounters, FlowId, KernelReasons, KernelStats, Row},
    },
};

/// The port table as an array indexed by port, like the `UDP_PORTS` map.
struct Ports(Box<[u8; 65536]>);

impl PortTable for Ports {
    #[inline]
    fn tag(&self, port: u16) -> u8 {
        self.0[usize::from(port)]
    }
}

/// The checks' node facts for a replay: the allow-sets only.
#[derive(Default)]
struct ReplayFacts {
    vxlan: AllowLookup,
    ipip: AllowLookup,
}

impl CheckFacts for ReplayFacts {
    fn outside_allow_set(&mut self, c: &Classified) -> bool {
        let set = match SetKind::guarding(c.proto) {
            Some(SetKind::Vxlan) => &self.vxlan,
            Some(SetKind::Ipip) => &self.ipip,
            None => return false,
        };
        rows::decode_addr(&c.peer, c.peer_family).is_some_and(|a| set.refuses(a))
    }

    fn vni_unknown(&self, _vni: u32) -> bool {
        false
    }

    fn iface_mtu(&self) -> Option<u32> {
        None
    }
}

/// Replays frames with the native classifier.
pub struct NativeEngine {
    ports: Ports,
    facts: ReplayFacts,
    local: Vec<IpAddr>,
    /// Flow counters since the start (interface index 0; rows are
    /// relabelled per capture). Kept across captures like the programs'
    /// map, so a row's inner sample is the latest of the whole replay in
    /// both engines.
    flows: HashMap<FlowKey, FlowValue>,
    /// Packets and bytes of each key at the end of the previous capture.
    reported: HashMap<FlowKey, (u64, u64)>,
    /// The current capture's drop counters.
    drops: HashMap<DropKey, (u64, u64)>,
    /// Replayed frames earn classifier reasons only: no names needed.
    no_kernel_reasons: KernelReasons,
}

impl NativeEngine {
    /// A classifier with the UDP ports of `ports`; frames whose outer
    /// source is in `local` count as sent.
    pub fn new(ports: &PortConfig, local: Vec<IpAddr>) -> Result<NativeEngine> {
        let mut table = Box::new([0u8; 65536]);
        for (port, tag) in ports.entries().map_err(|e| anyhow!(e))? {
            table[usize::from(port)] = tag;
        }
        Ok(NativeEngine {
            ports: Ports(table),
            facts: ReplayFacts::default(),
            local,
            flows: HashMap::new(),
            reported: HashMap::new(),
            drops: HashMap::new(),
            no_kernel_reasons: KernelReasons::default(),
        })
    }
}

/// Adds one packet of `bytes` to the drop row of `c` and `reason`.
fn flag(
    drops: &mut HashMap<DropKey, (u64, u64)>,
    c: &Classified,
    reason: ClassifierDrop,
    bytes: u64,
) {
    let counts = drops
        .entry(DropKey::of(0, c, drop_origin::CLASSIFIER, reason as u32))
        .or_default();
    counts.0 += 1;
    counts.1 += bytes;
}

impl AllowSetSink for NativeEngine {
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()> {
        self.facts = ReplayFacts {
            vxlan: snapshot.vxlan.lookup(),
            ipip: snapshot.ipip.lookup(),
        };
        Ok(())
    }
}

impl Engine for NativeEngine {
    fn name(&self) -> &'static str {
        "native"
    }

    fn run(&mut self, frame: &Frame) -> Result<Option<FrameOutcome>> {
        if frame.data.len() < ETH_HLEN {
            return Ok(None);
        }
        let tx = capture::outer_source(&frame.data).is_some_and(|src| self.local.contains(&src));
        let direction = if tx { Direction::Tx } else { Direction::Rx };
        let bytes = frame.data.len() as u64;
        let f = SliceFrame(&frame.data);
        let c = parse::classify(&f, direction, &self.ports);
        let key = FlowKey::of(0, direction, &c);
        match self.flows.get_mut(&key) {
            Some(value) => value.add(&c, 1, bytes),
            None => {
                self.flows.insert(key, FlowValue::first(&c, 1, bytes));
            }
        }
        if !tx && parse::needs_checks(&c) {
            let drops = &mut self.drops;
            checks::classifier_drops(&c, bytes, &mut self.facts, |reason| {
                flag(drops, &c, reason, bytes)
            });
            if let Some(quoted) = parse::too_big(&f, &c, &self.ports) {
                flag(drops, &quoted, ClassifierDrop::PathMtu, bytes);
            }
        }
        Ok(Some(FrameOutcome {
            tx,
            cut: false,
            refused: false,
        }))
    }

    fn finish_file(&mut self, index: u32, seconds: f64, runts: u64) -> Result<FileRows> {
        let reported = &mut self.reported;
        let flows = self.flows.iter().filter_map(|(key, value)| {
            let (packets, bytes) = reported
                .insert(*key, (value.packets, value.bytes))
                .unwrap_or((0, 0));
            (value.packets > packets).then(|| {
                let inner = FlowCounters::sum([value]).inner;
                (*key, value.packets - packets, value.bytes - bytes, inner)
            })
        });
        let mut rows = rows_of(
            flows,
            |key| FlowId {
                ifindex: index,
                ..FlowId::from_key(key)
            },
            seconds,
        );
        classify::add_runts(&mut rows, index, seconds, runts);
        let drops = self
            .drops
            .drain()
            .map(|(key, (packets, bytes))| (key, packets, bytes, None));
        let drops = rows_of(
            drops,
            |key| DropId {
                ifindex: index,
                ..DropId::from_key(key)
            },
            seconds,
        );
        Ok(FileRows { rows, drops })
    }

    fn stats(&self) -> Result<KernelStats> {
        Ok(KernelStats {
            flow_entries: self.flows.len() as u64,
            flow_inserts: self.flows.len() as u64,
            ..KernelStats::default()
        })
    }

    fn kernel_reasons(&self) -> &KernelReasons {
        &self.no_kernel_reasons
    }
}

/// Rows of one capture from its keys' counters (packets, bytes, inner
/// sample), merged by row identity (`decode`) as the aggregator does.
fn rows_of<K, Id: Copy + Hash + Eq>(
    counters: impl Iterator<Item = (K, u64, u64, Option<(IpAddr, IpAddr)>)>,
    decode: impl Fn(&K) -> Id,
    seconds: f64,
) -> Vec<Row<Id>> {
    let mut rows: HashMap<Id, Row<Id>> = HashMap::new();
    for (key, packets, bytes, inner) in counters {
        let id = decode(&key);
        let row = rows.entry(id).or_insert_with(|| Row {
            id,
            packets: 0,
            bytes: 0,
            pps: 0.0,
            bps: 0.0,
            inner: None,
            changed: true,
        });
        row.packets += packets;
        row.bytes += bytes;
        row.inner = inner.or(row.inner);
    }
    rows.into_values()
        .map(|mut row| {
            row.pps = classify::rate(row.packets, seconds);
            row.bps = classify::rate(row.bytes * 8, seconds);
            row
        })
        .collect()
}
