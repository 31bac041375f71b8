//! Pod blocks over time: which blocks this node routed to another node,
//! which of them lost that route and since when, and how long each outage
//! lasted. Fed the data-plane view's block routes whenever the view
//! changes (times are inputs); read by the anomaly engine
//! (`route_missing`), the `routes` and `route_outage` lines and
//! `observer_route_outage_seconds`.

use std::{collections::BTreeMap, net::IpAddr};

use ipnet::IpNet;
use serde::Serialize;

use crate::model::dataplane::BlockRoute;

/// Missing blocks remembered; beyond it the longest-missing ones are
/// forgotten (and counted). Blocks routed now are always kept: there are
/// as many as the node's routing table holds, which its own routing
/// daemons write.
pub const MAX_BLOCKS: usize = 16_384;

/// A block missing this long is forgotten: its node was most likely
/// decommissioned, and an outage of hours is no recovery time to report.
pub const FORGET_AFTER_S: f64 = 6.0 * 3600.0;

/// A block that had a route to a node and has none now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissingBlock {
    /// The block.
    pub block: IpNet,
    /// The node it was routed to.
    pub node: IpAddr,
    /// When the route went (the caller's clock, seconds).
    #[serde(skip)]
    pub since: f64,
    /// The route as last seen.
    pub last_route: BlockRoute,
}

/// A block whose route came back: how long it had none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outage {
    /// The block.
    pub block: IpNet,
    /// The node it was routed to before the outage.
    pub node: IpAddr,
    /// The node it is routed to now (another one, when the block moved).
    pub now_via: Option<IpAddr>,
    /// How long the block had no route, in seconds.
    pub duration_s: f64,
}

/// What changed in one update.
#[derive(Debug, Default, PartialEq)]
pub struct RouteChanges {
    /// Blocks whose route is new or different (all of them the first time).
    pub changed: Vec<BlockRoute>,
    /// Blocks that had a route and have none now.
    pub withdrawn: Vec<IpNet>,
    /// Outages that ended.
    pub outages: Vec<Outage>,
}

/// Follows the block routes of successive views.
#[derive(Debug, Default)]
pub struct RouteTracker {
    /// The routes of the previous update, by block.
    current: BTreeMap<IpNet, BlockRoute>,
    /// Blocks routed to a node now or at some point, and since when they
    /// have had no route (`None`: routed now).
    routed: BTreeMap<IpNet, Remembered>,
    /// Blocks forgotten because of [`MAX_BLOCKS`] or [`FORGET_AFTER_S`].
    forgotten: u64,
}

#[derive(Debug)]
struct Remembered {
    node: IpAddr,
    route: BlockRoute,
    missing_since: Option<f64>,
}

impl RouteTracker {
    /// Folds in the block routes of a new view at `now`; returns what
    /// changed.
    pub fn update(&mut self, now: f64, blocks: &[BlockRoute]) -> RouteChanges {
        let mut changes = RouteChanges::default();
        let next: BTreeMap<IpNet, BlockRoute> =
            blocks.iter().map(|b| (b.block, b.clone())).collect();
        for (block, route) in &next {
            if self.current.get(block) != Some(route) {
                changes.changed.push(route.clone());
            }
        }
        changes.withdrawn = self
            .current
            .keys()
            .filter(|b| !next.contains_key(b))
            .copied()
            .collect();
        for (block, remembered) in &mut self.routed {
            let now_via = next.get(block).and_then(BlockRoute::any_node);
            match (remembered.missing_since, now_via) {
                (None, None) => remembered.missing_since = Some(now),
                (Some(since), Some(via)) => {
                    changes.outages.push(Outage {
                        block: *block,
                        node: remembered.node,
                        now_via: Some(via),
                        // Milliseconds: the clock's sums of floating
                        // seconds carry noise below that.
                        duration_s: ((now - since) * 1000.0).round() / 1000.0,
                    });
                    remembered.missing_since = None;
                }
                _ => {}
            }
        }
        for route in next.values() {
            let Some(node) = route.any_node() else {
                continue;
            };
            let remembered = self.routed.entry(route.block).or_insert(Remembered {
                node,
                route: route.clone(),
                missing_since: None,
            });
            remembered.node = node;
            remembered.route = route.clone();
        }
        self.expire(now);
        self.current = next;
        changes
    }

    /// Blocks routed to a node before and without a route now.
    pub fn missing(&self) -> Vec<MissingBlock> {
        self.routed
            .iter()
            .filter_map(|(block, r)| {
                Some(MissingBlock {
                    block: *block,
                    node: r.node,
                    since: r.missing_since?,
                    last_route: r.route.clone(),
                })
            })
            .collect()
    }

    /// The block routes as last seen.
    pub fn current(&self) -> impl Iterator<Item = &BlockRoute> {
        self.current.values()
    }

    /// Blocks forgotten (missing too long, or beyond [`MAX_BLOCKS`]).
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Forgets blocks missing for [`FORGET_AFTER_S`], then the
    /// longest-missing ones beyond [`MAX_BLOCKS`] missing; never a block
    /// routed now. True when it forgot one. [`RouteTracker::update`] does
    /// it too; between two views (which come only when the data plane
    /// changes) the caller runs it alone: one pass over the remembered
    /// blocks, no copy or comparison of routes.
    pub fn expire(&mut self, now: f64) -> bool {
        let before = self.routed.len();
        self.routed
            .retain(|_, r| r.missing_since.is_none_or(|s| now - s < FORGET_AFTER_S));
        let mut missing: Vec<(f64, IpNet)> = self
            .routed
            .iter()
            .filter_map(|(b, r)| Some((r.missing_since?, *b)))
            .collect();
        let over = missing.len().saturating_sub(MAX_BLOCKS);
        if over > 0 {
            missing.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for (_, block) in missing.into_iter().take(over) {
                self.routed.remove(&block);
            }
        }
        let forgotten = before - self.routed.len();
        self.forgotten += forgotten as u64;
        forgotten > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dataplane::NextHop;

    fn via(block: &str, node: &str) -> BlockRoute {
        BlockRoute {
            block: block.parse().unwrap(),
            origin: 12,
            blackhole: false,
            next_hops: vec![NextHop {
                device: "eth0".into(),
                gateway: Some(node.parse().unwrap()),
                encap: None,
                node: Some(node.parse().unwrap()),
            }],
        }
    }

    fn blackhole(block: &str) -> BlockRoute {
        BlockRoute {
            block: block.parse().unwrap(),
            origin: 12,
            blackhole: true,
            next_hops: Vec::new(),
        }
    }

    #[test]
    fn a_withdrawn_block_is_missing_until_it_returns_with_its_outage() {
        let mut tracker = RouteTracker::default();
        let own = blackhole("10.65.1.0/26");
        let b = via("10.65.2.0/26", "10.99.0.2");
        let first = tracker.update(0.0, &[own.clone(), b.clone()]);
        assert_eq!(first.changed, vec![own.clone(), b.clone()]);
        assert!(tracker.missing().is_empty());

        // Unchanged: nothing to say.
        assert_eq!(
            tracker.update(1.0, &[own.clone(), b.clone()]),
            RouteChanges::default()
        );

        let gone = tracker.update(2.0, std::slice::from_ref(&own));
        assert_eq!(gone.withdrawn, vec![b.block]);
        let missing = tracker.missing();
        assert_eq!(missing.len(), 1);
        assert_eq!(
            (missing[0].block, missing[0].node, missing[0].since),
            (b.block, "10.99.0.2".parse().unwrap(), 2.0)
        );
        // Still missing: the start stays.
        tracker.update(5.0, std::slice::from_ref(&own));
        assert_eq!(tracker.missing()[0].since, 2.0);

        let back = tracker.update(9.5, &[own, b.clone()]);
        assert_eq!(back.changed, vec![b.clone()]);
        assert_eq!(
            back.outages,
            vec![Outage {
                block: b.block,
                node: "10.99.0.2".parse().unwrap(),
                now_via: Some("10.99.0.2".parse().unwrap()),
                duration_s: 7.5,
            }]
        );
        assert!(tracker.missing().is_empty());
    }

    #[test]
    fn own_blocks_and_blackholed_blocks_are_never_missing_but_a_blackholed_peer_block_is() {
        let mut tracker = RouteTracker::default();
        tracker.update(0.0, &[blackhole("10.65.1.0/26")]);
        tracker.update(1.0, &[]);
        assert!(tracker.missing().is_empty(), "never routed to a node");

        let b = via("10.65.2.0/26", "10.99.0.2");
        tracker.update(2.0, std::slice::from_ref(&b));
        // A blackhole for a block that was routed to a node: traffic to it
        // is dropped here, the block is missing.
        tracker.update(3.0, &[blackhole("10.65.2.0/26")]);
        assert_eq!(tracker.missing().len(), 1);
    }

    #[test]
    fn a_block_routed_to_two_nodes_at_once_is_not_missing() {
        let mut tracker = RouteTracker::default();
        tracker.update(0.0, &[via("10.65.2.0/26", "10.99.0.2")]);
        let mut ecmp = via("10.65.2.0/26", "10.99.0.2");
        ecmp.next_hops
            .extend(via("10.65.2.0/26", "10.99.0.3").next_hops);
        let changes = tracker.update(1.0, &[ecmp]);
        assert!(changes.outages.is_empty());
        assert!(tracker.missing().is_empty());
    }

    #[test]
    fn a_block_that_moves_to_another_node_is_no_outage() {
        let mut tracker = RouteTracker::default();
        tracker.update(0.0, &[via("10.65.2.0/26", "10.99.0.2")]);
        let moved = tracker.update(1.0, &[via("10.65.2.0/26", "10.99.0.3")]);
        assert!(moved.outages.is_empty());
        assert_eq!(moved.changed.len(), 1);
        tracker.update(2.0, &[]);
        assert_eq!(
            tracker.missing()[0].node,
            "10.99.0.3".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn memory_is_bounded_by_age_and_count() {
        let mut tracker = RouteTracker::default();
        tracker.update(0.0, &[via("10.65.2.0/26", "10.99.0.2")]);
        tracker.update(1.0, &[]);
        tracker.update(1.0 + FORGET_AFTER_S, &[]);
        assert!(tracker.missing().is_empty());
        assert_eq!(tracker.forgotten(), 1);

        // Distinct /26 blocks, more than the cap: routed, then all gone.
        let many: Vec<BlockRoute> = (0..MAX_BLOCKS as u32 + 10)
            .map(|i| {
                let base = std::net::Ipv4Addr::from(0x0a00_0000 + i * 64);
                via(&format!("{base}/26"), "10.99.0.2")
            })
            .collect();
        // All routed: all kept, whatever their number.
        tracker.update(10.0, &many);
        assert_eq!(tracker.forgotten(), 1);
        // One withdrawn while over the cap: missing, and named.
        tracker.update(10.5, &many[1..]);
        assert_eq!(tracker.missing().len(), 1);
        assert_eq!(tracker.missing()[0].block, many[0].block);
        // All gone: the cap holds, the longest missing go first.
        tracker.update(11.0, &[]);
        assert_eq!(tracker.missing().len(), MAX_BLOCKS);
        assert_eq!(tracker.forgotten(), 1 + 10);
        assert!(!tracker.missing().iter().any(|m| m.block == many[0].block));
    }
}
