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
//! Calico sets). `observer/tests/differential.rs` runs random and mutated frames
//! through both and fails on any difference.

use std::{collections::HashMap, net::IpAddr};

use anyhow::{Result, anyhow};
use observer_common::{
    ClassifierDrop, Direction, DropKey, FlowKey, FlowValue, TcpCounts,
    checks::{self, CheckFacts},
    drop_origin,
    parse::{self, Classified, SliceFrame},
};

use observer_core::capture::Frame;

use crate::{
    cmd::replay::classify::{self, CaptureRows, Classifier, FileRows, FrameOutcome, Runts},
    model::{
        facts::{AllowLookup, AllowSets, SetKind},
        ports::{PortArray, PortConfig},
        rows::{self, DropCounters, DropId, FlowCounters, FlowId, KernelReasons, KernelStats},
    },
    monitor::refresher::AllowSetSink,
};

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
pub struct NativeClassifier {
    ports: PortArray,
    facts: ReplayFacts,
    local: Vec<IpAddr>,
    /// Flow and drop counters since the start (interface index 0), like
    /// the programs' maps: per-capture rows come from them as from the
    /// maps (`CaptureRows`), so both engines make rows alike.
    flows: HashMap<FlowKey, FlowValue>,
    drops: HashMap<DropKey, DropCounters>,
    rows: CaptureRows,
    /// Replayed frames earn classifier reasons only: no names needed.
    no_kernel_reasons: KernelReasons,
}

impl NativeClassifier {
    /// A classifier with the UDP ports of `ports`; frames whose outer
    /// source is in `local` count as sent.
    pub fn new(ports: &PortConfig, local: Vec<IpAddr>) -> Result<NativeClassifier> {
        Ok(NativeClassifier {
            ports: PortArray::new(ports).map_err(|e| anyhow!(e))?,
            facts: ReplayFacts::default(),
            local,
            flows: HashMap::new(),
            drops: HashMap::new(),
            rows: CaptureRows::default(),
            no_kernel_reasons: KernelReasons::default(),
        })
    }
}

/// Adds one packet of `bytes` to the drop row of `c` and `reason`.
fn flag(
    drops: &mut HashMap<DropKey, DropCounters>,
    c: &Classified,
    reason: ClassifierDrop,
    bytes: u64,
) {
    let counts = drops
        .entry(DropKey::of(0, c, drop_origin::CLASSIFIER, reason as u32))
        .or_default();
    counts.packets += 1;
    counts.bytes += bytes;
}

impl AllowSetSink for NativeClassifier {
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()> {
        self.facts = ReplayFacts {
            vxlan: snapshot.vxlan.lookup(),
            ipip: snapshot.ipip.lookup(),
        };
        Ok(())
    }
}

impl Classifier for NativeClassifier {
    fn name(&self) -> &'static str {
        "native"
    }

    fn run(&mut self, frame: &Frame) -> Result<FrameOutcome> {
        let tx = classify::sent_by(&frame.data, &self.local);
        let direction = if tx { Direction::Tx } else { Direction::Rx };
        let bytes = frame.data.len() as u64;
        let f = SliceFrame(&frame.data);
        let c = parse::classify(&f, direction, &self.ports);
        // Probe packets are counted apart by the programs (`count::record`),
        // never in a flow row: the same here.
        if !c.probe {
            // A capture has no interface MTU: SYNs' MSS is not judged.
            let tcp = TcpCounts::of(&parse::inner_tcp(&f, &c), 0);
            self.flows
                .entry(FlowKey::of(0, direction, &c))
                .and_modify(|value| value.add(&c, 1, bytes, &tcp))
                .or_insert_with(|| FlowValue::first(&c, 1, bytes, &tcp));
        }
        if !tx && parse::needs_checks(&c) {
            let drops = &mut self.drops;
            checks::classifier_drops(&c, bytes, &mut self.facts, |reason| {
                flag(drops, &c, reason, bytes)
            });
            checks::checksum_drops(&f, &c, |reason| flag(drops, &c, reason, bytes));
            if let Some(quoted) = parse::too_big(&f, &c, &self.ports) {
                flag(drops, &quoted, ClassifierDrop::PathMtu, bytes);
            }
        }
        Ok(FrameOutcome {
            tx,
            cut: false,
            refused: false,
        })
    }

    fn finish_file(&mut self, index: u32, seconds: f64, runts: Runts) -> Result<FileRows> {
        let flows: Vec<(FlowId, FlowCounters)> = self
            .flows
            .iter()
            .map(|(key, value)| (FlowId::from_key(key), FlowCounters::sum([value])))
            .collect();
        let drops: Vec<(DropId, DropCounters)> = self
            .drops
            .iter()
            .map(|(key, counters)| (DropId::from_key(key), *counters))
            .collect();
        self.rows.update(&flows, &drops);
        Ok(self.rows.finish(index, seconds, runts))
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
