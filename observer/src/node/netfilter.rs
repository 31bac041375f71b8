//! Reads the packet counters of Calico's allow-set drop rules (iptables
//! and nftables data planes), so the observer's own `calico_allow_set`
//! counts can be shown beside the kernel's and a disagreement flagged.
//! Rules are found by their comment, as chain names differ between
//! Calico's data planes. Tool output is parsed for the same reason as in
//! `allowsets`: no maintained crate reads it.

use anyhow::Result;

use crate::{
    model::crosscheck::RuleReading,
    model::facts::{Family, SetKind},
    node::{allowsets::NftDoc, tools},
};

/// Calico's drop rules for sources outside the allow-sets: the comment it
/// writes, the set kind, and the address family of the sources it drops.
pub const CALICO_DROP_RULES: [(&str, SetKind, Family); 3] = [
    (
        "Drop IPv4 VXLAN packets from non-allowed hosts",
        SetKind::Vxlan,
        Family::V4,
    ),
    (
        "Drop IPv6 VXLAN packets from non-allowed hosts",
        SetKind::Vxlan,
        Family::V6,
    ),
    (
        "Drop IPIP packets from non-Calico hosts",
        SetKind::Ipip,
        Family::V4,
    ),
];

/// Counters of one commented rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCounter {
    /// `iptables`, `ip6tables` or `nftables`.
    pub backend: &'static str,
    /// The rule's comment.
    pub comment: String,
    /// Packets that matched since the rule was created.
    pub packets: u64,
    /// Bytes that matched.
    pub bytes: u64,
}

/// Counters of Calico's drop rules, each with the rule it is, and the
/// problems met reading them. Missing tools are a problem, not an error.
pub fn read_calico_drop_rules() -> (Vec<RuleReading>, Vec<String>) {
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    for (tool, backend) in [
        ("iptables-save", "iptables"),
        ("ip6tables-save", "ip6tables"),
    ] {
        // Calico's allow-set drop rules are in the filter table
        // (cali-INPUT): the other tables are never read.
        match tools::output(tool, &["-c", "-t", "filter"], "its rule counters") {
            Ok(text) => rules.extend(parse_iptables_save(&text, backend)),
            Err(e) => problems.push(e.to_string()),
        }
    }
    match tools::output("nft", &["-j", "-t", "list", "ruleset"], "its rule counters") {
        Ok(json) => match parse_nft_ruleset(&json) {
            Ok(found) => rules.extend(found),
            Err(e) => problems.push(format!("cannot parse `nft -j -t list ruleset`: {e}")),
        },
        Err(e) => problems.push(e.to_string()),
    }
    let calico = rules
        .into_iter()
        .filter_map(|rule| {
            CALICO_DROP_RULES
                .iter()
                .find(|(comment, _, _)| *comment == rule.comment)
                .map(|&(_, kind, family)| RuleReading {
                    backend: rule.backend,
                    kind,
                    family,
                    packets: rule.packets,
                    comment: rule.comment,
                })
        })
        .collect();
    (calico, problems)
}

/// Commented rules of `iptables-save -c` output:
/// `[579:34740] -A cali-INPUT ... -m comment --comment "Drop ..." ... -j DROP`.
pub fn parse_iptables_save(text: &str, backend: &'static str) -> Vec<RuleCounter> {
    let mut rules = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((counters, rule)) = rest.split_once(']') else {
            continue;
        };
        let Some((packets, bytes)) = counters.split_once(':') else {
            continue;
        };
        let (Ok(packets), Ok(bytes)) = (packets.parse(), bytes.parse()) else {
            continue;
        };
        let Some(comment) = comment_of(rule) else {
            continue;
        };
        rules.push(RuleCounter {
            backend,
            comment,
            packets,
            bytes,
        });
    }
    rules
}

/// The `--comment` argument, quoted (with `\"` escapes) or bare.
fn comment_of(rule: &str) -> Option<String> {
    let after = rule.split_once("--comment ")?.1;
    if let Some(quoted) = after.strip_prefix('"') {
        let mut comment = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => comment.extend(chars.next()),
                '"' => return Some(comment),
                c => comment.push(c),
            }
        }
        None
    } else {
        after.split_whitespace().next().map(str::to_string)
    }
}

/// Native nftables rules with a comment and a counter, from
/// `nft -j -t list ruleset` (terse: without set elements). (iptables-nft rules carry their comment in an
/// `xt` match without text, so they are only read through iptables-save:
/// nothing is counted twice.)
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
        rules.push(RuleCounter {
            backend: "nftables",
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
        let rules = parse_iptables_save(text, "iptables");
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[1].comment,
            "Drop IPv4 VXLAN packets from non-allowed hosts"
        );
        assert_eq!((rules[1].packets, rules[1].bytes), (579, 34740));
        assert_eq!(rules[0].packets, 65_000_000);
        assert_eq!(rules[2].comment, "cali:abc");
    }

    #[test]
    fn escaped_quotes_in_comments() {
        assert_eq!(
            comment_of(r#"-m comment --comment "a \"b\" c" -j X"#).as_deref(),
            Some(r#"a "b" c"#)
        );
        assert_eq!(comment_of("-j ACCEPT"), None);
    }

    #[test]
    fn nft_ruleset_counters_by_comment() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"rule": {"family": "ip", "table": "calico", "chain": "filter-INPUT", "handle": 4, "comment": "Drop IPv4 VXLAN packets from non-allowed hosts", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 4789}}, {"counter": {"packets": 579, "bytes": 34740}}, {"drop": null}]}}, {"rule": {"family": "ip", "table": "filter", "chain": "cali-INPUT", "handle": 5, "expr": [{"xt": {"type": "match", "name": "comment"}}, {"counter": {"packets": 7, "bytes": 0}}, {"drop": null}]}}]}"#;
        let rules = parse_nft_ruleset(json).unwrap();
        assert_eq!(
            rules,
            vec![RuleCounter {
                backend: "nftables",
                comment: "Drop IPv4 VXLAN packets from non-allowed hosts".into(),
                packets: 579,
                bytes: 34740
            }]
        );
        assert!(parse_nft_ruleset("{").is_err());
    }
}
