//! Drop accounting shared by the ingress hooks (classifier reasons) and the
//! kfree_skb hook (kernel reasons).

use aya_ebpf::maps::lpm_trie::Key;
use observer_common::{
    ClassifierDrop, DropKey, DropValue, Proto,
    checks::{self, CheckFacts},
    config, drop_origin, family,
};

use crate::{
    maps::{
        CONFIG, DROPS, IFACE_MTU, IPIP_ALLOW4, IPIP_ALLOW6, LOCAL_VNIS, MapPorts, VXLAN_ALLOW4,
        VXLAN_ALLOW6, config_on,
    },
    parse::{Classified, CommonVxlan},
};

/// Adds one packet to the drop counters of (ifindex, peer, origin, reason).
#[inline(always)]
pub fn record(ifindex: u32, c: &Classified, origin: u8, reason: u32, bytes: u64) {
    let key = DropKey::of(ifindex, c, origin, reason);
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
/// touching them (the reasons: `observer_common::checks`). `verdict` is
/// the allow-set verdict cached in the flow's cache slot, when it has one.
#[inline(always)]
pub fn classifier_checks(ifindex: u32, c: &Classified, wire_len: u64, verdict: Option<&mut u32>) {
    let mut facts = MapFacts { ifindex, verdict };
    checks::classifier_drops(c, wire_len, &mut facts, |reason: ClassifierDrop| {
        record(ifindex, c, drop_origin::CLASSIFIER, reason as u32, wire_len)
    });
}

/// Whether a received [`CommonVxlan`] frame passes the classifier checks on
/// what is already known: the allow-set verdict its cache slot holds was
/// decided under the current generation and says inside, and the other
/// checks flag nothing (`checks::common_vxlan_clean`). `false` sends the
/// frame the full way, which decides the verdict or flags the frame.
#[inline(always)]
pub fn common_vxlan_passes(ifindex: u32, v: &CommonVxlan, wire_len: u64, verdict: u32) -> bool {
    cached_outside(verdict, allow_generation()) == Some(false)
        && checks::common_vxlan_clean(
            v,
            wire_len,
            &MapFacts {
                ifindex,
                verdict: None,
            },
        )
}

/// The checks' node facts, from the maps userspace fills.
struct MapFacts<'a> {
    ifindex: u32,
    verdict: Option<&'a mut u32>,
}

impl CheckFacts for MapFacts<'_> {
    #[inline(always)]
    fn outside_allow_set(&mut self, c: &Classified) -> bool {
        outside_allow_set_cached(c, self.verdict.as_deref_mut())
    }

    #[inline(always)]
    fn vni_unknown(&self, vni: u32) -> bool {
        config_on(config::VNI_CHECK) && LOCAL_VNIS.get_ptr(vni).is_none()
    }

    #[inline(always)]
    fn iface_mtu(&self) -> Option<u32> {
        // SAFETY: map value pointer from a successful lookup.
        IFACE_MTU.get_ptr(self.ifindex).map(|mtu| unsafe { *mtu })
    }
}

/// Counts a router's "too big" ICMP error about a tunnel packet this node
/// sent, against the tunnel peer it was sent to (see `parse::too_big`).
#[inline(always)]
pub fn path_mtu_checks<F: crate::parse::Frame>(f: &F, ifindex: u32, c: &Classified, wire_len: u64) {
    if let Some(quoted) = crate::parse::too_big(f, c, &MapPorts) {
        record(
            ifindex,
            &quoted,
            drop_origin::CLASSIFIER,
            ClassifierDrop::PathMtu as u32,
            wire_len,
        );
    }
}

/// [`outside_allow_set`], from `verdict` when it was decided under the
/// current allow-set generation: the trie is walked once per flow and set
/// change, not per packet. The generation is read before the trie, so a
/// verdict decided while userspace changes a set is stored under the old
/// generation and decided again.
#[inline(always)]
fn outside_allow_set_cached(c: &Classified, verdict: Option<&mut u32>) -> bool {
    let Some(switches) = allow_switches(c.proto) else {
        return false;
    };
    let Some(verdict) = verdict else {
        return outside_allow_set(c, switches);
    };
    let generation = allow_generation();
    if let Some(outside) = cached_outside(*verdict, generation) {
        return outside;
    }
    let outside = outside_allow_set(c, switches);
    *verdict = (generation << 1) | u32::from(outside);
    outside
}

/// `CONFIG[ALLOW_GENERATION]`; 0 (no verdict counts as cached) when it
/// cannot be read.
#[inline(always)]
fn allow_generation() -> u32 {
    CONFIG.get(config::ALLOW_GENERATION).copied().unwrap_or(0)
}

/// The "outside" bit of a cached `verdict` (`generation << 1 | outside`)
/// when it was decided under `generation`; `None` when it is stale or
/// none was decided.
#[inline(always)]
fn cached_outside(verdict: u32, generation: u32) -> Option<bool> {
    (generation != 0 && verdict >> 1 == generation).then_some(verdict & 1 != 0)
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

/// True when the packet's encapsulation has an active allow-set that does
/// not contain its source.
#[inline(always)]
fn outside_allow_set(c: &Classified, (v4_switch, v6_switch): (u32, u32)) -> bool {
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
