//! Keeps the programs' lookup maps equal to what userspace read from the
//! node: the allow-set LPM tries, the local VNI set, and the switches that
//! turn each check on only when its source of truth exists.

use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{Context, Result};
use aya::maps::{
    Array, HashMap, MapData,
    lpm_trie::{Key, LpmTrie},
};
use ipnet::IpNet;
use observer_common::{
    CONFIG_MAP, IPIP_ALLOW_V4_MAP, IPIP_ALLOW_V6_MAP, LOCAL_VNIS_MAP, VXLAN_ALLOW_V4_MAP,
    VXLAN_ALLOW_V6_MAP, config,
};

use crate::{
    bpf::Observer,
    node::allowsets::{SetKind, Snapshot},
};

/// Network-order words of an address, as the programs read them from packets.
fn words(addr: IpAddr) -> [u32; 4] {
    let bytes = match addr {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    };
    let mut out = [0u32; 4];
    for (word, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *word = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    out
}

fn set_switch(observer: &mut Observer, index: u32, on: bool) -> Result<()> {
    let mut switches: Array<&mut MapData, u32> = Array::try_from(
        observer
            .ebpf_mut()
            .map_mut(CONFIG_MAP)
            .context("CONFIG map missing")?,
    )?;
    switches.set(index, u32::from(on), 0)?;
    Ok(())
}

/// Replaces the contents of one LPM trie with `prefixes` (inserting the new
/// ones before removing stale ones, so no moment lets everything through).
fn sync_trie<K: aya::Pod + Ord>(
    observer: &mut Observer,
    map: &str,
    prefixes: impl Iterator<Item = (u32, K)>,
) -> Result<()> {
    let mut trie: LpmTrie<&mut MapData, K, u8> = LpmTrie::try_from(
        observer
            .ebpf_mut()
            .map_mut(map)
            .with_context(|| format!("{map} missing"))?,
    )?;
    let wanted: BTreeSet<(u32, K)> = prefixes.collect();
    let present: BTreeSet<(u32, K)> = trie
        .keys()
        .filter_map(|k| k.ok())
        .map(|k| (k.prefix_len(), k.data()))
        .collect();
    for (len, data) in wanted.difference(&present) {
        trie.insert(&Key::new(*len, *data), 1, 0)
            .with_context(|| format!("adding a prefix to {map} (more than it holds?)"))?;
    }
    for (len, data) in present.difference(&wanted) {
        trie.remove(&Key::new(*len, *data))?;
    }
    Ok(())
}

/// Writes the allow-sets of `snapshot` into the tries and switches.
pub fn apply_allow_sets(observer: &mut Observer, snapshot: &Snapshot) -> Result<()> {
    for kind in SetKind::ALL {
        let set = snapshot.get(kind);
        let (v4_map, v6_map, v4_switch, v6_switch) = match kind {
            SetKind::Vxlan => (
                VXLAN_ALLOW_V4_MAP,
                VXLAN_ALLOW_V6_MAP,
                config::VXLAN_ALLOW_V4,
                config::VXLAN_ALLOW_V6,
            ),
            SetKind::Ipip => (
                IPIP_ALLOW_V4_MAP,
                IPIP_ALLOW_V6_MAP,
                config::IPIP_ALLOW_V4,
                config::IPIP_ALLOW_V6,
            ),
        };
        sync_trie(
            observer,
            v4_map,
            set.prefixes.iter().filter_map(|p| match p {
                IpNet::V4(n) => {
                    Some((u32::from(n.prefix_len()), words(IpAddr::V4(n.network()))[0]))
                }
                IpNet::V6(_) => None,
            }),
        )?;
        sync_trie(
            observer,
            v6_map,
            set.prefixes.iter().filter_map(|p| match p {
                IpNet::V6(n) => Some((u32::from(n.prefix_len()), words(IpAddr::V6(n.network())))),
                IpNet::V4(_) => None,
            }),
        )?;
        set_switch(observer, v4_switch, set.ipv4)?;
        set_switch(observer, v6_switch, set.ipv6)?;
    }
    Ok(())
}

/// Writes the local VNIs; the VNI check is on only when there is at least
/// one local vxlan device (otherwise every VXLAN packet would be flagged).
pub fn apply_local_vnis(observer: &mut Observer, vnis: &[u32]) -> Result<()> {
    let mut map: HashMap<&mut MapData, u32, u8> = HashMap::try_from(
        observer
            .ebpf_mut()
            .map_mut(LOCAL_VNIS_MAP)
            .context("LOCAL_VNIS map missing")?,
    )?;
    let present: Vec<u32> = map.keys().filter_map(|k| k.ok()).collect();
    for vni in vnis {
        map.insert(*vni, 1, 0)
            .context("adding a VNI to LOCAL_VNIS (more local vxlan devices than it holds?)")?;
    }
    for stale in present.iter().filter(|v| !vnis.contains(v)) {
        map.remove(stale)?;
    }
    set_switch(observer, config::VNI_CHECK, !vnis.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_network_order_in_memory() {
        let w = words("10.10.60.127".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [10, 10, 60, 127]);
        assert_eq!(&w[1..], &[0, 0, 0]);
        let w = words("2001:db8::1".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(w[3].to_ne_bytes(), [0, 0, 0, 1]);
    }
}
