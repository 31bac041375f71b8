//! What the model knows of the node: the plain data `node` reads into
//! (allow-sets, the peers the data plane expects) and the pure helpers the
//! anomaly rules use on it. `node` fills these; nothing here does I/O.

use std::{
    collections::{BTreeSet, HashSet},
    net::IpAddr,
};

use ipnet::IpNet;
use observer_common::Proto;
use serde::{Serialize, Serializer};

/// Which encapsulation an allow-set guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// VXLAN sources (Calico: cali40all-vxlan-net / cali60all-vxlan-net).
    Vxlan,
    /// IPIP sources (Calico: cali40all-hosts-net).
    Ipip,
}

impl SetKind {
    /// Both kinds.
    pub const ALL: [SetKind; 2] = [SetKind::Vxlan, SetKind::Ipip];

    /// Name used in output and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SetKind::Vxlan => "vxlan",
            SetKind::Ipip => "ipip",
        }
    }

    /// The kind of set that guards `proto` (VXLAN, IPIP and IPv6-in-IPv4
    /// packets); `None` for encapsulations no allow-set guards.
    pub fn guarding(proto: Proto) -> Option<SetKind> {
        match proto {
            Proto::Vxlan => Some(SetKind::Vxlan),
            Proto::Ipip | Proto::Ip6ip => Some(SetKind::Ipip),
            _ => None,
        }
    }

    /// Calico's set names for this kind.
    pub fn calico_sets(self) -> &'static [&'static str] {
        match self {
            SetKind::Vxlan => &["cali40all-vxlan-net", "cali60all-vxlan-net"],
            SetKind::Ipip => &["cali40all-hosts-net"],
        }
    }
}

/// The members found for one kind, and where they came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowSet {
    /// Prefixes, normalised (host bits cleared), sorted, deduplicated.
    pub prefixes: BTreeSet<IpNet>,
    /// Where they were found.
    pub sources: Vec<SetSource>,
    /// An IPv4 set was found: IPv4 sources are checked (an empty but
    /// existing set means "nobody is allowed").
    pub ipv4: bool,
    /// An IPv6 set was found: IPv6 sources are checked.
    pub ipv6: bool,
}

impl AllowSet {
    /// True when any source was found.
    pub fn active(&self) -> bool {
        !self.sources.is_empty()
    }

    /// How messages name the sources: each set by its own name, prefixes
    /// given on the command line as `--allow-cidr`.
    pub fn set_names(&self) -> Vec<&str> {
        self.sources.iter().map(SetSource::short_name).collect()
    }

    /// Whether the set lets `addr` send: `None` when it does not check
    /// `addr`'s family (see [`AllowSet::lookup`] for many tests).
    pub fn allows(&self, addr: IpAddr) -> Option<bool> {
        let max_len = if addr.is_ipv4() { 32 } else { 128 };
        checks_family(self.ipv4, self.ipv6, addr)
            .then(|| held(addr, 0..=max_len, |net| self.prefixes.contains(net)))
    }

    /// The set indexed for membership tests, as the programs' LPM tries
    /// answer them.
    pub fn lookup(&self) -> AllowLookup {
        let lengths = |v4: bool| -> Vec<u8> {
            let lengths: BTreeSet<u8> = self
                .prefixes
                .iter()
                .filter(|p| matches!(p, IpNet::V4(_)) == v4)
                .map(IpNet::prefix_len)
                .collect();
            lengths.into_iter().collect()
        };
        AllowLookup {
            prefixes: self.prefixes.iter().copied().collect(),
            v4_lengths: lengths(true),
            v6_lengths: lengths(false),
            ipv4: self.ipv4,
            ipv6: self.ipv6,
        }
    }

    /// Adds the members of one set found at `source`; `family` (when its
    /// definition says) makes that family checked even when it is empty.
    pub fn add(
        &mut self,
        source: SetSource,
        family: Option<Family>,
        prefixes: impl IntoIterator<Item = IpNet>,
    ) {
        let prefixes: Vec<IpNet> = prefixes.into_iter().collect();
        let has_v4 = prefixes.iter().any(|p| matches!(p, IpNet::V4(_)));
        let has_v6 = prefixes.iter().any(|p| matches!(p, IpNet::V6(_)));
        self.ipv4 |= family == Some(Family::V4) || has_v4;
        self.ipv6 |= family == Some(Family::V6) || has_v6;
        self.prefixes.extend(prefixes);
        if !self.sources.contains(&source) {
            self.sources.push(source);
        }
    }
}

/// An [`AllowSet`] indexed by prefix length: a membership test is one
/// hash lookup per distinct length of the address's family (Calico's sets
/// hold /32 and /128 node addresses: one length).
#[derive(Debug, Clone, Default)]
pub struct AllowLookup {
    prefixes: HashSet<IpNet>,
    v4_lengths: Vec<u8>,
    v6_lengths: Vec<u8>,
    ipv4: bool,
    ipv6: bool,
}

impl AllowLookup {
    /// Whether the set checks `addr`'s family and holds no prefix
    /// containing it (the `calico_allow_set` drop reason).
    pub fn refuses(&self, addr: IpAddr) -> bool {
        let lengths = match addr {
            IpAddr::V4(_) => &self.v4_lengths,
            IpAddr::V6(_) => &self.v6_lengths,
        };
        checks_family(self.ipv4, self.ipv6, addr)
            && !held(addr, lengths.iter().copied(), |net| {
                self.prefixes.contains(net)
            })
    }
}

/// Whether a set with those families found checks sources like `addr`:
/// a family without a set is not checked (as in the programs).
fn checks_family(ipv4: bool, ipv6: bool, addr: IpAddr) -> bool {
    if addr.is_ipv4() { ipv4 } else { ipv6 }
}

/// Whether a prefix of one of `lengths` that `contains` knows holds
/// `addr`: one set lookup per prefix length rather than a scan of every
/// prefix (sets hold one entry per node, possibly thousands).
fn held(
    addr: IpAddr,
    lengths: impl IntoIterator<Item = u8>,
    contains: impl Fn(&IpNet) -> bool,
) -> bool {
    lengths
        .into_iter()
        .any(|len| IpNet::new(addr, len).is_ok_and(|net| contains(&net.trunc())))
}

/// Where allow-set members were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetSource {
    /// An ipset of that name.
    Ipset(String),
    /// An nftables set.
    Nft {
        /// Table family (`ip`, `ip6`, `inet`).
        family: String,
        /// Table name.
        table: String,
        /// Set name.
        name: String,
    },
    /// Prefixes given with `--allow-cidr`.
    AllowCidr,
}

impl SetSource {
    /// The set's own name; `--allow-cidr` for prefixes given so.
    pub fn short_name(&self) -> &str {
        match self {
            SetSource::Ipset(name) | SetSource::Nft { name, .. } => name,
            SetSource::AllowCidr => "--allow-cidr",
        }
    }
}

/// As printed in `allow_set` lines: `ipset NAME`, `nft FAMILY TABLE NAME`,
/// `--allow-cidr`.
impl std::fmt::Display for SetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetSource::Ipset(name) => write!(f, "ipset {name}"),
            SetSource::Nft {
                family,
                table,
                name,
            } => write!(f, "nft {family} {table} {name}"),
            SetSource::AllowCidr => f.write_str("--allow-cidr"),
        }
    }
}

/// Address family of a set, when its definition says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (`family inet`, `ipv4_addr`).
    V4,
    /// IPv6 (`family inet6`, `ipv6_addr`).
    V6,
}

/// One read of all allow-sets, plus what could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowSets {
    /// VXLAN allow-set.
    pub vxlan: AllowSet,
    /// IPIP allow-set.
    pub ipip: AllowSet,
    /// Problems worth telling the user (tool missing, set unreadable).
    pub problems: Vec<String>,
    /// Kinds whose read failed part-way (a tool timed out or failed): their
    /// sets here may lack members, so the previous read stands for them.
    pub incomplete: Vec<SetKind>,
}

impl AllowSets {
    /// For each kind whose read failed part-way, `previous`'s set instead.
    pub fn keep_incomplete_from(&mut self, previous: &AllowSets) {
        for kind in self.incomplete.clone() {
            *self.get_mut(kind) = previous.get(kind).clone();
        }
    }

    /// Switches off the check of each kind whose set holds more prefixes
    /// of one family than the programs' tries take (`max`): part of a set
    /// would flag allowed sources as drops, so none of it is checked, and
    /// a problem says why.
    pub fn refuse_oversized(&mut self, max: usize) {
        for kind in SetKind::ALL {
            let set = self.get(kind);
            let v4 = set
                .prefixes
                .iter()
                .filter(|p| matches!(p, IpNet::V4(_)))
                .count();
            let largest = v4.max(set.prefixes.len() - v4);
            if largest <= max {
                continue;
            }
            // No count in the text: problems are told once per text, and
            // the count moves with every read of a churning set.
            self.problems.push(format!(
                "the {} allow-set ({}) holds more than {max} prefixes of one family, more than \
                 the observer's programs hold: its check is off, sources are not judged against it",
                kind.name(),
                set.set_names().join(", ")
            ));
            *self.get_mut(kind) = AllowSet::default();
        }
    }

    /// The set of `kind`.
    pub fn get(&self, kind: SetKind) -> &AllowSet {
        match kind {
            SetKind::Vxlan => &self.vxlan,
            SetKind::Ipip => &self.ipip,
        }
    }

    pub fn get_mut(&mut self, kind: SetKind) -> &mut AllowSet {
        match kind {
            SetKind::Vxlan => &mut self.vxlan,
            SetKind::Ipip => &mut self.ipip,
        }
    }
}

/// What this node expects to exchange with one peer node.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ExpectedPeer {
    /// Pod blocks routed to the peer, sorted.
    pub blocks: Vec<IpNet>,
    /// Encapsulations used towards it.
    #[serde(serialize_with = "proto_names")]
    pub encaps: BTreeSet<Proto>,
    /// Tunnel devices leading to it, sorted.
    pub devices: Vec<String>,
    /// Smallest route MTU metric among its routes, when any is set.
    pub route_mtu: Option<u32>,
}

/// Serializes a [`Proto`] as its name (`"vxlan"`); observer-common has no serde.
pub fn proto_name<S: Serializer>(proto: &Proto, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(proto.name())
}

pub fn proto_names<S: Serializer>(
    protos: &BTreeSet<Proto>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(protos.iter().map(|p| p.name()))
}

/// The item of the longest prefix that contains `addr` (the first one
/// among equally long prefixes).
pub fn longest_prefix<T>(items: impl IntoIterator<Item = (IpNet, T)>, addr: IpAddr) -> Option<T> {
    let mut best: Option<(u8, T)> = None;
    for (net, item) in items {
        if net.contains(&addr) && best.as_ref().is_none_or(|(len, _)| net.prefix_len() > *len) {
            best = Some((net.prefix_len(), item));
        }
    }
    best.map(|(_, item)| item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_larger_than_the_tries_is_not_checked_at_all() {
        let mut sets = AllowSets::default();
        let many = (0..5u8).map(|i| IpNet::from(IpAddr::from([10, 0, 0, i])));
        sets.vxlan
            .add(SetSource::Ipset("cali40all-vxlan-net".into()), None, many);
        let v6 = (0..3u16).map(|i| IpNet::from(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i])));
        sets.ipip.add(
            SetSource::AllowCidr,
            None,
            v6.chain([IpNet::from(IpAddr::from([10, 9, 9, 9]))]),
        );
        let before_ipip = sets.ipip.clone();
        sets.refuse_oversized(4);
        assert_eq!(sets.vxlan, AllowSet::default(), "5 IPv4 prefixes > 4: off");
        assert!(!sets.vxlan.active() && sets.vxlan.allows(IpAddr::from([1, 2, 3, 4])).is_none());
        assert_eq!(sets.ipip, before_ipip, "3 of each family at most: kept");
        assert_eq!(
            sets.problems,
            vec![
                "the vxlan allow-set (cali40all-vxlan-net) holds more than 4 prefixes of one family, \
                 more than the observer's programs hold: its check is off, sources are not judged \
                 against it"
                    .to_string()
            ]
        );
    }

    #[test]
    fn an_incomplete_read_keeps_the_previous_set_of_its_kind() {
        let with = |prefix: &str| {
            let mut set = AllowSet::default();
            set.add(
                SetSource::Ipset("cali40all-vxlan-net".into()),
                Some(Family::V4),
                [prefix.parse().unwrap()],
            );
            set
        };
        let previous = AllowSets {
            vxlan: with("10.0.0.1/32"),
            ipip: with("10.0.0.2/32"),
            ..AllowSets::default()
        };
        // ipset timed out for the VXLAN set: it came back empty.
        let mut read = AllowSets {
            ipip: with("10.0.0.3/32"),
            incomplete: vec![SetKind::Vxlan],
            ..AllowSets::default()
        };
        read.keep_incomplete_from(&previous);
        assert_eq!(read.vxlan, previous.vxlan);
        assert_eq!(read.ipip, with("10.0.0.3/32"));
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn lookup_answers_like_the_tries() {
        let mut set = AllowSet::default();
        set.add(
            SetSource::AllowCidr,
            None,
            [net("10.0.0.7/32"), net("10.1.0.0/16"), net("fd00::/64")],
        );
        let lookup = set.lookup();
        assert!(!lookup.refuses(ip("10.0.0.7")));
        assert!(lookup.refuses(ip("10.0.0.8")));
        assert!(!lookup.refuses(ip("10.1.255.9")));
        assert!(!lookup.refuses(ip("fd00::1")));
        assert!(lookup.refuses(ip("fd01::1")));
        // A family with no set found is not checked; an empty set that
        // exists refuses everyone.
        let mut v4_only = AllowSet::default();
        v4_only.add(SetSource::Ipset("s".into()), Some(Family::V4), []);
        let lookup = v4_only.lookup();
        assert!(lookup.refuses(ip("10.0.0.7")));
        assert!(!lookup.refuses(ip("fd00::1")));
        assert!(!AllowSet::default().lookup().refuses(ip("10.0.0.7")));
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn longest_prefix_wins() {
        let items = [
            (net("10.42.0.0/16"), "wide"),
            (net("10.42.1.0/26"), "block"),
            (net("10.42.1.0/26"), "second"),
            (net("fd42::/64"), "v6"),
        ];
        assert_eq!(longest_prefix(items, ip("10.42.1.5")), Some("block"));
        assert_eq!(longest_prefix(items, ip("10.42.1.64")), Some("wide"));
        assert_eq!(longest_prefix(items, ip("fd42::7")), Some("v6"));
        assert_eq!(longest_prefix(items, ip("10.43.0.1")), None);
        // An IPv4 address never matches an IPv6 prefix and vice versa.
        assert_eq!(longest_prefix([(net("::/0"), 1)], ip("10.0.0.1")), None);
        assert_eq!(
            longest_prefix([(net("0.0.0.0/0"), 1)], ip("10.0.0.1")),
            Some(1)
        );
    }
}
