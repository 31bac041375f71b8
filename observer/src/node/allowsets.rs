//! Mirrors the allow-sets that decide which sources may send tunnel
//! traffic to this node (Calico's `cali40all-vxlan-net`,
//! `cali60all-vxlan-net`, `cali40all-hosts-net`, or sets and CIDRs given on
//! the command line), read from ipset (iptables data plane) and nftables
//! (nft data plane). The tools' own output is parsed because neither ipset
//! nor nftables has a maintained Rust crate that reads sets; the parsers
//! (`parse::netfilter`) are unit-tested against real output.

use std::{fmt, str::FromStr};

use anyhow::Result;
use ipnet::IpNet;

use crate::node::tools::{self, ToolError};
use crate::parse::netfilter::{NftSet, parse_ipset_save, parse_nft_sets};

use crate::model::facts::{AllowSets, SetKind, SetSource};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::facts::Family;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
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
