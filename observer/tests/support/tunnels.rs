//! Two namespaces joined by a veth pair (IPv4 and IPv6 underlay), with a
//! kernel tunnel device of every kind the observer counts between them:
//! VXLAN (4789, 8472, IPv6 underlay), Geneve, IPIP, sit, ip6tnl in both
//! modes, GRE, gretap, ip6gre and WireGuard. Each kind has its own overlay
//! subnet, the outer filter tcpdump counts it with, and the observer row
//! (proto, peer, VNI) it lands in; kinds that share a protocol use distinct
//! underlay addresses or VNIs, so every kind has a row of its own.
//!
//! A kind the running kernel cannot create is left out (and reported);
//! inside the VMs of `cargo xtask vm-test` that is a failure instead.

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;

use super::{
    kernel_suite,
    netns::{Netns, VethEnd, ping_summary, scaled, temp_path, veth_pair},
};

/// Underlay interface names.
pub const A_IFACE: &str = "va";
/// The observed side.
pub const B_IFACE: &str = "vb";
/// Underlay addresses: IPv4, a second IPv4 pair for gretap, IPv6.
pub const A4: &str = "10.99.0.1";
/// B's IPv4 underlay address.
pub const B4: &str = "10.99.0.2";
/// A's second IPv4 underlay address (gretap, so its row is its own).
pub const A4_TAP: &str = "10.99.0.11";
/// B's second IPv4 underlay address.
pub const B4_TAP: &str = "10.99.0.12";
/// A's IPv6 underlay address.
pub const A6: &str = "fd99::1";
/// B's IPv6 underlay address.
pub const B6: &str = "fd99::2";
/// A's second IPv6 underlay address (ip6tnl in ipip6 mode: the kernel
/// keeps one ip6tnl device per local and remote pair, whatever its mode).
pub const A6_TAP: &str = "fd99::11";
/// B's second IPv6 underlay address.
pub const B6_TAP: &str = "fd99::12";

/// One tunnel kind of the matrix.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// Check name prefix (`vxlan4789_v4`).
    pub name: &'static str,
    /// Device name in both namespaces.
    pub dev: &'static str,
    /// `ip link add DEV type ...` arguments after `type`, with `{L}` and
    /// `{R}` for the local and remote underlay addresses.
    pub link: &'static str,
    /// Inner addresses: A's and B's, with prefix length.
    pub inner: (&'static str, &'static str, u8),
    /// The observer's protocol name for the outer packets.
    pub proto: &'static str,
    /// A's underlay address, as B's observer names the peer.
    pub peer: &'static str,
    /// B's underlay address (the device's local on B).
    pub local: &'static str,
    /// VNI of the rows (0 without one).
    pub vni: u64,
    /// tcpdump filter for the outer packets of this kind (any direction).
    /// `protochain` for the IPv6 tunnels: ip6tnl and ip6gre put a
    /// destination options header (the encapsulation limit) first.
    pub filter: &'static str,
}

/// Every kind, with A as `{L}` on A's side (B's side swaps them).
pub const KINDS: &[Kind] = &[
    Kind {
        name: "vxlan4789_v4",
        dev: "vx4789",
        link: "vxlan id 100 local {L} remote {R} dstport 4789 dev {U}",
        inner: ("10.201.1.1", "10.201.1.2", 24),
        proto: "vxlan",
        peer: A4,
        local: B4,
        vni: 100,
        filter: "ip and udp dst port 4789",
    },
    Kind {
        name: "vxlan8472_v4",
        dev: "vx8472",
        link: "vxlan id 101 local {L} remote {R} dstport 8472 dev {U}",
        inner: ("10.201.2.1", "10.201.2.2", 24),
        proto: "vxlan",
        peer: A4,
        local: B4,
        vni: 101,
        filter: "ip and udp dst port 8472",
    },
    Kind {
        name: "vxlan4789_v6",
        dev: "vx6",
        link: "vxlan id 102 local {L6} remote {R6} dstport 4789 dev {U}",
        inner: ("10.201.3.1", "10.201.3.2", 24),
        proto: "vxlan",
        peer: A6,
        local: B6,
        vni: 102,
        filter: "ip6 and udp dst port 4789",
    },
    Kind {
        name: "geneve_v4",
        dev: "gnv",
        link: "geneve id 200 remote {R}",
        inner: ("10.201.4.1", "10.201.4.2", 24),
        proto: "geneve",
        peer: A4,
        local: B4,
        vni: 200,
        filter: "udp dst port 6081",
    },
    Kind {
        name: "ipip_v4",
        dev: "ipip1",
        link: "ipip local {L} remote {R}",
        inner: ("10.201.5.1", "10.201.5.2", 24),
        proto: "ipip",
        peer: A4,
        local: B4,
        vni: 0,
        filter: "ip proto 4",
    },
    Kind {
        name: "sit_6in4",
        dev: "sit1",
        link: "sit local {L} remote {R}",
        inner: ("fd01:6::1", "fd01:6::2", 64),
        proto: "ip6ip",
        peer: A4,
        local: B4,
        vni: 0,
        filter: "ip proto 41",
    },
    Kind {
        name: "ip6tnl_ip6ip6",
        dev: "ip6t1",
        link: "ip6tnl mode ip6ip6 local {L6} remote {R6}",
        inner: ("fd01:7::1", "fd01:7::2", 64),
        proto: "ip6ip",
        peer: A6,
        local: B6,
        vni: 0,
        filter: "ip6 protochain 41",
    },
    Kind {
        name: "ip6tnl_ipip6",
        dev: "ip6t2",
        link: "ip6tnl mode ipip6 local {L6T} remote {R6T}",
        inner: ("10.201.8.1", "10.201.8.2", 24),
        proto: "ipip",
        peer: A6_TAP,
        local: B6_TAP,
        vni: 0,
        filter: "ip6 protochain 4",
    },
    Kind {
        name: "gre_v4",
        dev: "gre1",
        link: "gre local {L} remote {R} key 42",
        inner: ("10.201.9.1", "10.201.9.2", 24),
        proto: "gre",
        peer: A4,
        local: B4,
        vni: 0,
        filter: "ip proto 47 and host 10.99.0.1",
    },
    Kind {
        name: "gretap_v4",
        dev: "gtap1",
        link: "gretap local {LT} remote {RT} key 44",
        inner: ("10.201.10.1", "10.201.10.2", 24),
        proto: "gre",
        peer: A4_TAP,
        local: B4_TAP,
        vni: 0,
        filter: "ip proto 47 and host 10.99.0.11",
    },
    Kind {
        name: "ip6gre",
        dev: "g6gre",
        link: "ip6gre local {L6} remote {R6} key 43",
        inner: ("10.201.11.1", "10.201.11.2", 24),
        proto: "gre",
        peer: A6,
        local: B6,
        vni: 0,
        filter: "ip6 protochain 47",
    },
    Kind {
        name: "wireguard_v4",
        dev: "wg1",
        link: "wireguard",
        inner: ("10.201.12.1", "10.201.12.2", 24),
        proto: "wireguard",
        peer: A4,
        local: B4,
        vni: 0,
        filter: "udp port 51820",
    },
];

impl Kind {
    /// Whether the inner packets are IPv6.
    pub fn inner_v6(&self) -> bool {
        self.inner.0.contains(':')
    }

    /// tcpdump filter of this kind's packets B receives (from A).
    pub fn rx_filter(&self) -> String {
        format!("({}) and src host {}", self.filter, self.peer)
    }

    /// tcpdump filter of this kind's packets B sends (to A).
    pub fn tx_filter(&self) -> String {
        format!("({}) and dst host {}", self.filter, self.peer)
    }
}

/// The two namespaces with their tunnels; deleted on drop.
pub struct Tunnels {
    /// The sending side.
    pub a: Netns,
    /// The observed side.
    pub b: Netns,
    /// The kinds created, in [`KINDS`] order.
    pub kinds: Vec<Kind>,
    /// Kinds the kernel could not create, with its error.
    pub missing: Vec<(Kind, String)>,
}

impl Tunnels {
    /// Builds the underlay and every kind of `wanted` the kernel supports.
    pub fn new(tag: &str, wanted: &[Kind]) -> Tunnels {
        let a = Netns::new(&format!("{tag}a"));
        let b = Netns::new(&format!("{tag}b"));
        for ns in [&a, &b] {
            // IPv6 back on for the devices created from now on (Netns
            // turns it off), without router solicitations.
            ns.exec_ok(&[
                "sysctl",
                "-qw",
                "net.ipv6.conf.default.disable_ipv6=0",
                "net.ipv6.conf.default.router_solicitations=0",
                "net.ipv6.conf.default.accept_ra=0",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ]);
        }
        veth_pair(
            &a,
            &VethEnd {
                iface: A_IFACE.to_string(),
                mac: "02:00:00:00:99:01".to_string(),
                addr: A4.to_string(),
            },
            &b,
            &VethEnd {
                iface: B_IFACE.to_string(),
                mac: "02:00:00:00:99:02".to_string(),
                addr: B4.to_string(),
            },
            24,
        );
        for (ns, extra, v6s, peer6s, peer_mac, iface) in [
            (
                &a,
                A4_TAP,
                [A6, A6_TAP],
                [B6, B6_TAP],
                "02:00:00:00:99:02",
                A_IFACE,
            ),
            (
                &b,
                B4_TAP,
                [B6, B6_TAP],
                [A6, A6_TAP],
                "02:00:00:00:99:01",
                B_IFACE,
            ),
        ] {
            ns.ip(&["addr", "add", &format!("{extra}/24"), "dev", iface]);
            for (v6, peer6) in v6s.into_iter().zip(peer6s) {
                ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", iface, "nodad"]);
                ns.ip(&[
                    "neigh",
                    "replace",
                    peer6,
                    "lladdr",
                    peer_mac,
                    "dev",
                    iface,
                    "nud",
                    "permanent",
                ]);
            }
        }
        a.neigh(B4_TAP, "02:00:00:00:99:02", A_IFACE);
        b.neigh(A4_TAP, "02:00:00:00:99:01", B_IFACE);

        let mut tunnels = Tunnels {
            a,
            b,
            kinds: Vec::new(),
            missing: Vec::new(),
        };
        let keys = wireguard_keys();
        for kind in wanted {
            match tunnels.add(kind, keys.as_ref()) {
                Ok(()) => tunnels.kinds.push(*kind),
                Err(why) => {
                    assert!(
                        !kernel_suite::in_vm(),
                        "{}: this VM kernel must create {} devices: {why}",
                        kind.name,
                        kind.link
                    );
                    eprintln!("{}: left out on this kernel: {why}", kind.name);
                    tunnels.missing.push((*kind, why));
                }
            }
        }
        tunnels.pin_inner_neighbours();
        // Let the devices' own start-up traffic (IPv6 MLD reports on the
        // v6-inner tunnels) pass before anyone counts.
        std::thread::sleep(Duration::from_secs(3));
        tunnels
    }

    /// Creates `kind` on both sides; `Err` when the kernel refuses it.
    fn add(&self, kind: &Kind, keys: Option<&WireguardKeys>) -> Result<(), String> {
        for (side, ns) in [(0, &self.a), (1, &self.b)] {
            let (l, r, lt, rt, l6, r6, l6t, r6t, u) = if side == 0 {
                (A4, B4, A4_TAP, B4_TAP, A6, B6, A6_TAP, B6_TAP, A_IFACE)
            } else {
                (B4, A4, B4_TAP, A4_TAP, B6, A6, B6_TAP, A6_TAP, B_IFACE)
            };
            let link = kind
                .link
                .replace("{L6T}", l6t)
                .replace("{R6T}", r6t)
                .replace("{LT}", lt)
                .replace("{RT}", rt)
                .replace("{L6}", l6)
                .replace("{R6}", r6)
                .replace("{L}", l)
                .replace("{R}", r)
                .replace("{U}", u);
            let mut args = vec!["-n", ns.name(), "link", "add", kind.dev, "type"];
            args.extend(link.split_whitespace());
            let output = super::netns::try_run("ip", &args);
            if !output.status.success() {
                return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
            }
            if !kind.inner_v6() {
                ns.exec_ok(&[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{}.disable_ipv6=1", kind.dev),
                ]);
            }
            if kind.proto == "wireguard" {
                let keys = keys.ok_or("wg (wireguard-tools) is not installed")?;
                let (own, peer_public) = if side == 0 {
                    (&keys.a_private, &keys.b_public)
                } else {
                    (&keys.b_private, &keys.a_public)
                };
                let allowed = format!(
                    "{}/32",
                    if side == 0 {
                        kind.inner.1
                    } else {
                        kind.inner.0
                    }
                );
                ns.exec_ok(&[
                    "wg",
                    "set",
                    kind.dev,
                    "listen-port",
                    "51820",
                    "private-key",
                    own.to_str().unwrap(),
                    "peer",
                    peer_public,
                    "endpoint",
                    &format!("{r}:51820"),
                    "allowed-ips",
                    &allowed,
                ]);
            }
            let own_inner = if side == 0 {
                kind.inner.0
            } else {
                kind.inner.1
            };
            let mut addr = vec!["addr", "add"];
            let cidr = format!("{own_inner}/{}", kind.inner.2);
            addr.push(&cidr);
            addr.extend(["dev", kind.dev]);
            if kind.inner_v6() {
                addr.push("nodad");
            }
            ns.ip(&addr);
            ns.ip(&["link", "set", kind.dev, "up"]);
        }
        Ok(())
    }

    /// Silences the tunnels that send by themselves: WireGuard sends
    /// keepalives and handshakes on its own timers, so its peers are removed
    /// (after the test's traffic, before counting stops) so that nothing
    /// crosses between tcpdump's stop and the observer's final read.
    pub fn quiesce(&self) {
        for kind in self.kinds.iter().filter(|k| k.proto == "wireguard") {
            for ns in [&self.a, &self.b] {
                let out = ns.exec_ok(&["wg", "show", kind.dev, "peers"]);
                for peer in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    ns.exec_ok(&["wg", "set", kind.dev, "peer", peer, "remove"]);
                }
            }
        }
    }

    /// Static neighbour entries for the inner addresses of the Ethernet
    /// tunnels (vxlan, geneve, gretap): no ARP ever crosses them, so the
    /// only tunnel packets are the test's own, whenever counting starts.
    fn pin_inner_neighbours(&self) {
        let mac = |ns: &Netns, dev: &str| -> String {
            let text = ns.ip(&["-j", "link", "show", "dev", dev]);
            let links: Vec<Value> = serde_json::from_str(&text).expect("ip -j link");
            links[0]["address"]
                .as_str()
                .expect("a MAC address")
                .to_string()
        };
        for kind in &self.kinds {
            if !matches!(
                kind.link.split_whitespace().next(),
                Some("vxlan" | "geneve" | "gretap")
            ) {
                continue;
            }
            let (a_mac, b_mac) = (mac(&self.a, kind.dev), mac(&self.b, kind.dev));
            self.a.neigh(kind.inner.1, &b_mac, kind.dev);
            self.b.neigh(kind.inner.0, &a_mac, kind.dev);
        }
    }

    /// Pings over every kind `count` times from A to B and from B to A;
    /// every ping must be answered.
    pub fn ping_all(&self, count: u32) {
        for kind in &self.kinds {
            for (from, to) in [(&self.a, kind.inner.1), (&self.b, kind.inner.0)] {
                // `-w` makes ping send until `count` replies came back: on a
                // slow (emulated) machine a late reply means one more
                // request, which tcpdump and the observer both see. The
                // tunnel is broken only if replies are missing.
                let (_sent, mut received, mut output) = ping_output(from, to, count);
                // One more round when a reply went missing: an emulated
                // machine (vm-test under TCG) now and then loses one, e.g.
                // around WireGuard's first handshake. Both counters see
                // every packet of both rounds, so comparisons stay exact;
                // a tunnel that is broken loses the second round too.
                if received != count {
                    let first = output;
                    (_, received, output) = ping_output(from, to, count);
                    output = format!("{first}\nagain:\n{output}");
                }
                if received != count {
                    let diagnose = |ns: &Netns| {
                        let mut text = String::new();
                        for args in [
                            vec!["-s", "-d", "link", "show", kind.dev],
                            vec!["route", "get", to],
                            vec!["-6", "neigh"],
                            vec!["-6", "route"],
                        ] {
                            let mut all = vec!["-n", ns.name()];
                            all.extend(args);
                            let out = super::netns::try_run("ip", &all);
                            text.push_str(&String::from_utf8_lossy(&out.stdout));
                            text.push_str(&String::from_utf8_lossy(&out.stderr));
                        }
                        text.push_str(&String::from_utf8_lossy(
                            &ns.exec(&["nstat", "-a", "-z", "Icmp*", "Ip6*", "Ip*"])
                                .stdout,
                        ));
                        text
                    };
                    panic!(
                        "{}: ping {to} lost replies:\n{output}\nA:\n{}\nB:\n{}",
                        kind.name,
                        diagnose(&self.a),
                        diagnose(&self.b)
                    );
                }
            }
        }
    }

    /// `ip -d -j link show` of B's devices: the kernel's own view.
    pub fn kernel_links(&self) -> BTreeMap<String, Value> {
        let text = self.b.ip(&["-d", "-j", "link", "show"]);
        let links: Vec<Value> = serde_json::from_str(&text).expect("ip -j link");
        links
            .into_iter()
            .map(|l| (l["ifname"].as_str().unwrap().to_string(), l))
            .collect()
    }
}

/// Pings `dst` from `ns` (v4 or v6), 20 ms apart, with a patient deadline:
/// the first packet of a tunnel may wait for a neighbour or a WireGuard
/// handshake.
pub fn ping(ns: &Netns, dst: &str, count: u32) -> (u32, u32) {
    let (sent, received, _) = ping_output(ns, dst, count);
    (sent, received)
}

/// [`ping`], with everything ping printed.
fn ping_output(ns: &Netns, dst: &str, count: u32) -> (u32, u32, String) {
    let count_text = count.to_string();
    let deadline = scaled(Duration::from_secs(10)).as_secs().to_string();
    let output = ns.exec(&[
        "ping",
        "-n",
        "-q",
        "-c",
        &count_text,
        "-i",
        "0.02",
        "-w",
        &deadline,
        dst,
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let (sent, received) = ping_summary(&text);
    (sent, received, text)
}

/// WireGuard key pairs for A and B.
pub struct WireguardKeys {
    a_private: std::path::PathBuf,
    b_private: std::path::PathBuf,
    a_public: String,
    b_public: String,
}

impl Drop for WireguardKeys {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.a_private);
        let _ = std::fs::remove_file(&self.b_private);
    }
}

/// Two key pairs from `wg genkey`/`wg pubkey`; `None` without `wg`.
fn wireguard_keys() -> Option<WireguardKeys> {
    let pair = || -> Option<(std::path::PathBuf, String)> {
        let private = std::process::Command::new("wg")
            .arg("genkey")
            .output()
            .ok()?;
        if !private.status.success() {
            return None;
        }
        let path = temp_path("wgkey", "key");
        std::fs::write(&path, &private.stdout).ok()?;
        let public = std::process::Command::new("sh")
            .args(["-c", &format!("wg pubkey < {}", path.display())])
            .output()
            .ok()?;
        Some((
            path,
            String::from_utf8_lossy(&public.stdout).trim().to_string(),
        ))
    };
    let (a_private, a_public) = pair()?;
    let (b_private, b_public) = pair()?;
    Some(WireguardKeys {
        a_private,
        b_private,
        a_public,
        b_public,
    })
}
