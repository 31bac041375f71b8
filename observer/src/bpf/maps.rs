//! The maps: one typed reader per map the programs write (flows, drops,
//! BGP at the wire, self counters), and the writes userspace makes while attached (MTUs,
//! watched interfaces, allow-sets, local VNIs, check switches). The port
//! table and the program arrays are written once, by `load`.

use std::{
    collections::{BTreeSet, HashSet},
    hash::Hash,
    io,
    net::IpAddr,
};

use aya::{
    Pod,
    maps::{
        Array, HashMap as BpfHashMap, IterableMap, MapData, MapError, PerCpuArray, PerCpuHashMap,
        lpm_trie::{Key, LpmTrie},
    },
};
use foldhash::HashMap as FastMap;
use ipnet::IpNet;
use observer_common::{
    BGP_MAP, BLOCKS_MAP, BgpCounters, BgpKey, BlockPeer, CONFIG_SECTION, ConfigWords, DROPS_MAP,
    DropKey, DropValue, FLOW_CACHE_MAP, FLOW_CACHE_SLOTS, FLOWS_MAP, FlowCacheSlot, FlowKey,
    FlowValue, IFACE_MTU_MAP, IPIP_ALLOW_V4_MAP, IPIP_ALLOW_V6_MAP, KeyFacts, LOCAL_VNIS_MAP,
    PLAIN_MAP, PLAIN_SLOTS, PlainCounters, Proto, STATS_MAP, Stat, VXLAN_ALLOW_V4_MAP,
    VXLAN_ALLOW_V6_MAP, WATCHED_BITS_SECTION, WATCHED_BITS_WORDS, WATCHED_MAP, WatchedIface,
    config, family, stage, v4_mapped, watched_bit,
};

use super::{
    Observer, batch,
    slots::{SlotPlan, SlotReads},
};
use crate::{
    model::bgp_wire::{WireCounters, WireId},
    model::facts::{AllowSets, SetKind},
    model::rows::{DropCounters, DropId, FlowCounters, FlowId, KernelStats},
    node::localnet,
};

/// Why reading or writing a map failed.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// A map is not in the object (an observer bug: build.rs builds the
    /// object from the same workspace); the text names it.
    #[error("{0}")]
    Missing(String),
    /// aya refused the map (type, key or value size), or a system call on
    /// it failed.
    #[error(transparent)]
    Map(#[from] MapError),
    /// Walking a map failed.
    #[error("reading the {map} map")]
    Read {
        map: &'static str,
        #[source]
        source: MapError,
    },
    /// Reading one index of an array failed.
    #[error("reading index {index} of the {map} map")]
    ReadIndex {
        map: &'static str,
        index: u32,
        #[source]
        source: MapError,
    },
    /// A batch lookup failed.
    #[error("batch lookup of the {map} map")]
    Batch {
        map: &'static str,
        #[source]
        source: io::Error,
    },
    /// Watching an interface's kernel drops failed (the map may be full).
    #[error("watching the kernel drops of interface {ifindex} (more than {max} interfaces?)", max = observer_common::WATCHED_MAX)]
    Watch {
        ifindex: u32,
        #[source]
        source: MapError,
    },
    /// Adding an allow-set prefix failed (the trie may be full).
    #[error("adding a prefix to {map} (more than it holds?)")]
    AddPrefix {
        map: &'static str,
        #[source]
        source: MapError,
    },
    /// Adding a local VNI failed (the map may be full).
    #[error("adding a VNI to LOCAL_VNIS (more local vxlan devices than it holds?)")]
    AddVni(#[source] MapError),
    /// The number of possible CPUs (one value per CPU in per-CPU maps)
    /// could not be read.
    #[error("reading {path}: {error}")]
    PossibleCpus {
        path: &'static str,
        error: io::Error,
    },
    /// A reader panicked holding the lock of the slot reads.
    #[error("the slot reads' lock was poisoned")]
    Poisoned,
    /// The current network namespace could not be read (watching an
    /// interface).
    #[error(transparent)]
    Netns(anyhow::Error),
}

fn missing(text: impl Into<String>) -> MapsError {
    MapsError::Missing(text.into())
}

impl Observer {
    /// Tells the programs the MTU of interface `ifindex`: received tunnel
    /// packets above it count as `over_mtu`.
    pub fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> Result<(), MapsError> {
        let mut mtus: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(IFACE_MTU_MAP)
                .ok_or_else(|| missing("IFACE_MTU map missing"))?,
        )?;
        if mtus.get(&ifindex, 0).ok() == Some(mtu) {
            return Ok(());
        }
        mtus.insert(ifindex, mtu, 0)?;
        next_facts_generation(self)
    }

    /// Registers `ifindex` of the current namespace for the kernel drop
    /// filter and the MTU check.
    pub(super) fn watch(&mut self, iface: &str, ifindex: u32) -> Result<(), MapsError> {
        self.set_watched(ifindex, stage::UNDERLAY)?;
        match localnet::mtu(iface) {
            Ok(mtu) => self.set_mtu(ifindex, mtu)?,
            Err(e) => {
                tracing::warn!(iface, error = %format!("{e:#}"), "MTU unknown: over_mtu not checked")
            }
        }
        Ok(())
    }

    pub(super) fn unwatch(&mut self, ifindex: u32) {
        self.unwatch_after_decap(ifindex);
        let removed = self
            .ebpf
            .map_mut(IFACE_MTU_MAP)
            .and_then(|map| BpfHashMap::<_, u32, u32>::try_from(map).ok())
            .is_some_and(|mut mtus| mtus.remove(&ifindex).is_ok());
        if removed {
            let _ = next_facts_generation(self);
        }
    }

    /// Pauses (`false`) or resumes the counting of the XDP and tc hooks
    /// (`observer_common::config::PAUSED`): a run attaches its
    /// interfaces paused, so that every direction starts at once.
    pub fn set_counting(&mut self, on: bool) -> Result<(), MapsError> {
        set_switch(self, config::PAUSED, !on).map(drop)
    }

    /// Counts the kernel's drops on tunnel or pod device `ifindex` of the
    /// current namespace as drops after decapsulation at `stage`
    /// (`observer_common::stage`).
    pub fn watch_after_decap(&mut self, ifindex: u32, stage: u8) -> Result<(), MapsError> {
        self.set_watched(ifindex, stage)
    }

    /// Stops counting the kernel's drops on `ifindex`.
    pub fn unwatch_after_decap(&mut self, ifindex: u32) {
        let Ok(netns) = localnet::netns_inode() else {
            return;
        };
        if let Some(map) = self.ebpf.map_mut(WATCHED_MAP)
            && let Ok(mut watched) = BpfHashMap::<_, WatchedIface, u8>::try_from(map)
        {
            let _ = watched.remove(&WatchedIface { netns, ifindex });
        }
        let _ = self.sync_watched_bits(ifindex);
    }

    fn set_watched(&mut self, ifindex: u32, stage: u8) -> Result<(), MapsError> {
        let netns = localnet::netns_inode().map_err(MapsError::Netns)?;
        let mut watched: BpfHashMap<_, WatchedIface, u8> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(WATCHED_MAP)
                .ok_or_else(|| missing("WATCHED map missing"))?,
        )?;
        watched
            .insert(WatchedIface { netns, ifindex }, stage, 0)
            .map_err(|source| MapsError::Watch { ifindex, source })?;
        self.sync_watched_bits(ifindex)
    }

    /// Makes the `BLOCKS` trie hold exactly `blocks`: each pod block with
    /// the node that owns it and the encapsulation it is routed through,
    /// by which kfree_skb names the peer of a drop after decapsulation.
    pub fn set_block_peers(
        &mut self,
        blocks: &[(IpNet, IpAddr, Option<Proto>)],
    ) -> Result<(), MapsError> {
        let mut trie: LpmTrie<&mut MapData, [u32; 4], BlockPeer> = LpmTrie::try_from(
            self.ebpf
                .map_mut(BLOCKS_MAP)
                .ok_or_else(|| missing("BLOCKS map missing"))?,
        )?;
        let wanted: FastMap<(u32, [u32; 4]), BlockPeer> = blocks
            .iter()
            .map(|(block, node, proto)| (block_key(*block), block_peer(*node, *proto)))
            .collect();
        let present: Vec<(u32, [u32; 4])> = trie
            .keys()
            .filter_map(|k| k.ok())
            .map(|k| (k.prefix_len(), k.data()))
            .collect();
        for ((len, data), peer) in &wanted {
            let key = Key::new(*len, *data);
            if trie.get(&key, 0).ok() != Some(*peer) {
                trie.insert(&key, *peer, 0)
                    .map_err(|source| MapsError::AddPrefix {
                        map: BLOCKS_MAP,
                        source,
                    })?;
            }
        }
        for (len, data) in present {
            if !wanted.contains_key(&(len, data)) {
                trie.remove(&Key::new(len, data))?;
            }
        }
        Ok(())
    }

    /// Rewrites the word of the kfree_skb prefilter bitmap that holds
    /// `ifindex`'s bit from the watched set (other interfaces may share the
    /// word or the bit).
    fn sync_watched_bits(&mut self, ifindex: u32) -> Result<(), MapsError> {
        let watched: BpfHashMap<_, WatchedIface, u8> = BpfHashMap::try_from(
            self.ebpf
                .map(WATCHED_MAP)
                .ok_or_else(|| missing("WATCHED map missing"))?,
        )?;
        let word = watched_bit(ifindex) / 64;
        let value = watched
            .keys()
            .filter_map(|k| k.ok())
            .map(|k| watched_bit(k.ifindex))
            .filter(|bit| bit / 64 == word)
            .fold(0u64, |value, bit| value | 1 << (bit % 64));
        let mut bits: Array<&mut MapData, [u64; WATCHED_BITS_WORDS]> = Array::try_from(
            self.ebpf
                .map_mut(WATCHED_BITS_SECTION)
                .ok_or_else(|| missing("the watched-interface bitmap is missing"))?,
        )?;
        let mut words = bits.get(&0, 0)?;
        words[word as usize] = value;
        bits.set(0, words, 0)?;
        Ok(())
    }

    fn flow_map(&self) -> Result<PerCpuHashMap<&MapData, FlowKey, FlowValue>, MapsError> {
        Ok(PerCpuHashMap::try_from(
            self.ebpf
                .map(FLOWS_MAP)
                .ok_or_else(|| missing("FLOWS map missing"))?,
        )?)
    }

    /// Reads every row of the flow counters, summed over CPUs: the keys of
    /// the flow cache and of the LRU map, each once; by batch lookups where
    /// the kernel has them for the map, else walking it.
    pub fn read_flows(&self) -> Result<Vec<(FlowId, FlowCounters)>, MapsError> {
        self.read_flows_with(MapRead::Batch)
    }

    /// [`Observer::read_flows`] by one way of reading maps: tests compare
    /// the two.
    pub fn read_flows_with(&self, how: MapRead) -> Result<Vec<(FlowId, FlowCounters)>, MapsError> {
        let mut rows = Vec::new();
        self.for_each_flow(how, |id, counters| rows.push((id, *counters)))?;
        Ok(rows)
    }

    /// Hands each row of [`Observer::read_flows`] to `row` as it is read,
    /// without a table of the whole map (at 100,000 flows the monitor
    /// built two of 10 MiB each per interval). Returns how many of the
    /// rows have a part in the LRU map (its entries).
    pub fn for_each_flow(
        &self,
        how: MapRead,
        mut row: impl FnMut(FlowId, &FlowCounters),
    ) -> Result<u64, MapsError> {
        let mut merge = CacheMerge(self.read_flow_cache(how)?);
        let mut map_entries = 0;
        let mut emit = |key: &FlowKey, counters: &FlowCounters| {
            map_entries += u64::from(counters.in_map());
            row(FlowId::from_key(key), counters);
        };
        for_each_percpu_hash(&self.flow_map()?, FLOWS_MAP, how, |key, values| {
            emit(
                key,
                &merge.with_cached(key, FlowCounters::sum(values.iter())),
            );
        })?;
        for (key, counters) in merge.only_cached() {
            emit(&key, &counters);
        }
        Ok(map_entries)
    }

    /// The keys counted outside the LRU map, with their counters summed
    /// over CPUs: those held in the per-CPU flow cache, and plain traffic
    /// in the per-CPU plain counters. By batch (`how`), only the slots in
    /// use are read while no new one was put to use (`slots`).
    fn read_flow_cache(&self, how: MapRead) -> Result<FastMap<FlowKey, FlowCounters>, MapsError> {
        let mut keys: FastMap<FlowKey, FlowCounters> = FastMap::default();
        let mut add = |key: FlowKey, one: &FlowCounters| {
            let counters = keys.entry(key).or_default();
            counters.add(one);
            counters.cached = counters.tally();
        };
        let mut trackers = self.slot_reads.lock().map_err(|_| MapsError::Poisoned)?;
        let cache = self
            .ebpf
            .map(FLOW_CACHE_MAP)
            .ok_or_else(|| missing("FLOW_CACHE map missing"))?;
        for_each_slot_in_use(
            &PerCpuArray::try_from(cache)?,
            (FLOW_CACHE_MAP, FLOW_CACHE_SLOTS),
            how,
            (self.stat(Stat::FlowCacheClaims)?, &mut trackers.flow_cache),
            |slots: &[FlowCacheSlot]| slots.iter().any(|slot| slot.key.ifindex != 0),
            |_, slots| {
                for slot in slots.iter().filter(|slot| slot.key.ifindex != 0) {
                    add(slot.key, &FlowCounters::sum([&slot.value]));
                }
            },
        )?;
        let plain = self
            .ebpf
            .map(PLAIN_MAP)
            .ok_or_else(|| missing("PLAIN map missing"))?;
        for_each_slot_in_use(
            &PerCpuArray::try_from(plain)?,
            (PLAIN_MAP, PLAIN_SLOTS),
            how,
            (self.stat(Stat::PlainSlotsUsed)?, &mut trackers.plain),
            |cpus: &[PlainCounters]| cpus.iter().any(|c| c.packets != 0),
            |slot, cpus| {
                let packets = cpus.iter().map(|c| c.packets).sum();
                if packets != 0 {
                    let bytes = cpus.iter().map(|c| c.bytes).sum();
                    let plain = FlowCounters {
                        packets,
                        bytes,
                        ..FlowCounters::default()
                    };
                    add(FlowKey::of_plain_slot(slot), &plain);
                }
            },
        )?;
        Ok(keys)
    }

    /// This counter of the programs, summed over CPUs.
    fn stat(&self, stat: Stat) -> Result<u64, MapsError> {
        let stats: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(STATS_MAP)
                .ok_or_else(|| missing("STATS map missing"))?,
        )?;
        Ok(stats.get(&(stat as u32), 0)?.iter().sum())
    }

    /// Reads every row of the drop map, summed over CPUs.
    pub fn read_drops(&self) -> Result<Vec<(DropId, DropCounters)>, MapsError> {
        let map: PerCpuHashMap<&MapData, DropKey, DropValue> = PerCpuHashMap::try_from(
            self.ebpf
                .map(DROPS_MAP)
                .ok_or_else(|| missing("DROPS map missing"))?,
        )?;
        let decode = |key: &DropKey, values: &[DropValue]| {
            let mut total = DropCounters::default();
            for value in values.iter() {
                total.packets += value.packets;
                total.bytes += value.bytes;
            }
            (DropId::from_key(key), total)
        };
        read_percpu_hash(&map, DROPS_MAP, MapRead::Batch, decode)
    }

    /// Reads every key of the BGP map (TCP/179 per interface, direction
    /// and peer).
    pub fn read_bgp_wire(&self) -> Result<Vec<(WireId, WireCounters)>, MapsError> {
        let map: BpfHashMap<&MapData, BgpKey, BgpCounters> = BpfHashMap::try_from(
            self.ebpf
                .map(BGP_MAP)
                .ok_or_else(|| missing("BGP map missing"))?,
        )?;
        let rows = dedup_listing(map.iter(), |key, counters| {
            (WireId::from_key(key), WireCounters::from_value(counters))
        })
        .map_err(|source| MapsError::Read {
            map: BGP_MAP,
            source,
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, counters)| Some((id?, counters)))
            .collect())
    }

    /// Reads the kernel self counters (walks the flow map to count its
    /// entries; a caller that just read the rows uses [`Observer::stats_for`]).
    pub fn read_stats(&self) -> Result<KernelStats, MapsError> {
        let flow_entries = self.flow_map()?.keys().filter(|k| k.is_ok()).count() as u64;
        self.stats_for(flow_entries)
    }

    /// The kernel self counters, given the number of flow-map entries
    /// (what [`Observer::for_each_flow`] returns, or `rows::map_entries`
    /// of a [`Observer::read_flows`] just made), so the map is walked once
    /// per interval, not twice.
    pub fn stats_for(&self, flow_entries: u64) -> Result<KernelStats, MapsError> {
        let read = |stat: Stat| self.stat(stat);
        let flow_inserts = read(Stat::FlowInserts)?;
        Ok(KernelStats {
            flow_entries,
            flow_inserts,
            flow_evictions: flow_inserts.saturating_sub(flow_entries),
            flow_insert_failures: read(Stat::FlowInsertFailures)?,
            flow_cache_slots: read(Stat::FlowCacheClaims)?,
            flow_cache_collisions: read(Stat::FlowCacheCollisions)?,
            bgp_inserts: read(Stat::BgpInserts)?,
            probe_rx_packets: read(Stat::ProbeRxPackets)?,
            probe_tx_packets: read(Stat::ProbeTxPackets)?,
            evidence_sent: read(Stat::EvidenceSent)?,
            evidence_lost: read(Stat::EvidenceLost)?,
            evidence_rate_limited: read(Stat::EvidenceRateLimited)?,
        })
    }
}

/// The flow cache's counters, merged into the LRU map's rows of the same
/// key as they are read (a key may be in both: cached on one CPU, in the
/// map on another whose slot another key holds); what is left are the
/// keys only the cache has.
struct CacheMerge(FastMap<FlowKey, FlowCounters>);

impl CacheMerge {
    /// The LRU map's `counters` of `key` with the cache's part added.
    fn with_cached(&mut self, key: &FlowKey, mut counters: FlowCounters) -> FlowCounters {
        if !self.0.is_empty()
            && let Some(from_cache) = self.0.remove(key)
        {
            counters.add(&from_cache);
            counters.cached = from_cache.cached;
        }
        counters
    }

    /// The keys only the cache has, sorted, so that rows come out in the
    /// same order on every read.
    fn only_cached(self) -> Vec<(FlowKey, FlowCounters)> {
        let mut only_cached: Vec<(FlowKey, FlowCounters)> = self.0.into_iter().collect();
        only_cached.sort_unstable_by_key(|(key, _)| *key);
        only_cached
    }
}

/// How the programs' hash and array maps are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapRead {
    /// BPF_MAP_LOOKUP_BATCH, a few system calls for the whole map, where
    /// the kernel has it for the map (hash maps since 5.6, per-CPU arrays
    /// since 5.13); else key by key.
    Batch,
    /// Key by key: two system calls per entry.
    Walk,
}

/// Hands each index of the per-CPU array `map` (`entries` long) to
/// `entry`, with its per-CPU values.
fn for_each_percpu_array<V: Pod>(
    map: &PerCpuArray<&MapData, V>,
    name: &'static str,
    entries: u32,
    how: MapRead,
    mut entry: impl FnMut(u32, &[V]),
) -> Result<(), MapsError> {
    let batched = match how {
        // Per-CPU arrays have no batch lookup before 5.13.
        MapRead::Batch => batch::lookup_all_percpu(map.map(), possible_cpus()?, |index, values| {
            entry(*index, values)
        })
        .map_err(|source| MapsError::Batch { map: name, source })?,
        MapRead::Walk => false,
    };
    if !batched {
        for index in 0..entries {
            let values = map.get(&index, 0).map_err(|source| MapsError::ReadIndex {
                map: name,
                index,
                source,
            })?;
            entry(index, &values);
        }
    }
    Ok(())
}

/// [`for_each_percpu_array`] of a per-CPU slot array (`name`, `entries`
/// long) whose slots, once in use, stay in use: by batch, only the slots
/// seen in use when `tracker` says no slot was put to use since it last
/// saw all (`first_uses`, the programs' count of them, read just before;
/// see `slots`). `in_use` tells a slot in use by its values.
fn for_each_slot_in_use<V: Pod>(
    map: &PerCpuArray<&MapData, V>,
    (name, entries): (&'static str, u32),
    how: MapRead,
    (first_uses, tracker): (u64, &mut SlotReads),
    in_use: impl Fn(&[V]) -> bool,
    mut entry: impl FnMut(u32, &[V]),
) -> Result<(), MapsError> {
    if let (MapRead::Batch, SlotPlan::Only(slots)) = (how, tracker.plan(first_uses)) {
        for index in slots {
            let values = map.get(&index, 0).map_err(|source| MapsError::ReadIndex {
                map: name,
                index,
                source,
            })?;
            entry(index, &values);
        }
        return Ok(());
    }
    let mut used = BTreeSet::new();
    for_each_percpu_array(map, name, entries, how, |index, values| {
        if in_use(values) {
            used.insert(index);
        }
        entry(index, values);
    })?;
    tracker.read_all(first_uses, used);
    Ok(())
}

/// Reads a per-CPU hash map once (`how`), decoding each key with its
/// per-CPU values.
fn read_percpu_hash<K, V, Id, C>(
    map: &PerCpuHashMap<&MapData, K, V>,
    name: &'static str,
    how: MapRead,
    decode: impl Fn(&K, &[V]) -> (Id, C),
) -> Result<Vec<(Id, C)>, MapsError>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let mut rows = Vec::new();
    for_each_percpu_hash(map, name, how, |key, values| rows.push(decode(key, values)))?;
    Ok(rows)
}

/// Hands each key of `map` once to `entry`, with its per-CPU values.
fn for_each_percpu_hash<K, V>(
    map: &PerCpuHashMap<&MapData, K, V>,
    name: &'static str,
    how: MapRead,
    mut entry: impl FnMut(&K, &[V]),
) -> Result<(), MapsError>
where
    K: Pod + Eq + Hash,
    V: Pod,
{
    let batched = match how {
        // A batch lookup passes each bucket once, under its lock: no key
        // comes twice, unlike in a walk that the LRU restarts.
        MapRead::Batch => batch::lookup_all_percpu(map.map(), possible_cpus()?, &mut entry)
            .map_err(|source| MapsError::Batch { map: name, source })?,
        MapRead::Walk => false,
    };
    if !batched {
        let listed = dedup_listing(map.iter(), |key, values| (*key, values.to_vec()))
            .map_err(|source| MapsError::Read { map: name, source })?;
        for (key, values) in &listed {
            entry(key, values);
        }
    }
    Ok(())
}

/// The number of possible CPUs: per-CPU values come one per possible CPU.
pub(super) fn possible_cpus() -> Result<usize, MapsError> {
    aya::util::nr_cpus().map_err(|(path, error)| MapsError::PossibleCpus { path, error })
}

/// The rows of a map listing, each key once.
///
/// A key the LRU evicts while the walk stands on it makes the kernel
/// restart the walk from the first bucket, so keys already listed come
/// again: each is kept once (the first reading; both are as fresh). A key
/// evicted between listing and reading is skipped. FLOWS and DROPS share
/// this walk, so their readings cannot drift apart.
fn dedup_listing<K, Vals, Id, C>(
    listing: impl Iterator<Item = Result<(K, Vals), MapError>>,
    decode: impl Fn(&K, &Vals) -> (Id, C),
) -> Result<Vec<(Id, C)>, MapError>
where
    K: Copy + Eq + Hash,
{
    let mut rows = Vec::new();
    let mut seen = HashSet::new();
    for item in listing {
        match item {
            Ok((key, values)) => {
                if seen.insert(key) {
                    rows.push(decode(&key, &values));
                }
            }
            Err(MapError::KeyNotFound) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(rows)
}

// ----------------------------------------------------------- lookup maps

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

/// The `BLOCKS` key of a pod block: IPv4 as IPv4-mapped IPv6.
fn block_key(block: IpNet) -> (u32, [u32; 4]) {
    match block {
        IpNet::V4(v4) => (
            u32::from(v4.prefix_len()) + 96,
            v4_mapped(words(IpAddr::V4(v4.network()))[0]),
        ),
        IpNet::V6(v6) => (u32::from(v6.prefix_len()), words(IpAddr::V6(v6.network()))),
    }
}

/// The `BLOCKS` value naming `node`, reached through `proto` (`None`:
/// direct routing).
fn block_peer(node: IpAddr, proto: Option<Proto>) -> BlockPeer {
    BlockPeer {
        node: words(node),
        node_family: match node {
            IpAddr::V4(_) => family::V4,
            IpAddr::V6(_) => family::V6,
        },
        proto: proto.unwrap_or(Proto::Other) as u8,
        _pad: [0; 2],
    }
}

/// The programs' `CONFIG` words.
fn config_words(observer: &Observer) -> Result<ConfigWords, MapsError> {
    let config: Array<&MapData, ConfigWords> = Array::try_from(
        observer
            .ebpf
            .map(CONFIG_SECTION)
            .ok_or_else(|| missing("the programs' CONFIG words are missing"))?,
    )?;
    Ok(config.get(&0, 0)?)
}

/// Sets a CONFIG word; returns whether its value changed.
pub(super) fn set_config(
    observer: &mut Observer,
    index: u32,
    value: u32,
) -> Result<bool, MapsError> {
    let mut words = config_words(observer)?;
    if words[index as usize] == value {
        return Ok(false);
    }
    words[index as usize] = value;
    let mut config: Array<&mut MapData, ConfigWords> = Array::try_from(
        observer
            .ebpf
            .map_mut(CONFIG_SECTION)
            .ok_or_else(|| missing("the programs' CONFIG words are missing"))?,
    )?;
    // The whole value is rewritten; the programs read one aligned word at
    // a time, so a reader sees each word old or new, never torn.
    config.set(0, words, 0)?;
    Ok(true)
}

fn set_switch(observer: &mut Observer, index: u32, on: bool) -> Result<bool, MapsError> {
    set_config(observer, index, u32::from(on))
}

/// Voids the node facts the programs cached per flow (allow-set verdicts,
/// unknown VNIs, interface MTUs): the next packet of every flow decides
/// them again from the maps. Called after the maps changed. At load it
/// starts the first generation (0, "none decided", becomes 1), under
/// which the programs cache facts at all.
pub(super) fn next_facts_generation(observer: &mut Observer) -> Result<(), MapsError> {
    let current = config_words(observer)?[config::FACTS_GENERATION as usize];
    // Never 0 (which means "none decided"), and within the bits the
    // programs store it in.
    let next = (current % KeyFacts::MAX_GENERATION) + 1;
    set_config(observer, config::FACTS_GENERATION, next)?;
    Ok(())
}

/// Replaces the contents of one LPM trie with `prefixes` (inserting the new
/// ones before removing stale ones, so no moment lets everything through);
/// returns whether anything changed.
fn sync_trie<K: aya::Pod + Ord>(
    observer: &mut Observer,
    map: &'static str,
    prefixes: impl Iterator<Item = (u32, K)>,
) -> Result<bool, MapsError> {
    let mut trie: LpmTrie<&mut MapData, K, u8> = LpmTrie::try_from(
        observer
            .ebpf
            .map_mut(map)
            .ok_or_else(|| missing(format!("{map} missing")))?,
    )?;
    let wanted: BTreeSet<(u32, K)> = prefixes.collect();
    let present: BTreeSet<(u32, K)> = trie
        .keys()
        .filter_map(|k| k.ok())
        .map(|k| (k.prefix_len(), k.data()))
        .collect();
    for (len, data) in wanted.difference(&present) {
        trie.insert(&Key::new(*len, *data), 1, 0)
            .map_err(|source| MapsError::AddPrefix { map, source })?;
    }
    for (len, data) in present.difference(&wanted) {
        trie.remove(&Key::new(*len, *data))?;
    }
    Ok(wanted != present)
}

impl Observer {
    /// Writes the allow-sets of `snapshot` into the tries and switches.
    pub fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<(), MapsError> {
        apply_allow_sets(self, snapshot)
    }

    /// Writes the VNIs of the local vxlan devices (see [`apply_local_vnis`]).
    pub fn apply_local_vnis(&mut self, vnis: &[u32]) -> Result<(), MapsError> {
        apply_local_vnis(self, vnis)
    }
}

/// Writes the allow-sets of `snapshot` into the tries and switches, and
/// voids the cached verdicts when anything changed.
fn apply_allow_sets(observer: &mut Observer, snapshot: &AllowSets) -> Result<(), MapsError> {
    let mut changed = false;
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
        changed |= sync_trie(
            observer,
            v4_map,
            set.prefixes.iter().filter_map(|p| match p {
                IpNet::V4(n) => {
                    Some((u32::from(n.prefix_len()), words(IpAddr::V4(n.network()))[0]))
                }
                IpNet::V6(_) => None,
            }),
        )?;
        changed |= sync_trie(
            observer,
            v6_map,
            set.prefixes.iter().filter_map(|p| match p {
                IpNet::V6(n) => Some((u32::from(n.prefix_len()), words(IpAddr::V6(n.network())))),
                IpNet::V4(_) => None,
            }),
        )?;
        changed |= set_switch(observer, v4_switch, set.ipv4)?;
        changed |= set_switch(observer, v6_switch, set.ipv6)?;
    }
    if changed {
        next_facts_generation(observer)?;
    }
    Ok(())
}

/// Writes the local VNIs; the VNI check is on only when there is at least
/// one local vxlan device (otherwise every VXLAN packet would be flagged).
fn apply_local_vnis(observer: &mut Observer, vnis: &[u32]) -> Result<(), MapsError> {
    let mut map: BpfHashMap<&mut MapData, u32, u8> = BpfHashMap::try_from(
        observer
            .ebpf
            .map_mut(LOCAL_VNIS_MAP)
            .ok_or_else(|| missing("LOCAL_VNIS map missing"))?,
    )?;
    let present: Vec<u32> = map.keys().filter_map(|k| k.ok()).collect();
    let mut changed = false;
    for vni in vnis.iter().filter(|v| !present.contains(v)) {
        map.insert(*vni, 1, 0).map_err(MapsError::AddVni)?;
        changed = true;
    }
    for stale in present.iter().filter(|v| !vnis.contains(v)) {
        map.remove(stale)?;
        changed = true;
    }
    changed |= set_switch(observer, config::VNI_CHECK, !vnis.is_empty())?;
    if changed {
        next_facts_generation(observer)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use observer_common::{ClassifierDrop, Proto};

    use super::*;
    use crate::model::aggregate::DropAggregator;
    use crate::model::rows::Tally;

    #[test]
    fn a_cache_slot_holds_its_own_key_and_no_other() {
        let key = FlowKey {
            peer: [0x0a00_0001, 0x0203_0405, 0xfeed_beef, 7],
            ifindex: 3,
            vni: 4096,
            direction: 1,
            proto: Proto::Vxlan as u8,
            peer_family: observer_common::family::V6,
            reason: 0,
        };
        let slot = FlowCacheSlot {
            key,
            facts: KeyFacts::default(),
            _pad: 0,
            value: FlowValue::default(),
        };
        assert!(slot.holds(&key));
        // Each field, changed alone.
        let changed: [fn(&mut FlowKey); 10] = [
            |k| k.peer[0] ^= 1,
            |k| k.peer[1] ^= 1 << 31,
            |k| k.peer[2] ^= 1 << 8,
            |k| k.peer[3] ^= 1,
            |k| k.ifindex += 1,
            |k| k.vni ^= 1 << 23,
            |k| k.direction ^= 1,
            |k| k.proto = Proto::Geneve as u8,
            |k| k.peer_family = observer_common::family::V4,
            |k| k.reason = 1,
        ];
        for (i, change) in changed.iter().enumerate() {
            let mut other = key;
            change(&mut other);
            assert!(!slot.holds(&other), "field change {i}");
        }
    }

    #[test]
    fn key_facts_are_current_only_under_their_generation() {
        use observer_common::checks::FlowFacts;
        let every = [
            FlowFacts::default(),
            FlowFacts {
                outside_allow_set: true,
                vni_unknown: false,
                mtu: 1450,
            },
            FlowFacts {
                outside_allow_set: false,
                vni_unknown: true,
                mtu: 65536,
            },
            FlowFacts {
                outside_allow_set: true,
                vni_unknown: true,
                mtu: 0,
            },
        ];
        for facts in every {
            for generation in [1, 2, KeyFacts::MAX_GENERATION] {
                let cached = KeyFacts::decided(generation, &facts);
                assert_eq!(cached.current(generation), Some(facts));
                assert_eq!(cached.facts(), facts);
                assert_eq!(
                    cached.current(generation % KeyFacts::MAX_GENERATION + 1),
                    None
                );
                // 0 is "none decided": never current, whatever was stored.
                assert_eq!(cached.current(0), None);
            }
        }
        // A free slot's facts were never decided.
        assert_eq!(KeyFacts::default().current(1), None);
    }

    #[test]
    fn plain_frames_have_one_plain_slot_per_interface_and_direction() {
        use observer_common::{
            Direction, PLAIN_IFINDEX_LIMIT, Unclassified,
            parse::{PortTable, SliceFrame, classify},
        };
        struct NoTunnelPorts;
        impl PortTable for NoTunnelPorts {
            fn tag(&self, _: u16) -> u8 {
                0
            }
        }
        // Ethernet, IPv4 10.0.0.1 -> 10.0.0.2, UDP 40000 -> 53.
        let mut frame = vec![0u8; 14 + 20 + 8];
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame[14] = 0x45;
        frame[16..18].copy_from_slice(&28u16.to_be_bytes());
        frame[23] = 17;
        frame[26..30].copy_from_slice(&[10, 0, 0, 1]);
        frame[30..34].copy_from_slice(&[10, 0, 0, 2]);
        frame[34..36].copy_from_slice(&40000u16.to_be_bytes());
        frame[36..38].copy_from_slice(&53u16.to_be_bytes());
        for direction in [Direction::Rx, Direction::Tx] {
            let c = classify(&SliceFrame(&frame), direction, &NoTunnelPorts);
            let key = FlowKey::of(7, direction, &c);
            assert_eq!(key, FlowKey::plain(7, direction));
            let slot = key.plain_slot().expect("a plain slot");
            assert_eq!(FlowKey::of_plain_slot(slot), key);
        }
        let last = FlowKey::plain(PLAIN_IFINDEX_LIMIT - 1, Direction::Tx);
        assert_eq!(last.plain_slot(), Some(PLAIN_SLOTS - 1));
        assert_eq!(
            FlowKey::plain(PLAIN_IFINDEX_LIMIT, Direction::Rx).plain_slot(),
            None,
            "higher interface indexes take the flow cache"
        );
        let tunnel = FlowKey {
            proto: Proto::Vxlan as u8,
            ..FlowKey::plain(7, Direction::Rx)
        };
        let truncated = FlowKey {
            reason: Unclassified::TruncatedL4 as u8,
            ..FlowKey::plain(7, Direction::Rx)
        };
        assert_eq!((tunnel.plain_slot(), truncated.plain_slot()), (None, None));
    }

    #[test]
    fn words_are_network_order_in_memory() {
        let w = words("10.10.60.127".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [10, 10, 60, 127]);
        assert_eq!(&w[1..], &[0, 0, 0]);
        let w = words("2001:db8::1".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(w[3].to_ne_bytes(), [0, 0, 0, 1]);
    }

    #[test]
    fn cached_counters_join_the_map_row_of_their_key() {
        let key = |last_octet: u8| FlowKey {
            peer: words(IpAddr::from([10, 10, 60, last_octet])),
            ifindex: 2,
            vni: 4096,
            direction: 0,
            proto: Proto::Vxlan as u8,
            peer_family: observer_common::family::V4,
            reason: 0,
        };
        let counters = |packets: u64, cached: bool| FlowCounters {
            packets,
            bytes: packets * 100,
            cached: if cached {
                Tally::counts(packets, packets * 100)
            } else {
                Tally::default()
            },
            ..FlowCounters::default()
        };
        let lru = vec![(key(1), counters(5, false)), (key(2), counters(7, false))];
        let cached = FastMap::from_iter([(key(3), counters(4, true)), (key(1), counters(3, true))]);
        let mut merge = CacheMerge(cached);
        let mut merged: Vec<(FlowKey, FlowCounters)> = lru
            .into_iter()
            .map(|(key, c)| (key, merge.with_cached(&key, c)))
            .collect();
        merged.extend(merge.only_cached());
        let rows: Vec<(FlowId, u64, u64, (u64, u64))> = merged
            .iter()
            .map(|(key, c)| {
                let cached = (c.cached.packets, c.cached.bytes);
                (FlowId::from_key(key), c.packets, c.bytes, cached)
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (FlowId::from_key(&key(1)), 8, 800, (3, 300)),
                (FlowId::from_key(&key(2)), 7, 700, (0, 0)),
                (FlowId::from_key(&key(3)), 4, 400, (4, 400)),
            ]
        );
    }

    #[test]
    fn a_key_listed_again_after_a_restart_counts_once() {
        // The kernel listed keys 1 and 2, restarted from the first bucket
        // after an eviction, and listed 1 and 2 again, then 3; key 4 was
        // evicted between listing and reading.
        let listing = vec![
            Ok((1u32, 10u64)),
            Ok((2, 20)),
            Ok((1, 11)),
            Ok((2, 21)),
            Err(MapError::KeyNotFound),
            Ok((3, 30)),
        ];
        let rows = dedup_listing(listing.into_iter(), |k, v| (*k, *v)).unwrap();
        assert_eq!(rows, vec![(1, 10), (2, 20), (3, 30)]);
    }

    /// The DROPS walk's old bug: without de-duplication, a key listed twice
    /// made a read look complete, so a key that had left the map kept its
    /// kernel baseline and, re-created, lost the packets below it.
    #[test]
    fn drop_counts_stay_exact_when_a_restart_lists_a_key_twice() {
        let key = |last_octet: u8| DropKey {
            peer: words(IpAddr::from([10, 10, 60, last_octet])),
            ifindex: 2,
            vni: 4096,
            reason: ClassifierDrop::CalicoAllowSet as u32,
            origin: observer_common::drop_origin::CLASSIFIER,
            proto: Proto::Vxlan as u8,
            peer_family: observer_common::family::V4,
            stage: observer_common::stage::UNDERLAY,
            direction: 0,
            _pad: [0; 7],
            location: 0,
        };
        let (a, b, c) = (key(1), key(2), key(3));
        let read = |listing: Vec<(DropKey, u64)>| {
            dedup_listing(listing.into_iter().map(Ok), |k: &DropKey, packets: &u64| {
                let counters = DropCounters {
                    packets: *packets,
                    bytes: packets * 100,
                };
                (DropId::from_key(k), counters)
            })
            .unwrap()
        };
        let mut drops = DropAggregator::new(100);
        drops.update(&read(vec![(a, 10), (b, 100)]));
        // b was evicted; an eviction during the walk restarted it, so a is
        // listed twice; c is new.
        drops.update(&read(vec![(a, 10), (c, 5), (a, 10)]));
        // b is back, re-created, and counted 150 since.
        drops.update(&read(vec![(a, 10), (b, 150), (c, 5)]));
        let mut totals: Vec<(u64, u64)> = drops
            .finish_interval(1.0)
            .iter()
            .map(|row| (row.packets, row.bytes))
            .collect();
        totals.sort_unstable();
        assert_eq!(totals, [(5, 500), (10, 1000), (250, 25000)]);
    }

    #[test]
    fn other_errors_end_the_walk() {
        let listing = vec![
            Ok((1u32, 1u64)),
            Err(MapError::InvalidName { name: "x".into() }),
        ];
        assert!(dedup_listing(listing.into_iter(), |k, v| (*k, *v)).is_err());
    }
}
