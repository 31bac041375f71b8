//! Drop accounting shared by the ingress hooks (classifier reasons) and the
//! kfree_skb hook (kernel reasons).

use aya_ebpf::maps::lpm_trie::Key;
use observer_common::{
    ClassifierDrop, DropKey, DropValue, FlowCacheSlot, KeyFacts, Proto, TcpCounts,
    checks::{self, CheckFacts, FlowFacts},
    config, drop_origin, family,
};

use crate::{
    evidence,
    maps::{
        DROPS, IFACE_MTU, IPIP_ALLOW4, IPIP_ALLOW6, LOCAL_VNIS, MapPorts, VXLAN_ALLOW4,
        VXLAN_ALLOW6, config_on, config_word,
    },
    parse::{Classified, CommonVxlan, clobbered},
};

/// Adds one packet flagged with classifier `reason` to the drop counters
/// of (ifindex, peer, reason), and to the evidence the hook with evidence
/// slot `evidence` gathers for it.
#[inline(always)]
fn record(evidence: u32, ifindex: u32, c: &Classified, reason: ClassifierDrop, bytes: u64) {
    let key = DropKey::of(ifindex, c, drop_origin::CLASSIFIER, reason as u32);
    evidence::flag(evidence, &key, reason as u32, bytes);
    record_key(key, bytes);
}

/// Adds one packet of `bytes` to the drop counters of `key`.
#[inline(always)]
pub fn record_key(key: DropKey, bytes: u64) {
    if let Some(value) = DROPS.get_ptr_mut(key) {
        // SAFETY: per-CPU value of this CPU.
        unsafe {
            (*value).packets += 1;
            (*value).bytes += bytes;
        }
        return;
    }
    let value = DropValue { packets: 1, bytes };
    // A lost race with another CPU loses this one count; drops are rare
    // and the flow counters stay exact.
    let _ = DROPS.insert(key, value, 0);
}

/// Flags received tunnel packets the node is likely to drop, without
/// touching them (the reasons: `observer_common::checks`). `slot` holds
/// the node facts cached for the flow's key, when it has a cache slot:
/// read there when current, else decided and stored (`current_facts`).
#[inline(always)]
pub fn classifier_checks(
    evidence: u32,
    ifindex: u32,
    c: &Classified,
    wire_len: u64,
    slot: Option<&mut KeyFacts>,
) {
    let mut facts = match slot {
        Some(slot) => MapFacts {
            ifindex,
            decided: true,
            facts: current_facts(slot, ifindex, c),
        },
        None => MapFacts {
            ifindex,
            decided: false,
            facts: FlowFacts::default(),
        },
    };
    checks::classifier_drops(c, wire_len, &mut facts, |reason: ClassifierDrop| {
        record(evidence, ifindex, c, reason, wire_len)
    });
}

/// Whether a received [`CommonVxlan`] frame passes the classifier checks on
/// what is already known: the facts its cache slot holds (`facts`) are
/// current and say its source is inside its allow-set, and with them the
/// other checks flag nothing (`checks::common_vxlan_clean`). `false` sends
/// the frame the full way, which decides the facts or flags the frame.
#[inline(always)]
pub fn common_vxlan_passes(v: &CommonVxlan, wire_len: u64, facts: &KeyFacts) -> bool {
    facts
        .current(facts_generation())
        .is_some_and(|f| !f.outside_allow_set && checks::common_vxlan_clean(v, wire_len, &f))
}

/// Whether a received frame `c` the checks concern, counted in cache slot
/// `slot` with inner TCP signals `tcp`, is known to pass them: the slot's
/// facts are current and with them the checks flag nothing
/// (`checks::flags_nothing`). The hook then skips its checks program;
/// `false` sends the frame there, which decides the facts or flags it.
#[inline(always)]
pub fn known_to_pass(
    slot: Option<&FlowCacheSlot>,
    c: &Classified,
    wire_len: u64,
    tcp: &TcpCounts,
) -> bool {
    slot.and_then(|s| s.facts.current(facts_generation()))
        .is_some_and(|facts| checks::flags_nothing(c, wire_len, facts, tcp))
}

/// The facts `slot` holds when they are current, else the facts of `c`
/// on `ifindex` from the maps, stored in `slot`: the LPM trie and the VNI
/// and MTU lookups run once per flow and change of the node's facts, not
/// per packet. The generation is read before the maps, so facts decided
/// while userspace changes one are stored under the old generation and
/// decided again.
///
/// Either way the facts are read back from the slot, through
/// `parse::clobbered`: to the verifier they are then values from map
/// memory, unknown, so the checks after this are verified once instead of
/// once for each combination of facts just decided (which tripled XDP's
/// verified instructions).
#[inline(always)]
fn current_facts(slot: &mut KeyFacts, ifindex: u32, c: &Classified) -> FlowFacts {
    let generation = facts_generation();
    if !slot.is_current(generation) {
        let facts = FlowFacts {
            outside_allow_set: outside_allow_set(c),
            vni_unknown: c.proto == Proto::Vxlan && vni_unknown(c.vni),
            mtu: iface_mtu(ifindex),
        };
        *slot = KeyFacts::decided(generation, &facts);
    }
    // SAFETY: the same slot, reloaded (see above).
    unsafe { &*clobbered(slot) }.facts()
}

/// The checks' node facts: the key's, `decided`, when it has a cache
/// slot; else looked up in the maps as the checks ask. (A flag beside
/// plain values, not an `Option`: see `FlowFacts::mtu`.)
struct MapFacts {
    ifindex: u32,
    decided: bool,
    facts: FlowFacts,
}

impl CheckFacts for MapFacts {
    #[inline(always)]
    fn outside_allow_set(&mut self, c: &Classified) -> bool {
        if self.decided {
            self.facts.outside_allow_set
        } else {
            outside_allow_set(c)
        }
    }

    #[inline(always)]
    fn vni_unknown(&self, vni: u32) -> bool {
        if self.decided {
            self.facts.vni_unknown
        } else {
            vni_unknown(vni)
        }
    }

    #[inline(always)]
    fn iface_mtu(&self) -> Option<u32> {
        let mtu = if self.decided {
            self.facts.mtu
        } else {
            iface_mtu(self.ifindex)
        };
        (mtu != 0).then_some(mtu)
    }
}

/// Whether the VNI check is on and no local vxlan device has `vni`.
#[inline(always)]
fn vni_unknown(vni: u32) -> bool {
    config_on(config::VNI_CHECK) && LOCAL_VNIS.get_ptr(vni).is_none()
}

/// The MTU of interface `ifindex`; 0 when userspace wrote none.
#[inline(always)]
pub fn iface_mtu(ifindex: u32) -> u32 {
    // SAFETY: map value pointer from a successful lookup.
    IFACE_MTU.get_ptr(ifindex).map_or(0, |mtu| unsafe { *mtu })
}

/// Flags the wrong and zero checksums of a received tunnel packet's
/// handshake or reset segment (`checks::checksum_drops`). Summing headers
/// of many possible lengths multiplies the verifier's states of what
/// follows: both hooks run it in their checks programs (`xdp_checks`,
/// `tc_checks`), last.
#[inline(always)]
pub fn checksum_checks<F: crate::parse::Frame>(
    f: &F,
    evidence: u32,
    ifindex: u32,
    c: &Classified,
    wire_len: u64,
) {
    checks::checksum_drops(f, c, |reason: ClassifierDrop| {
        record(evidence, ifindex, c, reason, wire_len)
    });
}

/// Counts a router's "too big" ICMP error about a tunnel packet this node
/// sent, against the tunnel peer it was sent to (see `parse::too_big`).
#[inline(always)]
pub fn path_mtu_checks<F: crate::parse::Frame>(
    f: &F,
    evidence: u32,
    ifindex: u32,
    c: &Classified,
    wire_len: u64,
) {
    if let Some(quoted) = crate::parse::too_big(f, c, &MapPorts) {
        record(
            evidence,
            ifindex,
            &quoted,
            ClassifierDrop::PathMtu,
            wire_len,
        );
    }
}

/// `CONFIG[FACTS_GENERATION]` (0 until userspace starts it: no facts
/// count as current).
#[inline(always)]
fn facts_generation() -> u32 {
    config_word(config::FACTS_GENERATION)
}

/// True when the packet's encapsulation has an active allow-set that does
/// not contain its source.
#[inline(always)]
fn outside_allow_set(c: &Classified) -> bool {
    allow_switches(c.proto).is_some_and(|switches| outside_allow_set_of(c, switches))
}

/// The (IPv4, IPv6) switches of the allow-sets guarding `proto`, if any.
#[inline(always)]
fn allow_switches(proto: Proto) -> Option<(u32, u32)> {
    match proto {
        Proto::Vxlan => Some((config::VXLAN_ALLOW_V4, config::VXLAN_ALLOW_V6)),
        Proto::Ipip | Proto::Ip6ip => Some((config::IPIP_ALLOW_V4, config::IPIP_ALLOW_V6)),
        _ => None,
    }
}

/// [`outside_allow_set`] with the encapsulation's allow-set switches.
#[inline(always)]
fn outside_allow_set_of(c: &Classified, (v4_switch, v6_switch): (u32, u32)) -> bool {
    let vxlan = c.proto == Proto::Vxlan;
    match c.peer_family {
        family::V4 if config_on(v4_switch) => {
            let key = Key::new(32, c.peer[0]);
            let found = if vxlan {
                VXLAN_ALLOW4.get(&key).is_some()
            } else {
                IPIP_ALLOW4.get(&key).is_some()
            };
            !found
        }
        family::V6 if config_on(v6_switch) => {
            let key = Key::new(128, c.peer);
            let found = if vxlan {
                VXLAN_ALLOW6.get(&key).is_some()
            } else {
                IPIP_ALLOW6.get(&key).is_some()
            };
            !found
        }
        _ => false,
    }
}
