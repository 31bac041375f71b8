//! Mirrors the allow-sets that decide which sources may send tunnel
//! traffic to this node (Calico's `cali40all-vxlan-net`,
//! `cali60all-vxlan-net`, `cali40all-hosts-net`, or sets and CIDRs given on
//! the command line), read from ipset (iptables data plane) and nftables
//! (nft data plane). The tools' own output is parsed because neither ipset
//! nor nftables has a maintained Rust crate that reads sets; parsers are
//! unit-tested against real output.

use std::{fmt, str::FromStr};

use anyhow::{Result, anyhow, bail};
use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};
use serde::Deserialize;

use crate::node::tools::{self, ToolError};

use crate::model::facts::{AllowSets, Family, SetKind, SetSource};

/// `[PROTO=]VALUE` as given to `--allow-set` / `--allow-cidr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged<T> {
    /// The encapsulation (default vxlan).
    pub kind: SetKind,
    /// The set name or CIDR.
    pub value: T,
}

impl<T: FromStr> FromStr for Tagged<T>
where
    T::Err: fmt::Display,
{
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (kind, value) = match text.split_once('=') {
            Some(("vxlan", v)) => (SetKind::Vxlan, v),
            Some(("ipip", v)) => (SetKind::Ipip, v),
            Some((other, _)) => {
                return Err(format!(
                    "unknown protocol {other:?}: use vxlan=... or ipip=..."
                ));
            }
            None => (SetKind::Vxlan, text),
        };
        let value = value.parse::<T>().map_err(|e| format!("{value:?}: {e}"))?;
        Ok(Tagged { kind, value })
    }
}

/// What to mirror.
#[derive(Debug, Clone, Default)]
pub struct AllowSetConfig {
    /// Extra set names (ipset or nft) per kind, beside Calico's.
    pub sets: Vec<Tagged<String>>,
    /// Fixed prefixes per kind.
    pub cidrs: Vec<Tagged<IpNet>>,
    /// Why this node's sets (ipset, nftables) are not read, if they are
    /// not: the reason is reported as a problem and only `cidrs` count.
    pub skip_node_sets: Option<String>,
}

/// Reads every configured set from ipset and nftables in the current
/// network namespace. Never fails: what cannot be read is reported in
/// `problems` and the rest still counts.
pub fn read(config: &AllowSetConfig) -> AllowSets {
    let mut snapshot = AllowSets::default();
    if let Some(why) = &config.skip_node_sets {
        snapshot.problems.push(why.clone());
        add_cidrs(config, &mut snapshot);
        return snapshot;
    }
    let wanted: Vec<(SetKind, Vec<&str>)> = SetKind::ALL
        .into_iter()
        .map(|kind| {
            let names = kind
                .calico_sets()
                .iter()
                .copied()
                .chain(
                    config
                        .sets
                        .iter()
                        .filter(|s| s.kind == kind)
                        .map(|s| s.value.as_str()),
                )
                .collect();
            (kind, names)
        })
        .collect();
    let all_names: Vec<&str> = wanted.iter().flat_map(|(_, n)| n.iter().copied()).collect();
    let nft = read_nft_sets(&all_names, &mut snapshot.problems);
    let mut ipset_missing = false;
    for (kind, names) in wanted {
        for name in names {
            if !ipset_missing {
                match tools::output("ipset", &["save", name], "its allow-sets") {
                    Ok(text) => {
                        let (family, prefixes) = parse_ipset_save(&text);
                        snapshot.get_mut(kind).add(
                            SetSource::Ipset(name.to_string()),
                            family,
                            prefixes,
                        );
                    }
                    Err(e @ ToolError::NotInstalled { .. }) => {
                        snapshot.problems.push(e.to_string());
                        ipset_missing = true;
                    }
                    // ipset says so only in words: "The set with the given
                    // name does not exist". Then it may be an nft set.
                    Err(ToolError::Failed { stderr, .. }) if stderr.contains("does not exist") => {}
                    // Timed out or failed otherwise: the set may exist.
                    Err(e) => {
                        snapshot.problems.push(e.to_string());
                        mark_incomplete(&mut snapshot, kind);
                    }
                }
            }
            if nft.listing_failed || nft.failed.iter().any(|n| n == name) {
                mark_incomplete(&mut snapshot, kind);
            }
            for set in nft.sets.iter().filter(|s| s.name == name) {
                snapshot.get_mut(kind).add(
                    SetSource::Nft {
                        family: set.family.clone(),
                        table: set.table.clone(),
                        name: set.name.clone(),
                    },
                    set.addr_family,
                    set.prefixes.iter().copied(),
                );
            }
        }
    }
    add_cidrs(config, &mut snapshot);
    snapshot.refuse_oversized(observer_common::ALLOW_SET_MAX_PREFIXES as usize);
    snapshot
}

/// Adds the `--allow-cidr` prefixes to their kinds' sets.
fn add_cidrs(config: &AllowSetConfig, snapshot: &mut AllowSets) {
    for cidr in &config.cidrs {
        snapshot
            .get_mut(cidr.kind)
            .add(SetSource::AllowCidr, None, [cidr.value.trunc()]);
    }
}

fn mark_incomplete(snapshot: &mut AllowSets, kind: SetKind) {
    if !snapshot.incomplete.contains(&kind) {
        snapshot.incomplete.push(kind);
    }
}

/// The wanted nftables sets as read, and what could not be read.
#[derive(Default)]
struct NftRead {
    sets: Vec<NftSet>,
    /// Names whose own listing failed.
    failed: Vec<String>,
    /// The listing of all sets failed (other than nft missing): any wanted
    /// set may exist.
    listing_failed: bool,
}

/// The nftables sets named in `names`, with their elements. The sets are
/// found by a terse listing (no elements), then each is listed on its own:
/// a node's other sets (Calico writes thousands of elements into its
/// policy sets) are never read.
fn read_nft_sets(names: &[&str], problems: &mut Vec<String>) -> NftRead {
    let mut read = NftRead::default();
    let listed = match tools::output("nft", &["-j", "-t", "list", "sets"], "its allow-sets") {
        Ok(json) => match parse_nft_sets(&json) {
            Ok(sets) => sets,
            Err(e) => {
                problems.push(format!("cannot parse `nft -j -t list sets`: {e}"));
                read.listing_failed = true;
                return read;
            }
        },
        Err(e) => {
            read.listing_failed = !matches!(e, ToolError::NotInstalled { .. });
            problems.push(e.to_string());
            return read;
        }
    };
    for set in listed.iter().filter(|s| names.contains(&s.name.as_str())) {
        let args = ["-j", "list", "set", &set.family, &set.table, &set.name];
        let problem = match tools::output("nft", &args, "its allow-sets") {
            Ok(json) => match parse_nft_sets(&json) {
                Ok(found) => {
                    read.sets.extend(found);
                    continue;
                }
                Err(e) => format!("cannot parse `nft {}`: {e}", args.join(" ")),
            },
            Err(e) => e.to_string(),
        };
        problems.push(problem);
        read.failed.push(set.name.clone());
    }
    read
}

/// The names looked for, for the "no set found" message.
pub fn looked_for(config: &AllowSetConfig, kind: SetKind) -> Vec<String> {
    kind.calico_sets()
        .iter()
        .map(|s| s.to_string())
        .chain(
            config
                .sets
                .iter()
                .filter(|s| s.kind == kind)
                .map(|s| s.value.clone()),
        )
        .collect()
}

/// Family and members of `ipset save` output: `create NAME hash:net
/// family inet ...`, then `add NAME 10.0.0.1`, `add NAME 10.0.0.0/24`,
/// `add NAME 10.0.0.1-10.0.0.5`; `nomatch` entries (exceptions inside a
/// hash:net set) are skipped.
pub fn parse_ipset_save(text: &str) -> (Option<Family>, Vec<IpNet>) {
    let mut prefixes = Vec::new();
    let mut family = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("add") => {}
            Some("create") => {
                let words: Vec<&str> = words.collect();
                family = match words.windows(2).find(|w| w[0] == "family").map(|w| w[1]) {
                    Some("inet6") => Some(Family::V6),
                    _ => Some(Family::V4),
                };
                continue;
            }
            _ => continue,
        }
        let (Some(_set), Some(member)) = (words.next(), words.next()) else {
            continue;
        };
        if words.any(|w| w == "nomatch") {
            continue;
        }
        prefixes.extend(parse_member(member));
    }
    (family, prefixes)
}

/// An address, a CIDR or an `a-b` range, as prefixes.
fn parse_member(member: &str) -> Vec<IpNet> {
    if let Some((start, end)) = member.split_once('-') {
        return range(start, end).unwrap_or_default();
    }
    if let Ok(net) = member.parse::<IpNet>() {
        return vec![net.trunc()];
    }
    match member.parse::<std::net::IpAddr>() {
        Ok(addr) => vec![IpNet::from(addr)],
        Err(_) => Vec::new(),
    }
}

fn range(start: &str, end: &str) -> Option<Vec<IpNet>> {
    match (start.parse().ok()?, end.parse().ok()?) {
        (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => {
            Some(Ipv4Subnets::new(a, b, 0).map(IpNet::V4).collect())
        }
        (std::net::IpAddr::V6(a), std::net::IpAddr::V6(b)) => {
            Some(Ipv6Subnets::new(a, b, 0).map(IpNet::V6).collect())
        }
        _ => None,
    }
}

/// One nftables set with its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    /// Address family (`ip`, `ip6`, `inet`).
    pub family: String,
    /// Table name (`calico` for Calico's nft data plane).
    pub table: String,
    /// Set name.
    pub name: String,
    /// Element type (`ipv4_addr` / `ipv6_addr`), when an address type.
    pub addr_family: Option<Family>,
    /// Members as prefixes.
    pub prefixes: Vec<IpNet>,
}

#[derive(Deserialize)]
pub(crate) struct NftDoc {
    pub(crate) nftables: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct NftSetJson {
    family: String,
    table: String,
    name: String,
    #[serde(default, rename = "type")]
    elem_type: serde_json::Value,
    #[serde(default)]
    elem: Vec<serde_json::Value>,
}

/// Sets in `nft -j list set(s)` output. Elements are strings (addresses),
/// `{"prefix": {"addr", "len"}}` or `{"range": [a, b]}`; others (set
/// elements with timeouts wrap them in `{"elem": {"val": ...}}`) are unwrapped.
pub fn parse_nft_sets(json: &str) -> Result<Vec<NftSet>> {
    let doc: NftDoc = serde_json::from_str(json)?;
    let mut sets = Vec::new();
    for item in doc.nftables {
        let Some(set) = item.get("set") else { continue };
        let set: NftSetJson = serde_json::from_value(set.clone())?;
        let mut prefixes = Vec::new();
        for element in &set.elem {
            prefixes.extend(nft_element(element)?);
        }
        let addr_family = match set.elem_type.as_str() {
            Some("ipv4_addr") => Some(Family::V4),
            Some("ipv6_addr") => Some(Family::V6),
            _ => None,
        };
        sets.push(NftSet {
            family: set.family,
            table: set.table,
            name: set.name,
            addr_family,
            prefixes,
        });
    }
    Ok(sets)
}

fn nft_element(value: &serde_json::Value) -> Result<Vec<IpNet>> {
    if let Some(text) = value.as_str() {
        return Ok(parse_member(text));
    }
    if let Some(inner) = value.get("elem").and_then(|e| e.get("val")) {
        return nft_element(inner);
    }
    if let Some(prefix) = value.get("prefix") {
        let addr = prefix
            .get("addr")
            .and_then(|a| a.as_str())
            .ok_or_else(|| anyhow!("prefix without addr: {prefix}"))?;
        let len = prefix
            .get("len")
            .and_then(|l| l.as_u64())
            .ok_or_else(|| anyhow!("prefix without len: {prefix}"))?;
        let net = u8::try_from(len)
            .ok()
            .and_then(|len| IpNet::new(addr.parse().ok()?, len).ok())
            .ok_or_else(|| anyhow!("unreadable prefix {addr}/{len}"))?;
        return Ok(vec![net.trunc()]);
    }
    if let Some(bounds) = value.get("range").and_then(|r| r.as_array()) {
        if let [Some(a), Some(b)] =
            [bounds.first(), bounds.get(1)].map(|v| v.and_then(|v| v.as_str()))
        {
            return Ok(range(a, b).unwrap_or_default());
        }
        bail!("unreadable range {value}");
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn ipset_save_output() {
        let text = "create cali40all-vxlan-net hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xbd5173ea\n\
                    add cali40all-vxlan-net 10.10.60.209\n\
                    add cali40all-vxlan-net 10.10.61.7/24\n\
                    add cali40all-vxlan-net 10.10.62.0/24 nomatch\n";
        assert_eq!(
            parse_ipset_save(text),
            (
                Some(Family::V4),
                nets(&["10.10.60.209/32", "10.10.61.0/24"])
            )
        );
    }

    #[test]
    fn ipset_ranges_and_ipv6() {
        let text = "add s 10.1.1.1-10.1.1.5\nadd s6 fd00::1\n";
        assert_eq!(
            parse_ipset_save(text).1,
            nets(&["10.1.1.1/32", "10.1.1.2/31", "10.1.1.4/31", "fd00::1/128"])
        );
        let v6 = "create cali60all-vxlan-net hash:net family inet6 hashsize 1024\n";
        assert_eq!(parse_ipset_save(v6), (Some(Family::V6), vec![]));
    }

    #[test]
    fn nft_sets_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"set": {"family": "ip", "name": "cali40all-vxlan-net", "table": "calico", "type": "ipv4_addr", "handle": 1, "flags": ["interval"], "elem": [{"range": ["10.1.1.1", "10.1.1.2"]}, "10.10.60.209", {"prefix": {"addr": "10.10.62.0", "len": 24}}, {"elem": {"val": "10.9.9.9", "timeout": 30}}]}}, {"set": {"family": "ip", "name": "empty", "table": "t", "type": "ipv4_addr", "handle": 2}}]}"#;
        let sets = parse_nft_sets(json).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].table, "calico");
        assert_eq!(
            sets[0].prefixes,
            nets(&[
                "10.1.1.1/32",
                "10.1.1.2/32",
                "10.10.60.209/32",
                "10.10.62.0/24",
                "10.9.9.9/32"
            ])
        );
        assert!(sets[1].prefixes.is_empty());
        assert_eq!(sets[0].addr_family, Some(Family::V4));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_nft_sets("not json").is_err());
        // 280 is 24 in a byte: a /24 must not be read from it.
        let prefix = |len: u32| {
            parse_nft_sets(&format!(
                r#"{{"nftables": [{{"set": {{"family": "ip", "name": "s", "table": "t", "elem": [{{"prefix": {{"addr": "10.0.0.0", "len": {len}}}}}]}}}}]}}"#
            ))
        };
        assert_eq!(prefix(24).unwrap()[0].prefixes, nets(&["10.0.0.0/24"]));
        assert!(
            prefix(280)
                .unwrap_err()
                .to_string()
                .contains("10.0.0.0/280")
        );
        assert!(prefix(33).is_err());
        assert!(
            parse_ipset_save("add\nadd s\nadd s not-an-address\n")
                .1
                .is_empty()
        );
    }

    #[test]
    fn tagged_options() {
        let t: Tagged<String> = "ipip=my-hosts".parse().unwrap();
        assert_eq!((t.kind, t.value.as_str()), (SetKind::Ipip, "my-hosts"));
        let t: Tagged<IpNet> = "10.0.0.0/8".parse().unwrap();
        assert_eq!(t.kind, SetKind::Vxlan);
        assert!(
            "gre=x"
                .parse::<Tagged<String>>()
                .unwrap_err()
                .contains("vxlan=")
        );
        assert!("vxlan=10.0.0.0/99".parse::<Tagged<IpNet>>().is_err());
    }

    #[test]
    fn empty_but_existing_set_activates_its_family_only() {
        let mut set = crate::model::facts::AllowSet::default();
        assert!(!set.active());
        set.add(SetSource::Ipset("x".into()), Some(Family::V4), []);
        assert!(set.active() && set.ipv4 && !set.ipv6);
        set.add(SetSource::AllowCidr, None, nets(&["fd00::/64"]));
        assert!(set.ipv6);
        assert_eq!(
            set.sources,
            [SetSource::Ipset("x".into()), SetSource::AllowCidr]
        );
        assert_eq!(set.set_names(), ["x", "--allow-cidr"]);
        let printed: Vec<String> = set.sources.iter().map(|s| s.to_string()).collect();
        assert_eq!(printed, ["ipset x", "--allow-cidr"]);
    }
}
