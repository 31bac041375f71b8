//! ipset, iptables and nftables output, read into prefixes and rule
//! counters. By hand because neither ipset nor nftables has a maintained
//! Rust crate that reads sets or rule counters, and iptables has none at
//! all; each parser is unit-tested against the tools' real output and
//! fuzzed (`fuzz/`: `ipset`, `iptables`, `nft`). `observer`'s `node` layer
//! runs the tools (`node::allowsets`, `node::netfilter`).

use anyhow::{Result, anyhow, bail};
use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};
use serde::Deserialize;

use crate::model::facts::Family;

/// Counters of one commented rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCounter {
    /// `iptables`, `ip6tables` or `nftables`.
    pub backend: &'static str,
    /// The chain holding it, as its backend's listing names it: the chain
    /// (iptables) or family, table and chain (nftables).
    pub chain: Vec<String>,
    /// The rule's comment.
    pub comment: String,
    /// Packets that matched since the rule was created.
    pub packets: u64,
    /// Bytes that matched.
    pub bytes: u64,
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
struct NftDoc {
    nftables: Vec<serde_json::Value>,
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

/// The chains (family, table, name) of `nft -j list chains`.
pub fn parse_nft_chains(json: &str) -> Result<Vec<[String; 3]>> {
    let doc: NftDoc = serde_json::from_str(json)?;
    Ok(doc
        .nftables
        .iter()
        .filter_map(|item| {
            let chain = item.get("chain")?;
            let text = |key: &str| Some(chain.get(key)?.as_str()?.to_string());
            Some([text("family")?, text("table")?, text("name")?])
        })
        .collect())
}

/// Commented rules of `iptables-save -c` output
/// (`[579:34740] -A cali-INPUT ... -m comment --comment "Drop ..." ... -j DROP`)
/// or of `iptables -v -S CHAIN` (`-A cali-INPUT ... -c 579 34740 -j DROP`).
/// Rules are split into words as a shell would (shlex): iptables quotes
/// comments with `"` and escapes inner quotes with `\"`.
pub fn parse_iptables(text: &str, backend: &'static str) -> Vec<RuleCounter> {
    let mut rules = Vec::new();
    for line in text.lines() {
        let (save_counters, rule) = match line.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((counters, rule)) => (counters.split_once(':'), rule),
                None => continue,
            },
            None => (None, line),
        };
        let Some(words) = shlex::split(rule) else {
            continue;
        };
        let after = |flag: &str, n: usize| -> Option<&[String]> {
            let at = words.iter().position(|w| w == flag)?;
            words.get(at + 1..at + 1 + n)
        };
        let (Some([chain]), Some([comment])) = (after("-A", 1), after("--comment", 1)) else {
            continue;
        };
        let counters = match save_counters {
            Some((packets, bytes)) => (packets.parse(), bytes.parse()),
            None => match after("-c", 2) {
                Some([packets, bytes]) => (packets.parse(), bytes.parse()),
                _ => continue,
            },
        };
        let (Ok(packets), Ok(bytes)) = counters else {
            continue;
        };
        rules.push(RuleCounter {
            backend,
            chain: vec![chain.clone()],
            comment: comment.clone(),
            packets,
            bytes,
        });
    }
    rules
}

/// Native nftables rules with a comment and a counter, from
/// `nft -j list chain FAMILY TABLE CHAIN` (or any listing of rules). (iptables-nft rules carry their
/// comment in an `xt` match without text, so they are only read through
/// iptables: nothing is counted twice.)
pub fn parse_nft_ruleset(json: &str) -> Result<Vec<RuleCounter>> {
    let doc: NftDoc = serde_json::from_str(json)?;
    let mut rules = Vec::new();
    for item in doc.nftables {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let Some(comment) = rule.get("comment").and_then(|c| c.as_str()) else {
            continue;
        };
        let counter = rule
            .get("expr")
            .and_then(|e| e.as_array())
            .and_then(|exprs| exprs.iter().find_map(|e| e.get("counter")));
        let Some(counter) = counter else { continue };
        let text = |key: &str| rule.get(key).and_then(|v| v.as_str()).unwrap_or_default();
        rules.push(RuleCounter {
            backend: "nftables",
            chain: vec![
                text("family").to_string(),
                text("table").to_string(),
                text("chain").to_string(),
            ],
            comment: comment.to_string(),
            packets: counter.get("packets").and_then(|v| v.as_u64()).unwrap_or(0),
            bytes: counter.get("bytes").and_then(|v| v.as_u64()).unwrap_or(0),
        });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VXLAN_DROP: &str = "Drop IPv4 VXLAN packets from non-allowed hosts";

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
    fn iptables_save_counters_by_comment() {
        let text = r#"# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
[0:0] -A INPUT -j cali-INPUT
[65000000:4000000000] -A cali-INPUT -p udp -m comment --comment "Allow IPv4 VXLAN packets from allowed hosts" -m set --match-set cali40all-vxlan-net src -m addrtype --dst-type LOCAL -m udp --dport 4789 -j ACCEPT
[579:34740] -A cali-INPUT -p udp -m comment --comment "Drop IPv4 VXLAN packets from non-allowed hosts" -m addrtype --dst-type LOCAL -m udp --dport 4789 -j DROP
[3:180] -A cali-INPUT -m comment --comment cali:abc -j MARK
COMMIT"#;
        let rules = parse_iptables(text, "iptables");
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[1].comment, VXLAN_DROP);
        assert_eq!(rules[1].chain, ["cali-INPUT"]);
        assert_eq!((rules[1].packets, rules[1].bytes), (579, 34740));
        assert_eq!(rules[0].packets, 65_000_000);
        assert_eq!(rules[2].comment, "cali:abc");
    }

    #[test]
    fn iptables_chain_listing_counters_by_comment() {
        // `iptables -t filter -v -S cali-INPUT` (iptables 1.8.9).
        let text = r#"-N cali-INPUT
-A cali-INPUT -p udp -m comment --comment "Drop IPv4 VXLAN packets from non-allowed hosts" -m udp --dport 4789 -c 579 34740 -j DROP
-A cali-INPUT -m comment --comment "a \"q\" -c 1 2" -c 7 420 -j ACCEPT
-A cali-INPUT -j ACCEPT -c 9 9"#;
        let rules = parse_iptables(text, "iptables");
        assert_eq!(
            rules,
            vec![
                RuleCounter {
                    backend: "iptables",
                    chain: vec!["cali-INPUT".into()],
                    comment: VXLAN_DROP.into(),
                    packets: 579,
                    bytes: 34740,
                },
                RuleCounter {
                    backend: "iptables",
                    chain: vec!["cali-INPUT".into()],
                    comment: r#"a "q" -c 1 2"#.into(),
                    packets: 7,
                    bytes: 420,
                },
            ]
        );
        assert!(parse_iptables("[1:2] -A X -m comment --comment \"open", "iptables").is_empty());
    }

    #[test]
    fn nft_ruleset_counters_by_comment() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"rule": {"family": "ip", "table": "calico", "chain": "filter-INPUT", "handle": 4, "comment": "Drop IPv4 VXLAN packets from non-allowed hosts", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 4789}}, {"counter": {"packets": 579, "bytes": 34740}}, {"drop": null}]}}, {"rule": {"family": "ip", "table": "filter", "chain": "cali-INPUT", "handle": 5, "expr": [{"xt": {"type": "match", "name": "comment"}}, {"counter": {"packets": 7, "bytes": 0}}, {"drop": null}]}}]}"#;
        let rules = parse_nft_ruleset(json).unwrap();
        assert_eq!(
            rules,
            vec![RuleCounter {
                backend: "nftables",
                chain: vec!["ip".into(), "calico".into(), "filter-INPUT".into()],
                comment: VXLAN_DROP.into(),
                packets: 579,
                bytes: 34740
            }]
        );
        assert!(parse_nft_ruleset("{").is_err());
    }
}
