//! tcpdump as the reference: its decode of a capture (`-nr` output, as in
//! the reference captures' `.out` files) turned into one verdict per
//! packet, and the counts per (protocol, outer source, VNI) that the
//! observer's tunnel rows must equal. Owned by the capture tests
//! (`pcaps.rs`, `replay.rs`).
//!
//! For each packet, the first `A.sport > B.dport:` (or `A > B:`) address
//! pair and the text after it say whether tcpdump saw VXLAN (`vni N`),
//! VXLAN-GPE, Geneve (`vni 0xN`) or GRE from outer source A.

use std::{collections::BTreeMap, fs, net::IpAddr, path::Path};

use observer_common::Proto;

/// (protocol, outer source, VNI) of a tunnel packet.
pub type TunnelKey = (Proto, IpAddr, u32);

/// `capture file -> expected output file`, from TESTLIST.subset (columns:
/// test name, capture, output, flags).
pub fn test_list(dir: &Path) -> BTreeMap<String, String> {
    let text = fs::read_to_string(dir.join("TESTLIST.subset")).unwrap_or_default();
    let mut outputs = BTreeMap::new();
    for line in text.lines() {
        let columns: Vec<&str> = line.split_whitespace().collect();
        if columns.len() >= 3 && !line.trim_start().starts_with('#') {
            outputs
                .entry(columns[1].to_string())
                .or_insert_with(|| columns[2].to_string());
        }
    }
    outputs
}

/// Whether `line` opens a packet: `<number>  YYYY-MM-DD ...`.
fn packet_number(line: &str) -> Option<usize> {
    let line = line.trim_start();
    let (number, rest) = line.split_once(char::is_whitespace)?;
    let number: usize = number.parse().ok()?;
    let date = rest.trim_start().as_bytes();
    let is_date = date.len() >= 10
        && date[..10].iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    is_date.then_some(number)
}

/// An address with or without a trailing `.port`.
fn endpoint(token: &str) -> Option<IpAddr> {
    if let Ok(a) = token.parse() {
        return Some(a);
    }
    let (address, port) = token.rsplit_once('.')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    address.parse().ok()
}

/// The first `A > B:` pair of a packet's text (MAC pairs end in ','):
/// outer source A and the rest of that line.
fn first_ip_pair(block: &str) -> Option<(IpAddr, String)> {
    for line in block.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        for i in 0..tokens.len().saturating_sub(2) {
            if tokens[i + 1] != ">" {
                continue;
            }
            let Some(dst) = tokens[i + 2].strip_suffix(':') else {
                continue;
            };
            if let (Some(src), Some(_)) = (endpoint(tokens[i]), endpoint(dst)) {
                return Some((src, tokens[i + 3..].join(" ")));
            }
        }
    }
    None
}

fn parse_vni(text: &str) -> Option<u32> {
    let (_, after) = text.split_once("vni ")?;
    let token = after
        .split(|c: char| c.is_whitespace() || c == ',')
        .next()?;
    match token.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => token.parse().ok(),
    }
}

/// tcpdump's verdict on one packet: the tunnel it decoded, if any.
fn classify_block(block: &str) -> Option<TunnelKey> {
    let (src, rest) = first_ip_pair(block)?;
    // Skip notes such as "[bad udp cksum 0xa0a5 -> 0xd93a!]" or "[no cksum]".
    let mut rest = rest.trim_start();
    while rest.starts_with('[') {
        rest = rest.split_once(']').map_or("", |(_, r)| r).trim_start();
    }
    let vni = || parse_vni(rest).unwrap_or_else(|| panic!("no vni in {rest:?}"));
    if rest.starts_with("VXLAN-GPE") {
        Some((Proto::VxlanGpe, src, vni()))
    } else if rest.starts_with("VXLAN") {
        Some((Proto::Vxlan, src, vni()))
    } else if rest.starts_with("Geneve") {
        Some((Proto::Geneve, src, vni()))
    } else if rest.starts_with("GRE") {
        Some((Proto::Gre, src, 0))
    } else {
        None
    }
}

/// One verdict per packet of a tcpdump output, in order.
pub fn parse_tcpdump_output(text: &str) -> Vec<Option<TunnelKey>> {
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(number) = packet_number(line) {
            assert_eq!(
                number,
                blocks.len() + 1,
                "packets are numbered in order: {line}"
            );
            blocks.push(String::new());
        }
        if let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks.iter().map(|b| classify_block(b)).collect()
}

pub fn count(keys: impl IntoIterator<Item = TunnelKey>) -> BTreeMap<TunnelKey, u64> {
    let mut counts = BTreeMap::new();
    for key in keys {
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

pub fn describe(counts: &BTreeMap<TunnelKey, u64>) -> String {
    if counts.is_empty() {
        return "none".to_string();
    }
    counts
        .iter()
        .map(|((proto, peer, vni), n)| format!("{}/{peer}/vni {vni}: {n}", proto.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// tcpdump's verdicts for capture `file` in `dir`: the expected-output
/// file named by TESTLIST.subset (else `NAME.out`) and one verdict per packet.
pub fn expected(dir: &Path, file: &str) -> (String, Vec<Option<TunnelKey>>) {
    let out = test_list(dir)
        .get(file)
        .cloned()
        .unwrap_or_else(|| format!("{}.out", file.trim_end_matches(".pcap")));
    let text = fs::read_to_string(dir.join(&out))
        .unwrap_or_else(|e| panic!("{file}: expected output {out}: {e}"));
    let verdicts = parse_tcpdump_output(&text);
    (out, verdicts)
}
