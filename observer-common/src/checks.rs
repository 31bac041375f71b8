//! Which classifier drop reasons a received tunnel packet earns: the
//! decision the ingress hooks make, and `observer replay` makes natively
//! from the same source. The node facts it needs (allow-sets, local VNIs,
//! the interface MTU) come through [`CheckFacts`]: maps in the programs,
//! plain data in userspace.

use crate::{
    ClassifierDrop, Proto, TcpCounts, VXLAN_FLAG_I,
    parse::{self, Classified, CommonVxlan, ETH_HLEN, Frame},
};

/// IPv6's minimum link MTU (RFC 8200).
const MIN_LINK_MTU: usize = 1280;

/// The node facts behind the checks.
pub trait CheckFacts {
    /// Whether the frame's encapsulation has an active allow-set that does
    /// not hold its source (`c.peer`).
    fn outside_allow_set(&mut self, c: &Classified) -> bool;
    /// Whether the VNI check is on and no local vxlan device has `vni`.
    fn vni_unknown(&self, vni: u32) -> bool;
    /// MTU of the interface the frame arrived on, when known.
    fn iface_mtu(&self) -> Option<u32>;
}

/// The node facts about one flow key, decided together: what a flow
/// cache slot keeps ([`crate::KeyFacts`]) and the checks read from it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FlowFacts {
    /// The key's encapsulation has an active allow-set without its source.
    pub outside_allow_set: bool,
    /// The VNI check is on and no local vxlan device has the key's VNI.
    pub vni_unknown: bool,
    /// MTU of the key's interface; 0 when unknown. A plain value, not an
    /// `Option`: the programs' verifier refuses the uninitialised register
    /// LLVM copies for a `None`.
    pub mtu: u32,
}

impl CheckFacts for FlowFacts {
    #[inline(always)]
    fn outside_allow_set(&mut self, _: &Classified) -> bool {
        self.outside_allow_set
    }

    #[inline(always)]
    fn vni_unknown(&self, _: u32) -> bool {
        self.vni_unknown
    }

    #[inline(always)]
    fn iface_mtu(&self) -> Option<u32> {
        (self.mtu != 0).then_some(self.mtu)
    }
}

/// Calls `flag` once per reason the received frame `c` of `wire_len`
/// bytes earns: a source outside the allow-set of its encapsulation,
/// VXLAN without the I flag or with a VNI no local device has, an outer
/// fragment, an outer packet above the interface MTU. Plain traffic earns
/// none.
#[inline(always)]
pub fn classifier_drops<K: CheckFacts>(
    c: &Classified,
    wire_len: u64,
    facts: &mut K,
    mut flag: impl FnMut(ClassifierDrop),
) {
    if c.proto == Proto::Other {
        return;
    }
    if facts.outside_allow_set(c) {
        flag(ClassifierDrop::CalicoAllowSet);
    }
    if c.proto == Proto::Vxlan {
        if c.vxlan_flags & VXLAN_FLAG_I == 0 {
            flag(ClassifierDrop::VxlanNoIFlag);
        }
        if facts.vni_unknown(c.vni) {
            flag(ClassifierDrop::VniUnknown);
        }
    }
    if c.outer_fragment {
        flag(ClassifierDrop::OuterFragment);
    }
    if over_mtu(wire_len, c.l2_len, facts) {
        flag(ClassifierDrop::OverMtu);
    }
}

/// Whether a received frame of `wire_len` bytes, `l2_len` of them
/// Ethernet headers, is above the interface MTU.
#[inline(always)]
fn over_mtu<K: CheckFacts>(wire_len: u64, l2_len: usize, facts: &K) -> bool {
    // No underlay has an MTU below IPv6's minimum: smaller packets skip the
    // MTU lookup, which in the programs costs as much as the rest.
    wire_len > (l2_len + MIN_LINK_MTU) as u64
        && facts
            .iface_mtu()
            .is_some_and(|mtu| wire_len > l2_len as u64 + u64::from(mtu))
}

/// Whether a received [`CommonVxlan`] frame of `wire_len` bytes earns no
/// reason, given that its source is inside its allow-set (or none is
/// active): [`classifier_drops`] then flags nothing (the frame has the I
/// flag, is not a fragment, and its headers are untagged Ethernet).
#[inline(always)]
pub fn common_vxlan_clean<K: CheckFacts>(v: &CommonVxlan, wire_len: u64, facts: &K) -> bool {
    !facts.vni_unknown(v.vni) && !over_mtu(wire_len, ETH_HLEN, facts)
}

/// Whether the checks programs would flag nothing on the received frame
/// `c` of `wire_len` bytes, whose inner TCP signals are `tcp`, given its
/// key's node `facts`: a tunnel packet (never ICMP, which may quote one:
/// `path_mtu` reads it) that earns no classifier reason and is not a
/// handshake or reset segment (the only ones [`checksum_drops`] reads).
/// What lets a hook skip its checks program on a flow whose facts are
/// known: every full-path tunnel packet would otherwise pay a tail call.
#[inline(always)]
pub fn flags_nothing(c: &Classified, wire_len: u64, mut facts: FlowFacts, tcp: &TcpCounts) -> bool {
    if c.proto == Proto::Other || tcp.syn | tcp.syn_ack | tcp.rst != 0 {
        return false;
    }
    let mut clean = true;
    classifier_drops(c, wire_len, &mut facts, |_| clean = false);
    clean
}

/// Calls `flag` once per checksum reason the received tunnel frame `c`
/// earns (`parse::checksums`: handshake and reset segments only): a wrong
/// inner TCP checksum, a wrong outer UDP checksum, a zero one.
#[inline(always)]
pub fn checksum_drops<F: Frame>(f: &F, c: &Classified, mut flag: impl FnMut(ClassifierDrop)) {
    if c.proto == Proto::Other {
        return;
    }
    let sums = parse::checksums(f, c);
    if sums.bad_inner {
        flag(ClassifierDrop::BadInnerChecksum);
    }
    if sums.bad_outer {
        flag(ClassifierDrop::BadOuterChecksum);
    }
    if sums.zero_outer {
        flag(ClassifierDrop::ZeroUdpChecksum);
    }
}
