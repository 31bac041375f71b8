//! The rules: one function per [`Kind`], each judging one tunnel (peer,
//! encapsulation) over the window and, when its condition holds, saying
//! so in evidence, a summary of what was measured and a hint of what to do
//! next. The texts name what this node knows: its nodes, allow-sets and
//! the UDP ports it classifies by.

use std::{collections::BTreeMap, net::IpAddr};

use observer_common::{ClassifierDrop, Proto};
use serde_json::{Value, json};

use super::{
    Kind, Known, Thresholds,
    collect::{Extra, Totals},
};
use ipnet::IpNet;

use crate::model::{
    bgp::{BgpSession, UNKNOWN},
    bgp_wire::WirePeer,
    dataplane::{BlockRoute, origin_name},
    facts::SetKind,
    ports::PortConfig,
    routes::MissingBlock,
};

/// Blocks named in one `route_missing`'s evidence; the rest are counted.
const MAX_BLOCKS_IN_EVIDENCE: usize = 16;

/// Everything a rule may look at for one tunnel.
pub(super) struct PeerFacts<'a> {
    pub(super) thresholds: &'a Thresholds,
    /// The peer (outer address).
    pub(super) peer: IpAddr,
    pub(super) proto: Proto,
    /// What the tunnel did over the window.
    pub(super) window: &'a Totals,
    /// The span `window` covers: shorter than the threshold's window at start.
    pub(super) seconds: f64,
    /// Whether `window` covers a whole window, so that an absence (no
    /// replies) means something.
    pub(super) full_window: bool,
    pub(super) extra: &'a Extra,
    pub(super) known: &'a Known,
    /// Whether a rule that holds writes its evidence and texts, or only
    /// says that it holds: most conditions of a flood of sources are
    /// never raised (beyond [`super::MAX_ACTIVE`]), and their texts were
    /// most of the memory an interval allocated.
    pub(super) describe: bool,
}

/// A name written in capitals.
struct Uppercase(&'static str);

impl std::fmt::Display for Uppercase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0
            .chars()
            .flat_map(char::to_uppercase)
            .try_for_each(|c| std::fmt::Write::write_char(f, c))
    }
}

impl PeerFacts<'_> {
    /// The encapsulation as texts write it. Formatted only when a text is
    /// written: every rule names it, but few fire (an uppercased `String`
    /// per rule and tunnel was a tenth of judging 57,344 tunnels).
    fn name(&self) -> Uppercase {
        Uppercase(self.proto.name())
    }

    /// The window in whole seconds, for texts.
    fn secs(&self) -> u64 {
        self.seconds.round().max(1.0) as u64
    }

    fn is_node(&self) -> bool {
        self.known.is_node(self.peer)
    }

    /// How the encapsulation is recognised on the path, for hints.
    fn carrier(&self) -> String {
        carrier(self.proto, &self.known.ports)
    }

    /// What a rule that holds returns: `make`'s finding when texts are
    /// wanted, else an empty one.
    fn found(&self, make: impl FnOnce() -> Finding) -> Option<Finding> {
        Some(if self.describe {
            make()
        } else {
            Finding::default()
        })
    }
}

/// A condition that holds now.
#[derive(Default)]
pub(super) struct Finding {
    pub(super) evidence: BTreeMap<&'static str, Value>,
    pub(super) summary: String,
    pub(super) hint: String,
}

/// The kinds whose tunnel rule holds for one tunnel.
pub(super) fn holding<'a>(facts: &'a PeerFacts<'a>) -> impl Iterator<Item = Kind> + 'a {
    Kind::ALL
        .into_iter()
        .filter(|&kind| rule(kind).is_some_and(|rule| rule(facts).is_some()))
}

/// The finding of the tunnel rule of `kind`, when it holds.
pub(super) fn finding(kind: Kind, facts: &PeerFacts<'_>) -> Option<Finding> {
    rule(kind)?(facts)
}

/// The tunnel rule of `kind`: a match, so a new kind cannot go without
/// one; `None` for the kinds judged on the node's own facts: per BGP
/// session ([`bgp_down`], [`bgp_flap`]) or per routed block
/// ([`route_missing`]).
fn rule(kind: Kind) -> Option<fn(&PeerFacts<'_>) -> Option<Finding>> {
    Some(match kind {
        Kind::OneWay => one_way,
        Kind::SnatSuspected => snat_suspected,
        Kind::AllowSetDrop => allow_set_drop,
        Kind::EncapMismatch => encap_mismatch,
        Kind::Mtu => mtu,
        Kind::UnknownPeer => unknown_peer,
        Kind::DropSpike => drop_spike,
        Kind::DroppedAfterDecap => dropped_after_decap,
        Kind::TcpSynUnanswered => tcp_syn_unanswered,
        Kind::BadChecksum => bad_checksum,
        Kind::MssExceedsTunnel => mss_exceeds_tunnel,
        Kind::BgpDown
        | Kind::BgpFlap
        | Kind::RouteMissing
        | Kind::RouteConflict
        | Kind::StaleRoute => return None,
    })
}

/// A BGP session re-established `times` times within the flap window:
/// more than the threshold.
pub(super) fn bgp_flap(session: &BgpSession, times: usize, th: &Thresholds) -> Option<Finding> {
    if times <= th.bgp_flaps as usize {
        return None;
    }
    let neighbor = session.neighbor?;
    let window = th.bgp_flap_window.as_secs();
    Some(Finding {
        evidence: BTreeMap::from([
            ("protocol", json!(session.protocol)),
            ("socket", json!(session.socket)),
            ("re_established", json!(times)),
            ("window_s", json!(window)),
            ("threshold", json!(th.bgp_flaps)),
            ("bgp_state", json!(session.bgp_state)),
            ("last_error", json!(session.last_error)),
        ]),
        summary: format!(
            "BGP session {} with {neighbor} re-established {times} times in {window} s (threshold {})",
            session.protocol, th.bgp_flaps
        ),
        hint: format!(
            "each flap withdraws and re-learns {neighbor}'s pod blocks: see BIRD's last error (birdc -s {} show protocols all {}), hold timers against the path's loss and latency, and what restarts BIRD or calico-node on either node",
            session.socket, session.protocol
        ),
    })
}

/// A BGP session of the node's BIRD that is not established, seen so for
/// `down_for` seconds: BIRD has withdrawn the neighbor's routes, so its
/// pod blocks are unreachable from here unless another path announces
/// them.
pub(super) fn bgp_down(session: &BgpSession, down_for: f64) -> Option<Finding> {
    if session.established() {
        return None;
    }
    let neighbor = session.neighbor?;
    let error = session
        .last_error
        .as_deref()
        .map(|e| format!(" (last error: {e})"))
        .unwrap_or_default();
    Some(Finding {
        evidence: BTreeMap::from([
            ("protocol", json!(session.protocol)),
            ("socket", json!(session.socket)),
            ("state", json!(session.state)),
            ("bgp_state", json!(session.bgp_state)),
            ("since", json!(session.since)),
            ("last_error", json!(session.last_error)),
            ("routes_imported", json!(session.routes_imported)),
            ("down_for_s", json!(down_for.round())),
        ]),
        summary: format!(
            "BGP session {} with {neighbor} is {} since {} ({:.0} s seen down){error}",
            session.protocol, session.bgp_state, session.since, down_for
        ),
        hint: if session.bgp_state == UNKNOWN {
            format!(
                "this node's own BIRD does not answer on {} ({}): check calico-node and BIRD here first; while it is down, this node has no route to the pod blocks {neighbor} announces",
                session.socket,
                session.last_error.as_deref().unwrap_or("no reading")
            )
        } else {
            format!(
                "check BIRD on {neighbor} and TCP port 179 between the nodes (birdc -s {} show protocols all {}); while it is down, this node has no route to the pod blocks {neighbor} announces",
                session.socket, session.protocol
            )
        },
    })
}

/// The BGP session with `peer` has been down at the wire (no BIRD
/// socket answered here) for `down_for` seconds, for the reason `why`
/// (`bgp_wire::down_at_wire`).
pub(super) fn bgp_down_at_wire(
    peer: IpAddr,
    wire: &WirePeer,
    why: &str,
    now: f64,
    down_for: f64,
) -> Finding {
    Finding {
        evidence: BTreeMap::from([
            ("source", json!("wire")),
            ("ended_by", json!(wire.ended_by)),
            (
                "heard_s_ago",
                json!(wire.heard_s.map(|h| (now - h).round())),
            ),
            ("hold_time_s", json!(wire.hold_time_s())),
            ("down_for_s", json!(down_for.round())),
        ]),
        summary: format!("BGP session with {peer} is down at the wire ({down_for:.0} s): {why}"),
        hint: format!(
            "no BIRD control socket answered here (--bird-socket), so this is the wire's view: check BIRD on both nodes (birdc show protocols all) and TCP port 179 between them; while it is down, this node has no route to the pod blocks {peer} announces"
        ),
    }
}

/// `blocks` (all routed to `node`, none empty) have had no route for
/// `missing_for` seconds; `session` is BIRD's session with `node`, when
/// it has one (then a `bgp_down` usually explains the loss).
pub(super) fn route_missing(
    node: IpAddr,
    blocks: &[&MissingBlock],
    missing_for: f64,
    session: Option<&BgpSession>,
) -> Finding {
    let names: Vec<String> = blocks
        .iter()
        .take(MAX_BLOCKS_IN_EVIDENCE)
        .map(|b| b.block.to_string())
        .collect();
    let last = &blocks[0].last_route;
    let was = last
        .next_hops
        .iter()
        .map(|h| match h.gateway {
            Some(gateway) => format!("via {gateway} dev {}", h.device),
            None => format!("dev {}", h.device),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let origin = origin_name(last.origin);
    let bgp = match session {
        Some(s) => format!("; BGP session {} is {}", s.protocol, s.bgp_state),
        None => String::new(),
    };
    let more = blocks.len().saturating_sub(names.len());
    let listed = if more > 0 {
        format!("{} and {more} more", names.join(", "))
    } else {
        names.join(", ")
    };
    Finding {
        evidence: BTreeMap::from([
            ("blocks", json!(names)),
            ("blocks_missing", json!(blocks.len())),
            ("missing_for_s", json!(missing_for.round())),
            ("last_route", json!(format!("{was} proto {origin}"))),
            ("bgp_protocol", json!(session.map(|s| &s.protocol))),
            ("bgp_state", json!(session.map(|s| &s.bgp_state))),
        ]),
        summary: format!(
            "no route here for {listed} of node {node} for {missing_for:.0} s (was {was} proto {origin}){bgp}"
        ),
        hint: match session {
            Some(s) if s.bgp_state == UNKNOWN => format!(
                "this node's own BIRD does not answer on {} (see bgp_down): it withdrew the routes it installed; check calico-node and BIRD here",
                s.socket
            ),
            Some(s) if !s.established() => format!(
                "the BGP session with {node} is down (see bgp_down): its blocks come back when it re-establishes; check BIRD on {node} and TCP port 179"
            ),
            _ => format!(
                "check that {node} still announces the block and that no import filter drops it (birdc show route all for the block, on both nodes), and the block's owner in Calico IPAM (calicoctl ipam show --show-blocks)"
            ),
        },
    }
}

/// An Established BGP session whose every announced route this node's
/// import filter rejected: the neighbor's blocks are never routed here
/// (a new node's block filtered by one peer).
pub(super) fn routes_filtered(session: &BgpSession) -> Option<Finding> {
    let neighbor = session.neighbor?;
    if !session.established() || session.routes_imported > 0 || session.updates_filtered == 0 {
        return None;
    }
    Some(Finding {
        evidence: BTreeMap::from([
            ("blocks", json!([])),
            ("updates_filtered", json!(session.updates_filtered)),
            ("routes_imported", json!(0)),
            ("bgp_protocol", json!(session.protocol)),
            ("bgp_state", json!(session.bgp_state)),
        ]),
        summary: format!(
            "BGP session {} with {neighbor} is Established, but this node's import filter rejected all {} route updates it sent: none of its pod blocks is routed here",
            session.protocol, session.updates_filtered
        ),
        hint: format!(
            "check BIRD's import filter here (birdc -s {} show protocols all {}; Calico: BGPFilter resources, bird.cfg templates) against {neighbor}'s blocks (calicoctl ipam show --show-blocks)",
            session.socket, session.protocol
        ),
    })
}

/// `blocks` are routed here both to `node` and elsewhere (another node,
/// or a blackhole beside the route): two owners for one block.
pub(super) fn route_conflict(node: IpAddr, blocks: &[&BlockRoute]) -> Finding {
    let described: Vec<String> = blocks
        .iter()
        .take(MAX_BLOCKS_IN_EVIDENCE)
        .map(|b| {
            let mut ways: Vec<String> = b
                .next_hops
                .iter()
                .map(|h| match h.node {
                    Some(n) => format!("via {n} dev {}", h.device),
                    None => format!("dev {}", h.device),
                })
                .collect();
            if b.blackhole {
                ways.push("blackhole".into());
            }
            format!("{} {}", b.block, ways.join(" and "))
        })
        .collect();
    let names: Vec<String> = blocks
        .iter()
        .take(MAX_BLOCKS_IN_EVIDENCE)
        .map(|b| b.block.to_string())
        .collect();
    Finding {
        evidence: BTreeMap::from([
            ("blocks", json!(names)),
            ("blocks_in_conflict", json!(blocks.len())),
            ("routes", json!(described)),
        ]),
        summary: format!(
            "pod block routed two ways here, one of them to {node}: {}",
            described.join("; ")
        ),
        hint: "find the block's real owner (calicoctl ipam show --show-blocks; birdc show route all for the block) and remove the other route or the stale block affinity; until then its pods answer only on one path".to_string(),
    }
}

/// `addr` is pointed at by this node's data plane (`blocks` routed to
/// it, `devices` with FDB or neighbour entries for it) and is no longer a
/// node: no BGP session with it, no allow-set admits it, no traffic.
pub(super) fn stale_route(
    addr: IpAddr,
    blocks: &[IpNet],
    devices: &[String],
    known: &Known,
) -> Finding {
    let names: Vec<String> = blocks
        .iter()
        .take(MAX_BLOCKS_IN_EVIDENCE)
        .map(ToString::to_string)
        .collect();
    let pointers = match (names.is_empty(), devices.is_empty()) {
        (false, true) => format!("routes for {}", names.join(", ")),
        (true, false) => format!("entries on {}", devices.join(", ")),
        _ => format!(
            "routes for {} and entries on {}",
            names.join(", "),
            devices.join(", ")
        ),
    };
    Finding {
        evidence: BTreeMap::from([
            ("blocks", json!(names)),
            ("devices", json!(devices)),
            ("bgp_sessions_read", json!(known.bgp.len())),
            (
                "allow_set_active",
                json!(
                    known
                        .allow
                        .as_ref()
                        .is_some_and(|a| a.vxlan.active() || a.ipip.active())
                ),
            ),
        ]),
        summary: format!(
            "{pointers} still lead to {addr}, which is no longer a node here: no BGP session, not in an allow-set, no traffic"
        ),
        hint: format!(
            "if {addr} was decommissioned, remove what still points at it (ip route / bridge fdb / ip neigh, or the calico Node and its IPAM blocks); if it is a node, see why it has no BGP session or allow-set entry"
        ),
    }
}

/// Traffic in one direction only, over a whole window: before that, a
/// missing direction may only not have happened yet. Received-only traffic
/// from an address that is no node is left to snat_suspected /
/// unknown_peer.
fn one_way(f: &PeerFacts<'_>) -> Option<Finding> {
    if !f.full_window {
        return None;
    }
    let (d, th, peer, p, secs) = (f.window, f.thresholds, f.peer, f.name(), f.secs());
    if d.tx >= th.min_packets && d.rx == 0 && f.proto != Proto::Wireguard {
        return f.found(|| Finding {
            evidence: BTreeMap::from([
                ("direction", json!("tx_only")),
                ("sent", json!(d.tx)),
                ("received", json!(0)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{p} to {peer}: {} packets sent, none received from {peer} in {secs} s",
                d.tx
            ),
            hint: format!(
                "run `observer diagnose` on {peer}: if nothing arrives there, the path drops {} in this direction; if it arrives from another address, a router rewrites the source",
                f.carrier()
            ),
        });
    }
    if d.rx >= th.min_packets && d.tx == 0 && f.is_node() {
        return f.found(|| Finding {
            evidence: BTreeMap::from([
                ("direction", json!("rx_only")),
                ("sent", json!(0)),
                ("received", json!(d.rx)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{p} from {peer}: {} packets received, none sent back to {peer} in {secs} s",
                d.rx
            ),
            hint: format!(
                "replies to {peer} do not leave by {p}: check this node's routes to {peer}'s pod blocks (`ip route | grep {peer}`) and whether the packets are dropped here (drop rows)"
            ),
        });
    }
    None
}

/// The outer source is no node, the inner source is a node's pod address.
fn snat_suspected(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p) = (f.window, f.peer, f.name());
    // A BGP neighbor of this node's BIRD is a node, also while its routes
    // are not (yet) here: after a session comes back, the peer may send
    // before this node re-learns its blocks (a route_missing then).
    if d.rx == 0 || f.is_node() || f.known.bgp.iter().any(|s| s.neighbor == Some(peer)) {
        return None;
    }
    let inner = f.extra.inner_src?;
    let (node, block) = f.known.node_owning(inner)?;
    f.found(|| Finding {
        evidence: BTreeMap::from([
            ("outer_source", json!(peer)),
            ("inner_source", json!(inner)),
            ("real_node", json!(node)),
            ("pod_block", json!(block.to_string())),
            ("packets", json!(d.rx)),
        ]),
        summary: format!(
            "{p} arrives from {peer}, which is no node, carrying {inner} from {node}'s pod block {block}: {node} really sent it"
        ),
        hint: format!(
            "a router between {node} and this node source-NATs {}: exempt it from NAT (or use an encapsulation the router does not NAT, such as IPIP)",
            f.carrier()
        ),
    })
}

/// The classifier's allow-set verdict or netfilter's DROP: the larger,
/// since both usually see the same packets.
fn allow_set_drop(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    let allow_drops = d.allow_set.max(d.netfilter);
    if allow_drops == 0 {
        return None;
    }
    f.found(|| {
        let sets = set_names(f.proto);
        Finding {
            evidence: BTreeMap::from([
                ("calico_allow_set", json!(d.allow_set)),
                ("netfilter_drop", json!(d.netfilter)),
                ("allow_set", json!(sets)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{allow_drops} {p} packets from {peer} dropped in {secs} s: source not in {sets}"
            ),
            hint: if f.is_node() {
                format!(
                    "{peer} is a node: add it to {sets} (is its calico-node running and its Node address right?)"
                )
            } else {
                format!(
                    "if {peer} is a real node, add it to {sets}; if it is a router's address, the real sender is hidden by SNAT (see snat_suspected)"
                )
            },
        }
    })
}

/// Packets of the peer dropped after decapsulation (or to it before
/// encapsulation), at least `min_packets` over the window: where, why,
/// and what to look at for the largest cause.
fn dropped_after_decap(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    if d.after_decap == 0 || d.after_decap < f.thresholds.min_packets {
        return None;
    }
    f.found(|| {
        let mut causes: Vec<(&str, &str, u64)> = f.extra.after_decap().collect();
        causes.sort_by_key(|c| std::cmp::Reverse(c.2));
        let list: Vec<String> = causes
            .iter()
            .map(|(reason, place, n)| format!("{reason} {n} {place}"))
            .collect();
        let (reason, place) = causes.first().map_or(("", ""), |(r, w, _)| (*r, *w));
        Finding {
            evidence: BTreeMap::from([
                ("dropped", json!(d.after_decap)),
                ("since_tracked", json!(list)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{} {p} packets of {peer}'s pods dropped by this node after decapsulation in {secs} s: {}",
                d.after_decap,
                list.join("; ")
            ),
            hint: after_decap_hint(reason, place),
        }
    })
}

/// What to look at for a drop after decapsulation with `reason`.
fn after_decap_hint(reason: &str, place: &str) -> String {
    match reason {
        "NETFILTER_DROP" => format!(
            "a netfilter rule drops them {place}: conntrack INVALID (`conntrack -S`, the checksum-offload bug), a network policy or a DROP rule (`iptables-save -c | grep -i drop`, `nft list ruleset`)"
        ),
        "IP_RPFILTER" => format!(
            "the reverse-path filter refuses their inner source {place}: this node routes that source's block another way; fix the route, or set rp_filter to 2 (loose) on the tunnel device"
        ),
        "NO_TX_TARGET" | "VXLAN_NO_REMOTE" | "NEIGH_FAILED" | "NEIGH_QUEUEFULL" | "NEIGH_DEAD" => {
            format!(
                "the tunnel device has no FDB or neighbour entry for the peer's VTEP ({place}): `bridge fdb show dev <device>`, `ip neigh show dev <device>`; the CNI agent (calico-node, flanneld) restores them"
            )
        }
        _ => format!(
            "the kernel drops them {place} with reason {reason}: the drop rows name the device and function"
        ),
    }
}

/// Unanswered SYNs one way before `tcp_syn_unanswered` holds: a
/// connection's first SYN and two retries (1 and 3 s later).
const MIN_UNANSWERED_SYNS: u64 = 3;

/// SYNs left unanswered of `syns` with `answers` (SYN-ACKs and RSTs the
/// other way): at least [`MIN_UNANSWERED_SYNS`] and most of them (a busy
/// pair's SYN answered in the next read, or a few to closed ports, do not
/// count).
fn unanswered(syns: u64, answers: u64) -> Option<u64> {
    let left = syns.saturating_sub(answers);
    (left >= MIN_UNANSWERED_SYNS && answers * 2 < syns).then_some(left)
}

/// Inner TCP SYNs to the peer's pods (or from them) retried without a
/// SYN-ACK or RST back over the window.
fn tcp_syn_unanswered(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    let out = unanswered(d.syn_tx, d.answers_rx);
    let from = unanswered(d.syn_rx, d.answers_tx);
    if out.is_none() && from.is_none() {
        return None;
    }
    f.found(|| {
        let mut said = Vec::new();
        if out.is_some() {
            said.push(format!(
                "{} SYNs sent to its pods, {} answered",
                d.syn_tx, d.answers_rx
            ));
        }
        if from.is_some() {
            said.push(format!(
                "{} SYNs from its pods, {} answered here",
                d.syn_rx, d.answers_tx
            ));
        }
        Finding {
            evidence: BTreeMap::from([
                ("syn_sent", json!(d.syn_tx)),
                ("answers_received", json!(d.answers_rx)),
                ("syn_received", json!(d.syn_rx)),
                ("answers_sent", json!(d.answers_tx)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "TCP handshakes with pods of {peer} over {p} go unanswered in {secs} s: {} (answers: SYN-ACK or RST; a client retries at 1, 3, 7, 15, 31 s)",
                said.join("; ")
            ),
            hint: format!(
                "the SYNs or their answers are lost between the pods while other packets pass: look for bad inner checksums (`bad_checksum`, the VXLAN checksum-offload bug: `ethtool -K <tunnel device> tx-checksum-ip-generic off` on both nodes, Calico's ChecksumOffloadBroken), drops after decapsulation here or on {peer} (`dropped_after_decap`), and the destination pods' network policies"
            ),
        }
    })
}

/// The peer's handshake and reset segments with wrong inner TCP or outer
/// UDP checksums over the window (any: a checksum is right or not).
fn bad_checksum(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    if d.bad_checksum == 0 {
        return None;
    }
    f.found(|| {
        let by_reason: BTreeMap<&str, u64> = f
            .extra
            .reasons()
            .filter(|(r, _)| {
                [ClassifierDrop::BadInnerChecksum, ClassifierDrop::BadOuterChecksum]
                    .iter()
                    .any(|c| c.name() == *r)
            })
            .collect();
        Finding {
            evidence: BTreeMap::from([
                ("bad", json!(d.bad_checksum)),
                ("since_tracked", json!(by_reason)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{} {p} packets from {peer} in {secs} s carried a wrong checksum (inner TCP or outer UDP; handshakes and resets are verified): this node's stack drops them",
                d.bad_checksum
            ),
            hint: format!(
                "{peer}'s checksum offload for encapsulated packets is broken: on {peer}, `ethtool -K <tunnel device> tx-checksum-ip-generic off` (vxlan.calico, flannel.1); Calico: FelixConfiguration `featureDetectOverride: ChecksumOffloadBroken=true`; then check the NIC driver and kernel"
            ),
        }
    })
}

/// Inner TCP handshakes with the peer's pods whose MSS makes full
/// segments larger than the interface carries once encapsulated.
fn mss_exceeds_tunnel(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    if d.mss_over == 0 {
        return None;
    }
    f.found(|| Finding {
        evidence: BTreeMap::from([
            ("handshakes", json!(d.mss_over)),
            ("window_s", json!(secs)),
        ]),
        summary: format!(
            "{} TCP SYNs or SYN-ACKs with pods of {peer} over {p} in {secs} s advertised an MSS whose full segments, encapsulated, exceed this interface's MTU",
            d.mss_over
        ),
        hint: "the pods' MTU is larger than the tunnel carries and nothing clamps the MSS: clamp it on every node (`iptables -t mangle -A FORWARD -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu`), or set the pods' MTU to the tunnel device's (Calico: FelixConfiguration `vxlanMTU` / `ipipMTU`, flannel: the subnet MTU)".to_string(),
    })
}

/// A node's routes prescribe other encapsulations than the one on the wire.
fn encap_mismatch(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p) = (f.window, f.peer, f.name());
    let node = f.known.nodes.get(&peer)?;
    if node.encaps.is_empty()
        || node.encaps.contains(&f.proto)
        || d.tx + d.rx < f.thresholds.min_packets
    {
        return None;
    }
    f.found(|| {
        let prescribed: Vec<&str> = node.encaps.iter().map(|e| e.name()).collect();
        Finding {
            evidence: BTreeMap::from([
                ("on_wire", json!(f.proto.name())),
                ("routes_prescribe", json!(prescribed)),
                ("devices", json!(node.devices)),
                ("sent", json!(d.tx)),
                ("received", json!(d.rx)),
            ]),
            summary: format!(
                "{p} on the wire with {peer} ({} sent, {} received), but this node's routes to it prescribe {}",
                d.tx,
                d.rx,
                prescribed.join("/")
            ),
            hint: format!(
                "one side still runs the old encapsulation: compare the routes on both nodes (`ip route | grep {peer}`) with the pool the data plane reads (Calico: the IPPool's ipipMode/vxlanMode, not the Installation)"
            ),
        }
    })
}

/// Above the interface MTU, outer fragments, routers' "too big".
fn mtu(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p, secs) = (f.window, f.peer, f.name(), f.secs());
    if d.over_mtu + d.outer_fragment + d.path_mtu == 0 {
        return None;
    }
    f.found(|| {
        let overhead = overhead(f.proto);
        let mut evidence = BTreeMap::from([
            ("over_mtu", json!(d.over_mtu)),
            ("outer_fragments", json!(d.outer_fragment)),
            ("too_big_errors", json!(d.path_mtu)),
            ("overhead_bytes", json!(overhead)),
        ]);
        // A path MTU remembered from an earlier window says nothing of now.
        let reported = f.extra.path_mtu().filter(|_| d.path_mtu > 0);
        if let Some(mtu) = reported {
            evidence.insert("path_mtu", json!(mtu));
        }
        let fit = reported.map_or(String::new(), |mtu| {
            format!(
                " (at most {} for {p} over a {mtu}-byte path)",
                mtu.saturating_sub(overhead)
            )
        });
        Finding {
            evidence,
            summary: format!(
                "{p} with {peer}: {} above the MTU, {} outer fragments, {} routers' too-big errors in {secs} s",
                d.over_mtu, d.outer_fragment, d.path_mtu
            ),
            hint: format!(
                "the tunnel MTU plus {overhead} bytes of {p} overhead exceeds the path MTU: lower the tunnel and pod MTU{fit} or raise the underlay MTU on the path"
            ),
        }
    })
}

/// Neither a node nor allowed, when either is known: a node that knows
/// neither would call every sender unknown.
fn unknown_peer(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, peer, p) = (f.window, f.peer, f.name());
    // A BGP neighbor of this node's BIRD is a node, also while its routes
    // are not (yet) here: after a session comes back, the peer may send
    // before this node re-learns its blocks (a route_missing then).
    if d.rx == 0 || f.is_node() || f.known.bgp.iter().any(|s| s.neighbor == Some(peer)) {
        return None;
    }
    // Looked up only for sources that are no node: the sets can be large.
    let allowed = f.known.allowed(f.proto, peer);
    if allowed == Some(true) || (f.known.nodes.is_empty() && allowed.is_none()) {
        return None;
    }
    f.found(|| Finding {
        evidence: BTreeMap::from([
            ("received", json!(d.rx)),
            ("known_nodes", json!(f.known.nodes.len())),
            ("in_allow_set", json!(allowed)),
        ]),
        summary: format!(
            "{} {p} packets from {peer}, which is neither a node in this node's routes nor in {}",
            d.rx,
            if SetKind::guarding(f.proto).is_some() {
                set_names(f.proto)
            } else {
                "an allow-set".to_string()
            }
        ),
        hint: format!(
            "find out what owns {peer}: a router doing SNAT (see snat_suspected), a node missing from the routes and allow-set, or traffic that should not be here"
        ),
    })
}

/// The drop rate over the window. A shorter history, at start, is divided
/// by the whole window: it had no drops before it, and a few early drops
/// are no spike.
fn drop_spike(f: &PeerFacts<'_>) -> Option<Finding> {
    let (d, th, peer, p, secs) = (f.window, f.thresholds, f.peer, f.name(), f.secs());
    let drops = d.drops();
    let rate = drops as f64 / f.seconds.max(th.window.as_secs_f64());
    if rate <= th.drop_spike_pps {
        return None;
    }
    f.found(|| {
        let reasons: BTreeMap<&str, u64> = f.extra.reasons().collect();
        Finding {
            evidence: BTreeMap::from([
                ("drops", json!(drops)),
                ("drops_per_second", json!((rate * 10.0).round() / 10.0)),
                ("threshold_per_second", json!(th.drop_spike_pps)),
                ("reasons_since_tracked", json!(reasons)),
            ]),
            summary: format!(
                "{rate:.1} {p} drops/s for {peer} ({drops} in {secs} s; threshold {})",
                th.drop_spike_pps
            ),
            hint: format!(
                "see the drop rows for {peer}: the reasons say whether policy (allow-set, netfilter), the VNI, or the MTU drops them"
            ),
        }
    })
}

/// Outer header bytes each encapsulation adds (IPv4 underlay).
fn overhead(proto: Proto) -> u32 {
    match proto {
        Proto::Vxlan | Proto::VxlanGpe | Proto::Geneve => 50,
        Proto::Ipip => 20,
        Proto::Ip6ip => 40,
        Proto::Gre => 24,
        Proto::Wireguard => 60,
        Proto::Other => 0,
    }
}

/// How an encapsulation is recognised on the path, for hints: UDP ones by
/// the ports configured here, since a firewall or NAT exemption must match
/// those, not the defaults.
fn carrier(proto: Proto, ports: &PortConfig) -> String {
    let udp = |name: &str, list: &[u16]| {
        if list.is_empty() {
            return format!("{name} (UDP)");
        }
        let list: Vec<String> = list.iter().map(u16::to_string).collect();
        format!("{name} (UDP {})", list.join("/"))
    };
    match proto {
        Proto::Vxlan => udp("VXLAN", &ports.vxlan),
        Proto::VxlanGpe => udp("VXLAN-GPE", &ports.vxlan_gpe),
        Proto::Geneve => udp("Geneve", &ports.geneve),
        Proto::Wireguard => udp("WireGuard", &ports.wireguard),
        Proto::Ipip => "IPIP (IP protocol 4)".into(),
        Proto::Ip6ip => "IPv6-in-IP (IP protocol 41)".into(),
        Proto::Gre => "GRE (IP protocol 47)".into(),
        Proto::Other => "plain IP".into(),
    }
}

/// The Calico sets that admit `proto`, as texts name them.
fn set_names(proto: Proto) -> String {
    SetKind::guarding(proto).map_or_else(String::new, |k| k.calico_sets().join("/"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use observer_common::{ClassifierDrop, Direction, TcpCounts};

    use super::*;
    use crate::model::{
        anomalies::{
            Anomaly, Engine, Event,
            fixtures::{drive, drop, flow, ip, known, raised, tcp_flow, th},
        },
        rows::Row,
        verdicts::Verdict,
    };

    #[test]
    fn healthy_traffic_raises_nothing() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 30, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    flow("10.10.60.127", Proto::Vxlan, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                ],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
    }

    #[test]
    fn the_incident_on_the_gpu_node() {
        let mut e = Engine::new(th(), 0.0);
        let mut snat = flow("10.10.10.244", Proto::Vxlan, Direction::Rx, 0);
        snat.inner = Some((ip("10.42.168.210"), ip("10.42.182.1")));
        let events = drive(&mut e, &known(), 6, |t| {
            let n = t as u64 * 10;
            let mut snat = snat.clone();
            snat.packets = n;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    snat,
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                ],
                vec![drop(
                    "10.10.10.244",
                    Proto::Vxlan,
                    ClassifierDrop::CalicoAllowSet,
                    n,
                    4096,
                )],
            )
        });
        let mut raised = raised(&events);
        raised.sort();
        assert_eq!(
            raised,
            vec![
                (Kind::OneWay, "10.10.60.127".into()),
                (Kind::SnatSuspected, "10.10.10.244".into()),
                (Kind::AllowSetDrop, "10.10.10.244".into()),
                (Kind::UnknownPeer, "10.10.10.244".into()),
                (Kind::DropSpike, "10.10.10.244".into()),
            ]
        );
        let snat = e
            .active()
            .into_iter()
            .find(|a| a.kind == Kind::SnatSuspected)
            .unwrap()
            .clone();
        assert_eq!(snat.evidence["real_node"], json!("10.10.60.127"));
        assert_eq!(snat.evidence["inner_source"], json!("10.42.168.210"));
        assert_eq!(snat.evidence["pod_block"], json!("10.42.168.192/26"));
        let line = serde_json::to_value(&snat).unwrap();
        assert_eq!(line["since"], json!("1970-01-01T00:00:01.000Z"));
        assert_eq!(line["kind"], json!("snat_suspected"));
        assert_eq!(line["proto"], json!("vxlan"));
    }

    #[test]
    fn encap_mismatch_against_the_routes() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 3, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    // Routes to .209 say IPIP; VXLAN arrives.
                    flow("10.10.60.209", Proto::Vxlan, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                ],
                vec![],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::EncapMismatch, "10.10.60.209".into())]
        );
        let a = e.active()[0];
        assert_eq!(a.evidence["routes_prescribe"], json!(["ipip"]));
        assert_eq!(a.evidence["on_wire"], json!("vxlan"));
    }

    /// A node's pods' packets dropped by conntrack after decapsulation:
    /// `dropped_after_decap` with where and why, never `allow_set_drop`
    /// (the NETFILTER_DROP is not the allow-set's rule).
    #[test]
    fn drops_after_decapsulation_name_device_function_and_cause() {
        use crate::model::rows::{DropId, DropRow, Origin, Stage, testing};
        let after = |packets: u64| {
            let id = DropId {
                stage: Stage::Tunnel,
                vni: 0,
                ifindex: 9,
                location: 0xffff_ffff_8100_0000,
                ..testing::drop_id("10.10.60.127", Origin::Kernel, 12)
            };
            DropRow {
                place: Some("on vxlan.calico at nf_hook_slow, from its pods".into()),
                ..testing::drop_row(id, packets, "NETFILTER_DROP")
            }
        };
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 3, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    flow("10.10.60.127", Proto::Vxlan, Direction::Rx, n),
                ],
                vec![after(t as u64 * 3)],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::DroppedAfterDecap, "10.10.60.127".into())]
        );
        let a = e.active()[0];
        assert_eq!(a.evidence["dropped"], json!(9));
        assert_eq!(
            a.evidence["since_tracked"],
            json!(["NETFILTER_DROP 9 on vxlan.calico at nf_hook_slow, from its pods"])
        );
        assert!(
            a.summary
                .contains("dropped by this node after decapsulation"),
            "{}",
            a.summary
        );
        assert!(a.hint.contains("conntrack INVALID"), "{}", a.hint);
        // Below min_packets over the window: nothing.
        let mut quiet = Engine::new(th(), 0.0);
        let events = drive(&mut quiet, &known(), 3, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    flow("10.10.60.127", Proto::Vxlan, Direction::Rx, n),
                ],
                vec![after(t as u64)],
            )
        });
        assert_eq!(raised(&events), vec![]);
    }

    #[test]
    fn mtu_from_fragments_and_too_big_errors() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 2, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                ],
                vec![
                    drop(
                        "10.10.60.209",
                        Proto::Ipip,
                        ClassifierDrop::PathMtu,
                        2,
                        1400,
                    ),
                    drop(
                        "10.10.60.209",
                        Proto::Ipip,
                        ClassifierDrop::OuterFragment,
                        t as u64,
                        0,
                    ),
                ],
            )
        });
        assert_eq!(raised(&events), vec![(Kind::Mtu, "10.10.60.209".into())]);
        let a = e.active()[0];
        assert_eq!(a.evidence["path_mtu"], json!(1400));
        assert_eq!(a.evidence["too_big_errors"], json!(2));
        assert_eq!(a.evidence["outer_fragments"], json!(2));
        assert!(a.hint.contains("at most 1380 for IPIP"), "{}", a.hint);
    }

    #[test]
    fn allowed_unknown_sources_and_nothing_known() {
        // In the allow-set but not routed to: not unknown.
        let mut k = known();
        k.allow
            .as_mut()
            .unwrap()
            .vxlan
            .prefixes
            .insert("10.10.99.0/24".parse().unwrap());
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &k, 3, |t| {
            (
                vec![flow("10.10.99.5", Proto::Vxlan, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
        // A node without routes or allow-sets knows nothing: no unknown_peer.
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &Known::default(), 3, |t| {
            (
                vec![flow("10.10.99.5", Proto::Vxlan, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
        // A BGP neighbor of this node's BIRD whose blocks are not routed
        // here (yet): a node, not unknown.
        let mut k = known();
        k.bgp = vec![crate::model::bgp::testing::session(
            "10.10.99.5",
            "Established",
        )];
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &k, 7, |t| {
            (
                vec![flow("10.10.99.5", Proto::Ipip, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
        // The same without the session: unknown.
        k.bgp.clear();
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &k, 7, |t| {
            (
                vec![flow("10.10.99.5", Proto::Ipip, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Raised(a) if a.kind == Kind::UnknownPeer)),
            "{events:?}"
        );
    }

    /// The one-way VXLAN anomaly raised after a whole window of sending
    /// to .127 without replies, as `known` words it.
    fn one_way_to_127(known: &Known) -> Anomaly {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, known, 5, |t| {
            (
                vec![flow(
                    "10.10.60.127",
                    Proto::Vxlan,
                    Direction::Tx,
                    t as u64 * 10,
                )],
                vec![],
            )
        });
        match events.as_slice() {
            [Event::Raised(a)] if a.kind == Kind::OneWay => a.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hints_name_the_default_ports_unless_configured() {
        let default = one_way_to_127(&known());
        assert!(
            default.hint.contains("drops VXLAN (UDP 4789/8472) in"),
            "{}",
            default.hint
        );
        let configured = Known {
            ports: PortConfig {
                vxlan: vec![4790],
                vxlan_gpe: vec![4791],
                ..PortConfig::default()
            },
            ..known()
        };
        let a = one_way_to_127(&configured);
        assert!(a.hint.contains("drops VXLAN (UDP 4790) in"), "{}", a.hint);
        assert!(!a.hint.contains("4789"), "{}", a.hint);
    }

    #[test]
    fn carriers_name_every_configured_udp_port() {
        let ports = PortConfig {
            geneve: vec![6081, 16081],
            wireguard: vec![],
            ..PortConfig::default()
        };
        assert_eq!(carrier(Proto::Geneve, &ports), "Geneve (UDP 6081/16081)");
        assert_eq!(carrier(Proto::VxlanGpe, &ports), "VXLAN-GPE (UDP 4790)");
        assert_eq!(carrier(Proto::Wireguard, &ports), "WireGuard (UDP)");
        assert_eq!(carrier(Proto::Ipip, &ports), "IPIP (IP protocol 4)");
    }

    #[test]
    fn a_silent_local_bird_is_named_in_the_hints_not_the_peer() {
        use crate::model::bgp::testing::session;
        let gone = BgpSession {
            last_error: Some("BIRD's control socket is gone".into()),
            ..session("10.0.0.2", UNKNOWN)
        };
        let down = bgp_down(&gone, 6.0).unwrap();
        assert!(
            down.hint
                .starts_with("this node's own BIRD does not answer"),
            "{}",
            down.hint
        );
        assert!(
            down.hint.contains("control socket is gone"),
            "{}",
            down.hint
        );
        let peer_down = bgp_down(&session("10.0.0.2", "Active"), 6.0).unwrap();
        assert!(
            peer_down.hint.starts_with("check BIRD on 10.0.0.2"),
            "{}",
            peer_down.hint
        );

        let missing = MissingBlock {
            block: "10.65.2.0/26".parse().unwrap(),
            node: ip("10.0.0.2"),
            since: 0.0,
            last_route: crate::model::dataplane::BlockRoute {
                block: "10.65.2.0/26".parse().unwrap(),
                origin: 12,
                blackhole: false,
                next_hops: Vec::new(),
            },
        };
        let finding = route_missing(ip("10.0.0.2"), &[&missing], 6.0, Some(&gone));
        assert!(
            finding.hint.starts_with("this node's own BIRD"),
            "{}",
            finding.hint
        );
        let finding = route_missing(ip("10.0.0.2"), &[&missing], 6.0, None);
        assert!(finding.hint.contains("import filter"), "{}", finding.hint);
    }

    #[test]
    fn every_kind_is_judged_in_listing_order() {
        // Two tunnels that trip every rule between them: .244 is no node
        // yet speaks for .127's pods; .127 gets no replies and its routes
        // say IPIP. Both are dropped by the allow-set and send too big.
        let mut k = known();
        k.nodes.get_mut(&ip("10.10.60.127")).unwrap().encaps = BTreeSet::from([Proto::Ipip]);
        let d = Totals {
            tx: 10,
            rx: 10,
            allow_set: 40,
            classifier_drops: 41,
            over_mtu: 1,
            ..Totals::default()
        };
        let mut extra = Extra::default();
        extra.inner_src = Some(ip("10.42.168.210"));
        let kinds = |peer: &str, d: &Totals| -> Vec<Kind> {
            let facts = PeerFacts {
                thresholds: &th(),
                peer: ip(peer),
                proto: Proto::Vxlan,
                window: d,
                seconds: 5.0,
                full_window: true,
                extra: &extra,
                known: &k,
                describe: false,
            };
            let holding: Vec<Kind> = holding(&facts).collect();
            // Described, the same rules hold, each with its texts.
            let described = PeerFacts {
                describe: true,
                ..facts
            };
            let written: Vec<Kind> = Kind::ALL
                .into_iter()
                .filter(|&kind| {
                    finding(kind, &described).is_some_and(|f| {
                        assert!(!f.summary.is_empty() && !f.hint.is_empty());
                        assert!(!f.evidence.is_empty());
                        true
                    })
                })
                .collect();
            assert_eq!(holding, written);
            holding
        };
        assert_eq!(
            kinds("10.10.10.244", &d),
            vec![
                Kind::SnatSuspected,
                Kind::AllowSetDrop,
                Kind::Mtu,
                Kind::UnknownPeer,
                Kind::DropSpike,
            ]
        );
        let one_way = Totals { rx: 0, ..d };
        assert_eq!(
            kinds("10.10.60.127", &one_way),
            vec![
                Kind::OneWay,
                Kind::AllowSetDrop,
                Kind::EncapMismatch,
                Kind::Mtu,
                Kind::DropSpike,
            ]
        );
    }

    /// SYNs sent to a peer's pods, one a second.
    fn syns(t: u32, answered: u64) -> Vec<Row> {
        let n = t as u64;
        vec![
            tcp_flow(
                "10.10.60.127",
                Direction::Tx,
                n * 10,
                TcpCounts {
                    syn: n,
                    ..TcpCounts::NONE
                },
            ),
            tcp_flow(
                "10.10.60.127",
                Direction::Rx,
                n * 10,
                TcpCounts {
                    syn_ack: answered.min(n),
                    ..TcpCounts::NONE
                },
            ),
        ]
    }

    #[test]
    fn syns_retried_without_answers_raise_tcp_syn_unanswered_on_the_third() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 2, |t| (syns(t, 0), vec![]));
        assert_eq!(raised(&events), vec![], "two unanswered SYNs are not yet");
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 3, |t| (syns(t, 0), vec![]));
        assert_eq!(
            raised(&events),
            vec![(Kind::TcpSynUnanswered, "10.10.60.127".into())]
        );
        let a = e.active()[0];
        assert_eq!(
            (
                a.evidence["syn_sent"].clone(),
                a.evidence["answers_received"].clone()
            ),
            (json!(3), json!(0))
        );
        assert!(
            a.summary.contains("3 SYNs sent to its pods, 0 answered"),
            "{}",
            a.summary
        );
        assert!(a.hint.contains("tx-checksum-ip-generic off"), "{}", a.hint);
        // Answered, or mostly answered: nothing.
        for answered in [u64::MAX, 2] {
            let mut e = Engine::new(th(), 0.0);
            let events = drive(&mut e, &known(), 4, |t| (syns(t, answered), vec![]));
            assert_eq!(raised(&events), vec![], "answered {answered}");
        }
    }

    #[test]
    fn an_oversized_mss_raises_mss_exceeds_tunnel_and_clears_a_window_later() {
        let mut e = Engine::new(th(), 0.0);
        // One SYN with a too large MSS at t = 1, then only data.
        let events = drive(&mut e, &known(), 9, |t| {
            let over = TcpCounts {
                syn: 1,
                mss_over: 1,
                ..TcpCounts::NONE
            };
            (
                vec![
                    tcp_flow("10.10.60.127", Direction::Tx, t as u64 * 10, over),
                    flow("10.10.60.127", Proto::Vxlan, Direction::Rx, t as u64 * 10),
                ],
                vec![],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::MssExceedsTunnel, "10.10.60.127".into())]
        );
        let cleared = events.iter().any(|e| {
            matches!(e, Event::Cleared { anomaly, .. } if anomaly.kind == Kind::MssExceedsTunnel)
        });
        assert!(cleared, "{events:?}");
        assert_eq!(Verdict::of(Kind::MssExceedsTunnel), Verdict::Mtu);
    }

    #[test]
    fn wrong_checksums_raise_bad_checksum_and_zero_ones_are_no_drop() {
        let rows = |t: u32| {
            vec![
                flow("10.10.60.127", Proto::Vxlan, Direction::Tx, t as u64 * 10),
                flow("10.10.60.127", Proto::Vxlan, Direction::Rx, t as u64 * 10),
            ]
        };
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 2, |t| {
            (
                rows(t),
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::BadInnerChecksum,
                    t as u64,
                    4096,
                )],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::BadChecksum, "10.10.60.127".into())]
        );
        let a = e.active()[0];
        assert_eq!(a.evidence["bad"], json!(2));
        assert!(a.hint.contains("ChecksumOffloadBroken"), "{}", a.hint);
        // Zero outer checksums, many of them: legal, nothing raised (no
        // drop spike either).
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 4, |t| {
            (
                rows(t),
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::ZeroUdpChecksum,
                    t as u64 * 100,
                    4096,
                )],
            )
        });
        assert_eq!(raised(&events), vec![]);
    }
}
