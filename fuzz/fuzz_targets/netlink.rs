//! Arbitrary bytes as the datagrams of one read of the data plane (link,
//! address, route, neighbour and FDB dumps, NLMSG_DONE between them):
//! framed and decoded by the code the live reader runs
//! (`observer_core::parse::netlink`), then resolved into the view
//! (`DataPlane::assemble`), each peer node's route looked up among the same
//! route messages. No panic, and the view holds what it promises: its
//! tunnel routes go through its tunnel devices, its links are sorted, it
//! has no more blocks than routes, and it serializes.

#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use observer_core::{
    model::dataplane::{DataPlane, DeclaredTunnel},
    parse::netlink as decode,
};

/// A `--tunnel-device`, so that declared devices are resolved too.
static DECLARED: LazyLock<[DeclaredTunnel; 1]> =
    LazyLock::new(|| ["wg0=wireguard".parse().expect("a valid --tunnel-device")]);

fuzz_target!(|data: &[u8]| {
    let messages = decode::recorded_messages(data);
    let dump = decode::recorded_dump(&messages, &*DECLARED);
    let routes = dump.routes.len();
    let plane = DataPlane::assemble(dump, |node| {
        Ok(decode::peer_route(node, messages.iter().cloned()))
    })
    .expect("route lookups here never fail");
    assert!(plane.links.is_sorted_by_key(|l| l.ifindex));
    assert!(plane.blocks.len() <= routes);
    for route in &plane.routes {
        assert!(
            plane
                .devices
                .iter()
                .any(|d| d.ifindex == route.ifindex && d.name == route.device)
        );
    }
    let _ = plane.expected_peers();
    let _ = plane.vxlan_vnis();
    let _ = plane.unresolved_routes();
    for address in &plane.addresses {
        let _ = plane.node_owning(address.addr);
    }
    serde_json::to_string(&plane).expect("the view serializes");
});
