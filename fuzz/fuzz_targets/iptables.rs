//! Arbitrary text as `iptables-save -c` or `iptables -v -S CHAIN` output
//! (rule comments come from whoever names a Kubernetes policy): no panic,
//! at most one rule per line, and each rule read is read again, with the
//! same chain, comment and counters, from the line iptables prints for it
//! in either listing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use observer_core::parse::netfilter::parse_iptables;

fuzz_target!(|data: &[u8]| {
    // As the tool runner hands output over.
    let text = String::from_utf8_lossy(data);
    let rules = parse_iptables(&text, "iptables");
    assert!(rules.len() <= text.lines().count());
    for rule in &rules {
        let [chain] = rule.chain.as_slice() else {
            panic!("an iptables rule in {:?}", rule.chain);
        };
        // iptables' own syntax cannot tell such a word from an option:
        // chain names never start with `-`, and a comment that does is
        // read as the option it spells.
        if chain.starts_with('-') || rule.comment.starts_with('-') {
            continue;
        }
        let (Ok(chain), Ok(comment)) = (shlex::try_quote(chain), shlex::try_quote(&rule.comment))
        else {
            continue;
        };
        let (packets, bytes) = (rule.packets, rule.bytes);
        for line in [
            format!("[{packets}:{bytes}] -A {chain} -m comment --comment {comment} -j DROP"),
            format!("-A {chain} -m comment --comment {comment} -c {packets} {bytes} -j DROP"),
        ] {
            assert_eq!(parse_iptables(&line, "iptables"), [rule.clone()], "{line}");
        }
    }
});
