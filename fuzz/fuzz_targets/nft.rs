//! Arbitrary text as `nft -j` output (`list chain`, `list chains`, `list
//! set(s)`; comments and set names come from whoever names a Kubernetes
//! policy) through the three parsers that read it: no panic, every prefix
//! truncated to its length, and each rule, chain and set read is read
//! again, the same, from the JSON nft writes for it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use observer_core::{
    model::facts::Family,
    parse::netfilter::{parse_nft_chains, parse_nft_ruleset, parse_nft_sets},
};
use serde_json::json;

/// `items` as the top-level object of nft's JSON.
fn document(items: Vec<serde_json::Value>) -> String {
    json!({ "nftables": items }).to_string()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(rules) = parse_nft_ruleset(&text) {
        for rule in &rules {
            let [family, table, chain] = rule.chain.as_slice() else {
                panic!("an nftables rule in {:?}", rule.chain);
            };
            let again = document(vec![json!({ "rule": {
                "family": family, "table": table, "chain": chain, "comment": rule.comment,
                "expr": [{ "counter": { "packets": rule.packets, "bytes": rule.bytes } }],
            }})]);
            assert_eq!(parse_nft_ruleset(&again).unwrap(), [rule.clone()]);
        }
    }
    if let Ok(chains) = parse_nft_chains(&text) {
        for chain in &chains {
            let [family, table, name] = chain;
            let again = document(vec![json!({ "chain": {
                "family": family, "table": table, "name": name,
            }})]);
            assert_eq!(parse_nft_chains(&again).unwrap(), [chain.clone()]);
        }
    }
    if let Ok(sets) = parse_nft_sets(&text) {
        for set in &sets {
            assert!(set.prefixes.iter().all(|p| p.trunc() == *p), "{set:?}");
            let kind = match set.addr_family {
                Some(Family::V4) => json!("ipv4_addr"),
                Some(Family::V6) => json!("ipv6_addr"),
                None => json!(null),
            };
            let elements: Vec<String> = set.prefixes.iter().map(|p| p.to_string()).collect();
            let again = document(vec![json!({ "set": {
                "family": set.family, "table": set.table, "name": set.name,
                "type": kind, "elem": elements,
            }})]);
            assert_eq!(parse_nft_sets(&again).unwrap(), [set.clone()]);
        }
    }
});
