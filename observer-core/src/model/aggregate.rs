//! Turns successive reads of the kernel's flow map into totals that never
//! go backwards (also when the LRU evicts and re-creates a key) and into
//! per-interval rates. Bounded: at most `max_rows` rows are kept; the
//! longest-idle rows are forgotten first and counted.

use std::{hash::Hash, net::IpAddr};

use crate::model::{
    read_order::ReadOrderMap,
    rows::{DropCounters, DropId, FlowCounters, FlowId, Row, Tally},
};

/// Counters the aggregator can fold: packets, bytes, inner TCP signals
/// and an optional inner address sample.
pub trait Counters {
    /// The counters as read from the kernel.
    fn totals(&self) -> Tally;
    /// The same totals split by the kernel store holding them; each part
    /// is monotonic until its store loses the key (the LRU map part may be
    /// evicted while the flow-cache part stays).
    fn parts(&self) -> [Tally; 2] {
        [self.totals(), Tally::default()]
    }
    /// Inner (source, destination) sample, when there is one.
    fn inner(&self) -> Option<(IpAddr, IpAddr)> {
        None
    }
}

impl Counters for FlowCounters {
    fn totals(&self) -> Tally {
        self.tally()
    }
    fn inner(&self) -> Option<(IpAddr, IpAddr)> {
        self.inner
    }
    fn parts(&self) -> [Tally; 2] {
        // The cache part is part of the totals by construction.
        let map = self.tally().since(&self.cached).unwrap_or_default();
        [map, self.cached]
    }
}

impl Counters for DropCounters {
    fn totals(&self) -> Tally {
        Tally::counts(self.packets, self.bytes)
    }
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Kernel values at the previous read, per store (see [`Counters::parts`]).
    kernel: [Tally; 2],
    /// Totals since attach.
    total: Tally,
    /// Totals at the start of the current interval.
    interval_start: Tally,
    inner: Option<(IpAddr, IpAddr)>,
    /// Update number in which the row last moved.
    last_moved: u64,
    /// Update number of the last read that had the row.
    read: u64,
}

/// Monotonic per-row totals.
#[derive(Debug)]
pub struct Aggregator<K = FlowId> {
    /// In read order: a read finds each row right after the previous one.
    rows: ReadOrderMap<K, State>,
    max_rows: usize,
    generation: u64,
    /// Rows in the read under way.
    read_rows: usize,
    forgotten_rows: u64,
}

/// Aggregator of drop rows.
pub type DropAggregator = Aggregator<DropId>;

impl<K: Copy + Eq + Hash + Ord> Aggregator<K> {
    /// An aggregator keeping at most `max_rows` rows (at least 1).
    pub fn new(max_rows: usize) -> Self {
        Aggregator {
            rows: ReadOrderMap::default(),
            max_rows: max_rows.max(1),
            generation: 0,
            read_rows: 0,
            forgotten_rows: 0,
        }
    }

    /// Rows forgotten because more than `max_rows` existed.
    pub fn forgotten_rows(&self) -> u64 {
        self.forgotten_rows
    }

    /// Folds in one read of the kernel map. A kernel value smaller than the
    /// previous read means the key was evicted and re-created: the new value
    /// is all new traffic.
    pub fn update<C: Counters>(&mut self, read: &[(K, C)]) {
        self.begin_read();
        for (id, counters) in read {
            self.add(*id, counters);
        }
        self.end_read();
    }

    /// Starts a read that [`Aggregator::add`] feeds row by row, as the map
    /// is read, and [`Aggregator::end_read`] ends ([`Aggregator::update`]
    /// with no table of the read).
    pub fn begin_read(&mut self) {
        self.generation += 1;
        self.read_rows = 0;
        self.rows.rewind();
    }

    /// Folds in one row of the read under way (each key once per read).
    pub fn add<C: Counters>(&mut self, id: K, counters: &C) {
        self.read_rows += 1;
        let state = self.rows.get_or_insert_with(id, State::default);
        state.read = self.generation;
        let mut delta = Tally::default();
        for (now, kernel) in counters.parts().into_iter().zip(&mut state.kernel) {
            let moved = now.since(kernel).unwrap_or(now);
            *kernel = now;
            delta.add(&moved);
        }
        state.total.add(&delta);
        if delta != Tally::default() {
            state.last_moved = self.generation;
        }
        if let Some(inner) = counters.inner() {
            state.inner = Some(inner);
        }
    }

    /// Ends the read under way.
    pub fn end_read(&mut self) {
        // Keys gone from the kernel map keep their totals, but their kernel
        // baseline resets so a re-created key counts from zero.
        if self.read_rows < self.rows.len() {
            for (_, state) in self.rows.iter_mut() {
                if state.read != self.generation {
                    state.kernel = [Tally::default(); 2];
                }
            }
        }
        self.evict_idle();
    }

    fn evict_idle(&mut self) {
        let excess = self.rows.len().saturating_sub(self.max_rows);
        if excess == 0 {
            return;
        }
        let mut by_idle: Vec<(u64, K)> = self
            .rows
            .iter()
            .map(|(id, s)| (s.last_moved, *id))
            .collect();
        // The `excess` longest idle (ties broken by key): those up to the
        // cut, as keys are unique.
        let (_, &mut cut, _) = by_idle.select_nth_unstable(excess - 1);
        self.rows.retain(|id, s| (s.last_moved, *id) > cut);
        self.forgotten_rows += excess as u64;
    }

    /// Ends the current interval of length `seconds` and returns every row
    /// with its rate over that interval, in the order rows were first read
    /// (which keeps the textfile export's passes in read order too): what
    /// is shown is sorted where it is shown
    /// ([`crate::model::rows::by_rate`]), which at 100,000 rows is far
    /// fewer than all of them.
    pub fn finish_interval(&mut self, seconds: f64) -> Vec<Row<K>> {
        let seconds = if seconds > 0.0 { seconds } else { 1.0 };
        self.rows
            .iter_mut()
            .map(|(id, state)| {
                // Totals only grow: the interval's part is never negative.
                let interval = state.total.since(&state.interval_start).unwrap_or_default();
                state.interval_start = state.total;
                Row {
                    id: *id,
                    packets: state.total.packets,
                    bytes: state.total.bytes,
                    pps: interval.packets as f64 / seconds,
                    bps: interval.bytes as f64 * 8.0 / seconds,
                    inner: state.inner,
                    interval_packets: interval.packets,
                    tcp: state.total.tcp,
                    interval_tcp: interval.tcp,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::by_rate;
    use observer_common::{Direction, Proto, TcpCounts, Unclassified};

    fn id(peer: &str) -> FlowId {
        FlowId {
            ifindex: 2,
            direction: Direction::Rx,
            proto: Proto::Vxlan,
            reason: Unclassified::None,
            peer: Some(peer.parse().unwrap()),
            vni: 4096,
        }
    }

    fn c(packets: u64, bytes: u64) -> FlowCounters {
        FlowCounters {
            packets,
            bytes,
            ..FlowCounters::default()
        }
    }

    /// A key counted on one CPU in its flow-cache slot and on another in
    /// the LRU map: the map part is evicted and re-created while the cache
    /// part keeps growing, and the summed reading even stays flat once.
    #[test]
    fn cache_and_map_parts_of_a_key_count_each_packet_once() {
        let both = |map: (u64, u64), cached: (u64, u64)| FlowCounters {
            packets: map.0 + cached.0,
            bytes: map.1 + cached.1,
            cached: Tally::counts(cached.0, cached.1),
            ..FlowCounters::default()
        };
        let mut agg = Aggregator::new(10);
        agg.update(&[(id("10.0.0.1"), both((5, 500), (10, 1000)))]);
        // Evicted from the map (5 counted there), 2 since; 3 more cached.
        agg.update(&[(id("10.0.0.1"), both((2, 200), (13, 1300)))]);
        // Gone from the map; 1 more cached.
        agg.update(&[(id("10.0.0.1"), both((0, 0), (14, 1400)))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!((rows[0].packets, rows[0].bytes), (21, 2100));
    }

    /// Inner TCP signals are kept like packets: across an eviction of the
    /// map part, and per interval.
    #[test]
    fn tcp_signals_survive_evictions_and_are_counted_per_interval() {
        let syns = |packets: u64, syn: u64| FlowCounters {
            packets,
            bytes: packets * 100,
            tcp: TcpCounts {
                syn,
                rst: 1,
                ..TcpCounts::NONE
            },
            ..FlowCounters::default()
        };
        let mut agg = Aggregator::new(10);
        agg.update(&[(id("10.0.0.1"), syns(4, 3))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!((rows[0].tcp.syn, rows[0].interval_tcp.syn), (3, 3));
        // Evicted and re-created: 2 SYNs since.
        agg.update(&[(id("10.0.0.1"), syns(2, 2))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!((rows[0].tcp.syn, rows[0].interval_tcp.syn), (5, 2));
        assert_eq!((rows[0].tcp.rst, rows[0].interval_tcp.rst), (2, 1));
        agg.update(&[(id("10.0.0.1"), syns(2, 2))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!(
            (rows[0].tcp.syn, rows[0].interval_tcp),
            (5, TcpCounts::NONE)
        );
    }

    #[test]
    fn totals_follow_kernel_counters_and_rates_use_the_interval() {
        let mut agg = Aggregator::new(10);
        agg.update(&[(id("10.0.0.1"), c(10, 1000))]);
        let rows = agg.finish_interval(2.0);
        assert_eq!((rows[0].packets, rows[0].bytes), (10, 1000));
        assert_eq!(rows[0].pps, 5.0);
        assert_eq!(rows[0].bps, 4000.0);
        agg.update(&[(id("10.0.0.1"), c(14, 1400))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!((rows[0].packets, rows[0].pps), (14, 4.0));
        assert!(rows[0].changed());
        agg.update(&[(id("10.0.0.1"), c(14, 1400))]);
        let rows = agg.finish_interval(1.0);
        assert!(!rows[0].changed());
        assert_eq!(rows[0].pps, 0.0);
    }

    #[test]
    fn eviction_and_recreation_never_makes_totals_go_backwards() {
        let mut agg = Aggregator::new(10);
        agg.update(&[(id("10.0.0.1"), c(100, 10_000))]);
        // Key evicted: absent from the read, totals kept.
        agg.update::<FlowCounters>(&[]);
        let rows = agg.finish_interval(1.0);
        assert_eq!(rows[0].packets, 100);
        // Re-created with a smaller kernel value: counted as new traffic.
        agg.update(&[(id("10.0.0.1"), c(3, 300))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!((rows[0].packets, rows[0].bytes), (103, 10_300));
    }

    #[test]
    fn recreated_key_larger_than_before_counts_from_zero() {
        let mut agg = Aggregator::new(10);
        agg.update(&[(id("10.0.0.1"), c(5, 500))]);
        agg.update::<FlowCounters>(&[]);
        agg.update(&[(id("10.0.0.1"), c(7, 700))]);
        let rows = agg.finish_interval(1.0);
        assert_eq!(rows[0].packets, 12);
    }

    #[test]
    fn rows_are_bounded_and_idle_ones_forgotten_first() {
        let mut agg = Aggregator::new(2);
        agg.update(&[(id("10.0.0.1"), c(1, 1)), (id("10.0.0.2"), c(1, 1))]);
        agg.update(&[
            (id("10.0.0.1"), c(1, 1)),
            (id("10.0.0.2"), c(2, 2)),
            (id("10.0.0.3"), c(1, 1)),
        ]);
        let rows = agg.finish_interval(1.0);
        assert_eq!(rows.len(), 2);
        assert_eq!(agg.forgotten_rows(), 1);
        let peers: Vec<_> = rows
            .iter()
            .map(|r| r.id.peer.unwrap().to_string())
            .collect();
        assert!(!peers.contains(&"10.0.0.1".to_string()), "{peers:?}");
    }

    /// Reads come in any order, with keys new, gone and back: each key
    /// keeps one row and its own totals, also across a forgetting (which
    /// moves rows and indexes them again).
    #[test]
    fn every_read_order_finds_each_keys_own_row() {
        let totals = |agg: &mut Aggregator| {
            let mut rows: Vec<(String, u64)> = agg
                .finish_interval(1.0)
                .iter()
                .map(|r| (r.id.peer.unwrap().to_string(), r.packets))
                .collect();
            rows.sort();
            rows
        };
        let peer = |n: u64| id(&format!("10.0.0.{n}"));
        let mut agg = Aggregator::new(4);
        agg.update(&[(peer(1), c(1, 1)), (peer(2), c(2, 2)), (peer(3), c(3, 3))]);
        // Reversed, a new key in the middle, the first one gone.
        agg.update(&[
            (peer(3), c(30, 30)),
            (peer(4), c(4, 4)),
            (peer(2), c(20, 20)),
        ]);
        assert_eq!(
            totals(&mut agg),
            [
                ("10.0.0.1".to_string(), 1),
                ("10.0.0.2".to_string(), 20),
                ("10.0.0.3".to_string(), 30),
                ("10.0.0.4".to_string(), 4),
            ]
        );
        // A fifth key: the idlest (10.0.0.1, gone) is forgotten, and the
        // rows after it move.
        agg.update(&[
            (peer(5), c(5, 5)),
            (peer(2), c(21, 21)),
            (peer(3), c(30, 30)),
            (peer(4), c(6, 6)),
        ]);
        assert_eq!(agg.forgotten_rows(), 1);
        agg.update(&[(peer(4), c(7, 7)), (peer(3), c(31, 31)), (peer(5), c(8, 8))]);
        assert_eq!(
            totals(&mut agg),
            [
                ("10.0.0.2".to_string(), 21),
                ("10.0.0.3".to_string(), 31),
                ("10.0.0.4".to_string(), 7),
                ("10.0.0.5".to_string(), 8),
            ]
        );
    }

    #[test]
    fn rows_sort_by_rate_then_bytes_then_identity() {
        let mut agg = Aggregator::new(10);
        agg.update(&[
            (id("10.0.0.1"), c(1, 100)),
            (id("10.0.0.2"), c(5, 50)),
            (id("10.0.0.3"), c(1, 200)),
            (id("10.0.0.0"), c(1, 100)),
        ]);
        let mut rows = agg.finish_interval(1.0);
        rows.sort_by(by_rate);
        let peers: Vec<String> = rows
            .iter()
            .map(|r| r.id.peer.unwrap().to_string())
            .collect();
        assert_eq!(peers, ["10.0.0.2", "10.0.0.3", "10.0.0.0", "10.0.0.1"]);
    }
}
