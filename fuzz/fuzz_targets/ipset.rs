//! Arbitrary text as `ipset save` output: no panic, every prefix truncated
//! to its length, and the family and members read are read again, the
//! same, from the `ipset save` text of a set holding them.

#![no_main]

use libfuzzer_sys::fuzz_target;
use observer_core::{model::facts::Family, parse::netfilter::parse_ipset_save};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (family, prefixes) = parse_ipset_save(&text);
    assert!(prefixes.iter().all(|p| p.trunc() == *p), "{prefixes:?}");
    let mut again = match family {
        Some(Family::V4) => "create s hash:net family inet hashsize 1024\n".to_string(),
        Some(Family::V6) => "create s hash:net family inet6 hashsize 1024\n".to_string(),
        None => String::new(),
    };
    for prefix in &prefixes {
        again += &format!("add s {prefix}\n");
    }
    assert_eq!(parse_ipset_save(&again), (family, prefixes));
});
