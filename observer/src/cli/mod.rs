//! Command-line interface.

pub mod settings;

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use clap::{Args, Parser, Subcommand};

use crate::{bpf::XdpMode, node::allowsets::Tagged, report::Format};

/// See, at the wire, what happens to overlay traffic: encapsulated packets
/// (VXLAN, VXLAN-GPE, Geneve, IPIP, IPv6-in-IP, GRE, WireGuard) counted per
/// remote peer, protocol and direction by eBPF programs on the interfaces.
#[derive(Debug, Parser)]
#[command(name = "observer", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to interfaces and stream per-peer counters and drops until stopped.
    ///
    /// Received packets are counted by XDP (before GRO, so as on the wire),
    /// sent packets by tc egress (a GSO packet counts as its segments).
    /// Received tunnel packets from sources outside Calico's allow-sets, and
    /// packets the kernel drops (with the kernel's reason), are counted per
    /// peer. Nothing is changed: every packet passes. Programs are attached
    /// with bpf links, so they disappear with the process, even after kill -9.
    /// SIGINT/SIGTERM print the final counters and exit 0; SIGHUP re-reads
    /// --config.
    ///
    /// Example: observer attach eth0 --interval 2s
    ///          observer attach --netns node-a veth0 --output json --duration 30s
    ///          observer attach --config /etc/observer/config.toml
    #[command(verbatim_doc_comment)]
    Attach(AttachArgs),

    /// Watch for a bounded time, then write up what is wrong, per peer.
    ///
    /// Attaches like `attach` (same options), reads the node's data plane
    /// (tunnel devices, routes to pod blocks, VXLAN FDB, allow-sets) and
    /// compares it with what is on the wire: one-way tunnels, source NAT,
    /// allow-set drops, an encapsulation other than the routes prescribe,
    /// MTU problems, unknown peers, drop spikes. Prints a short incident
    /// write-up: what was measured, what it means, what to check next.
    /// Without IFACE, watches the interfaces that carry tunnel traffic
    /// (from the routes to the peer nodes). Default --duration: 10s.
    ///
    /// Exit status: 0 healthy (no finding), 1 problem found, 2 could not
    /// run (bad option, missing privileges, no interface).
    ///
    /// Example: observer diagnose
    ///          observer diagnose --netns node-a eth0 --duration 30s
    ///          observer diagnose --output json | jq 'select(.type=="diagnosis")'
    #[command(verbatim_doc_comment)]
    Diagnose(DiagnoseArgs),

    /// Rebuild the overlay incident in network namespaces and diagnose it.
    ///
    /// Creates a GPU node (10.10.10.62) behind a router (10.10.10.244) and two
    /// control-plane nodes (10.10.60.127, 10.10.60.209), each with Calico's
    /// vxlan.calico (VNI 4096), tunl0, pod blocks, routes, FDB entries,
    /// allow-sets and cali-INPUT rules; pings pod to pod over VXLAN and IPIP
    /// in both directions; runs this observer on every node at the same time;
    /// and ends with a diagnosis composed only from what the observers saw:
    /// which direction never arrives, which source address arrives instead
    /// and who really sent it, what Calico drops (beside its rule counter),
    /// and what IPIP does on the same path. Everything is removed at the end,
    /// also on Ctrl-C. Needs root, ip, bridge, iptables, ipset and ping.
    ///
    /// Scenarios (--scenario):
    ///   incident        the router drops UDP/4789 from the GPU node and
    ///                   source-NATs VXLAN toward it; Calico drops that; IPIP passes
    ///   udp-block       only the one-way UDP/4789 block from the GPU node
    ///   mtu             the router's link to the GPU node has MTU 1400;
    ///                   1400-byte pod pings overflow it, 1300-byte ones fit
    ///   encap-mismatch  the GPU node routes cp1's block over IPIP, cp1 still VXLAN
    ///   healthy         everything works both ways
    ///
    /// Example: observer lab
    ///          observer lab --scenario mtu --duration 30s
    ///          observer lab --output json --duration 8s | jq 'select(.type=="lab")'
    #[command(verbatim_doc_comment)]
    Lab(LabArgs),

    /// Count the tunnel traffic of capture files, as attach would have.
    ///
    /// Every frame of each pcap or pcapng file (from `tcpdump -w`; link types
    /// Ethernet, Linux cooked v1/v2, raw IP, BSD/macOS loopback and NFLOG)
    /// goes through the observer's own classifier: the eBPF programs' parser
    /// and checks, compiled into this binary (no privileges needed; this
    /// node's allow-sets are read when ipset and nft may be run). With
    /// --kernel the programs themselves are loaded into this kernel,
    /// attached to nothing, and run on each frame with BPF_PROG_TEST_RUN
    /// (root, or CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON). Both count the
    /// same. The rows are attach's (same table and
    /// JSON lines), one set per capture with the file as `iface`; rates are
    /// per second of capture time. Frames are received (rx, peer = outer
    /// source) unless their outer source is a --local address: those were
    /// sent by the capturing node (tx, peer = outer destination). Frames the
    /// snap length cut are classified on what was captured and counted as
    /// `truncated` (their bytes are the captured ones).
    ///
    /// Exit status: 0 every capture read to its end; 1 a capture is damaged
    /// (the error names the file and frame; what was read before it is
    /// printed); 2 usage or environment error (file missing, not a capture,
    /// unsupported link type, no privileges for --kernel).
    ///
    /// Example: observer replay node-a.pcap
    ///          observer replay --local 10.0.0.5 eth0.pcap --output json
    ///          observer replay --allow-cidr 10.0.0.0/24 a.pcapng b.pcap
    #[command(verbatim_doc_comment)]
    Replay(ReplayArgs),

    /// Say whether this kernel runs the observer, before rolling it out.
    ///
    /// Probes the kernel (multi-buffer XDP, tcx links, the drop reason of
    /// skb:kfree_skb, BTF), loads every program `attach` would use into the
    /// verifier without attaching anything, and lists the tunnel device
    /// kinds the kernel has (from its config and module lists; no module is
    /// loaded). Prints each hook with the program variant, the verifier's
    /// instruction count (kernels 5.16+ report it), every fallback with what
    /// it costs, and a verdict. Supported: Linux 5.10 and newer with BTF.
    ///
    /// Exit status: 0 attach works as designed; 1 it works with fallbacks
    /// (older kernel: listed); 2 it cannot run here (privileges, no program
    /// loads).
    ///
    /// Example: observer check
    ///          observer check --output json | jq .fallbacks
    ///          OBSERVER_LOG=debug observer check    # with the verifier's log on failure
    #[command(verbatim_doc_comment)]
    Check(CheckArgs),

    /// Ask the network now: does each encapsulation reach each peer, who
    /// answers, and how big may a packet be?
    ///
    /// For each peer node (from the tunnel routes, FDB and neighbour
    /// entries; or the PEERs named) and each encapsulation its routes use
    /// (plus --encap), sends ICMP echo requests encapsulated as the node's
    /// own tunnel would: inner source this node's tunnel address, inner
    /// destination the peer's own (VTEP) address. The peer's kernel
    /// decapsulates and answers through its own tunnel: no agent runs on
    /// the peer. Answers are read on the underlay, before this node's
    /// firewall, with the observer's own parser: per peer and
    /// encapsulation, answered of sent, round-trip time, the outer source
    /// the answers arrived from (another address than the peer's is source
    /// NAT on the way), and, with a size ladder of DF probes, the largest
    /// inner packet that gets through (compared with the tunnel device's
    /// MTU). Tunnel packets of the peers that arrive during the run from
    /// another address than the peer's are reported too. Ends with a
    /// conclusion in words.
    ///
    /// Bounds: probes go only to nodes of the data plane or to the PEERs
    /// named; --count per pair (default 5, at most 100) plus, per answered
    /// pair, one ladder probe per halving of the size range (11 on a
    /// 1500-byte link), all paced at --rate (default 20 per second for the
    /// whole run, at most 200). Probe packets carry the payload
    /// "OBSPROBE": the observer's programs count them apart
    /// (observer_probe_packets_total), never in a peer's row. Needs
    /// CAP_NET_RAW (raw and packet sockets).
    ///
    /// Exit status: 0 every pair answered, from the peer, at the device
    /// MTU; 1 a finding (or a pair that cannot be probed); 2 could not run.
    ///
    /// Example: observer probe
    ///          observer probe 10.10.60.127 --encap ipip --encap vxlan
    ///          observer probe --netns node-a --output json | jq 'select(.type=="probe")'
    #[command(verbatim_doc_comment)]
    Probe(ProbeArgs),

    /// Node pairs of the whole cluster, from the observers' series in Prometheus.
    ///
    /// Asks a Prometheus-compatible store (Prometheus, Thanos Query, Mimir,
    /// VictoriaMetrics: the /api/v1/query API) for what every node's
    /// observer exported over --window, and prints one row per sending
    /// node, receiving node and encapsulation, worst first: packets one
    /// sent to the other, packets the other received from it (also from
    /// an address a router rewrote it to), the share lost, the receiver's
    /// drops by reason, the anomalies either side raised, the verdict
    /// (policy drop, route loss, MTU, one-way, loss, other, healthy; as
    /// `diagnose`'s) and the next step. Nodes are known by the `node` label
    /// and observer_node_info{node,address} of each observer's textfile
    /// (`attach --node-name`); counts are exact increases of the counters
    /// over the window.
    ///
    /// Exit status: 0 every pair healthy, 1 a pair with a problem, 2 could
    /// not run (store unreachable or refusing, no observer series in the
    /// window, bad option).
    ///
    /// Example: observer cluster --prometheus http://prometheus:9090
    ///          observer cluster --prometheus https://thanos.example --ca-file ca.pem --window 15m
    ///          observer cluster --prometheus http://127.0.0.1:9090 --at 2026-12-01T03:00:00Z --output json
    #[command(verbatim_doc_comment)]
    Cluster(ClusterArgs),

    /// Is the observer on this node alive? For probes of images without a shell.
    ///
    /// Reads DIR/observer.prom, the textfile `attach --textfile-dir DIR`
    /// rewrites every interval: healthy when it was written at most
    /// --max-age ago and names attached programs (observer_programs_attached
    /// above 0). Prints one line saying which. The DaemonSet's startup and
    /// liveness probes run it (`exec: [/observer, health, ...]`).
    ///
    /// Exit status: 0 healthy; 1 stale, detached, or not an observer's
    /// file; 2 could not run (no such file or directory).
    ///
    /// Example: observer health --textfile-dir /var/lib/node_exporter/textfile_collector
    ///          observer health --textfile-dir /srv/metrics --max-age 45s
    #[command(verbatim_doc_comment)]
    Health(HealthArgs),
}

/// Options of `observer probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Peer nodes to probe (underlay IPv4 addresses). Default: every node
    /// the tunnel routes lead to.
    #[arg(value_name = "PEER")]
    pub peers: Vec<Ipv4Addr>,

    /// Also probe with this encapsulation: vxlan[:PORT], geneve[:PORT],
    /// ipip, or udp:PORT (a plain UDP datagram to a port nothing listens
    /// on, answered by the peer's kernel with "port unreachable": does
    /// UDP to that port cross at all?). Repeatable. The routes' own are
    /// always probed.
    #[arg(long = "encap", value_name = "ENCAP")]
    pub encaps: Vec<crate::model::probe::Encap>,

    /// Probe inside this named network namespace (see `ip netns list`).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,

    /// Reachability probes per peer and encapsulation (1-100).
    #[arg(long, default_value_t = crate::model::probe::DEFAULT_COUNT, value_parser = clap::value_parser!(u32).range(1..=100), value_name = "N")]
    pub count: u32,

    /// Probes per second, for the whole run (1-200).
    #[arg(long, default_value_t = crate::model::probe::DEFAULT_RATE, value_parser = clap::value_parser!(u32).range(1..=200), value_name = "PER_SECOND")]
    pub rate: u32,

    /// How long to wait for an answer after the last probe of a round.
    #[arg(long, value_parser = parse_duration, default_value = "1s", value_name = "DURATION")]
    pub timeout: Duration,

    /// Skip the size ladder (reachability only).
    #[arg(long)]
    pub no_ladder: bool,

    /// A device that carries an encapsulation the kernel does not know it
    /// carries (a userspace tunnel on a TUN device), as NAME=PROTO.
    #[arg(long = "tunnel-device", value_name = "NAME=PROTO")]
    pub tunnel_devices: Vec<crate::model::dataplane::DeclaredTunnel>,

    /// table (for people) or json (one object per line). Default: table
    /// on a terminal, json otherwise.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// Options of `observer check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// table (for people) or json (one object). Default: table on a
    /// terminal, json otherwise.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// Options of `observer cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Base URL of the Prometheus HTTP API (`http://prometheus:9090`;
    /// with a path prefix where the store has one, such as Mimir's
    /// `http://mimir/prometheus`).
    #[arg(long, value_name = "URL")]
    pub prometheus: String,

    /// Span the pairs are counted over, ending at --at.
    #[arg(long, value_parser = parse_duration, default_value = "5m", value_name = "DURATION")]
    pub window: Duration,

    /// End of the window: RFC 3339 (2026-12-01T03:00:00Z) or Unix
    /// seconds. [default: now]
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    pub at: Option<std::time::SystemTime>,

    /// File holding `USER:PASSWORD` for HTTP basic auth.
    #[arg(long, value_name = "FILE", conflicts_with = "bearer_token_file")]
    pub basic_auth_file: Option<PathBuf>,

    /// File holding a bearer token (sent as `Authorization: Bearer`).
    #[arg(long, value_name = "FILE")]
    pub bearer_token_file: Option<PathBuf>,

    /// PEM file of the CA certificate(s) that sign the store's TLS
    /// certificate, instead of the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// Time limit of each query.
    #[arg(long, value_parser = parse_duration, default_value = "30s", value_name = "DURATION")]
    pub timeout: Duration,

    /// Packets one node must send to another in the window before none
    /// received is one-way, or a loss is judged.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub min_packets: u64,

    /// Share of a pair's packets that may be lost before its verdict is
    /// loss (0.0005: the 0.05 % rollout target).
    #[arg(long, default_value_t = 0.0005, value_name = "RATIO")]
    pub loss_target: f64,

    /// table (for people) or json (one object per line). Default: table
    /// on a terminal, json otherwise.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// Options of `observer health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The directory `attach --textfile-dir` writes observer.prom to.
    #[arg(long, value_name = "DIR")]
    pub textfile_dir: PathBuf,

    /// Oldest the file may be: a few intervals (the DaemonSet's interval
    /// is 15s).
    #[arg(long, value_parser = parse_duration, default_value = "2m", value_name = "DURATION")]
    pub max_age: Duration,
}

/// Parses RFC 3339 (`2026-12-01T03:00:00Z`) or Unix seconds.
pub fn parse_time(text: &str) -> Result<std::time::SystemTime, String> {
    if let Ok(seconds) = text.parse::<f64>()
        && seconds.is_finite()
        && seconds >= 0.0
    {
        return Ok(std::time::UNIX_EPOCH + Duration::from_secs_f64(seconds));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!("{text:?} is no time: give RFC 3339 (2026-12-01T03:00:00Z) or Unix seconds")
    })
}

/// Options of `observer diagnose`: those of `attach`.
#[derive(Debug, Clone, Args)]
pub struct DiagnoseArgs {
    /// Same options as attach.
    #[command(flatten)]
    pub attach: AttachArgs,

    /// Also run `observer probe` (every peer node, the routes'
    /// encapsulations, probe's default bounds) while watching, and fold
    /// its results into the write-up: a finding of the probes is a
    /// finding of the diagnosis. Needs CAP_NET_RAW.
    #[arg(long)]
    pub probe: bool,
}

/// Options of `observer lab`.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// Which failure to rebuild.
    #[arg(long, value_enum, default_value_t = Scenario::Incident)]
    pub scenario: Scenario,

    /// How long the traffic runs: the pings are sized to end about 2s
    /// before this much time has passed since the observers attached, and
    /// the observers are stopped 1s after the last ping ended (later on a
    /// slow machine, never before the traffic is over). bgp-down: how long
    /// BIRD stays down on n4 (longer when the other nodes take longer to
    /// name the outage; they need one anomaly window, 5s).
    #[arg(long, value_parser = parse_duration, default_value = "20s", value_name = "DURATION")]
    pub duration: Duration,

    /// text (a live per-node view, then the write-up) or json (the
    /// observers' lines tagged with "node", then {"type":"lab",...} facts).
    #[arg(long, value_enum, default_value_t = LabFormat::Text, value_name = "FORMAT")]
    pub output: LabFormat,

    /// How long the node observers may take to load (verify) and attach
    /// their programs before the lab gives up; raise it on slow or
    /// emulated machines (a VM without KVM takes minutes).
    #[arg(long, value_parser = parse_duration, default_value = "60s", value_name = "DURATION")]
    pub attach_timeout: Duration,

    /// Each node's observer also writes its textfile (named with
    /// --node-name NODE) to DIR/NODE/observer.prom, for a node_exporter per
    /// node and a Prometheus to scrape (then `observer cluster` shows the
    /// lab's node pairs); the observers run 3s longer after the traffic so
    /// that a scrape every second sees their final counts. Each file is
    /// removed when its observer stops, as on a node.
    #[arg(long, value_name = "DIR")]
    pub textfile_dir: Option<PathBuf>,

    /// Each node's observer also captures the frames it flags or sees
    /// dropped (`attach --capture-dir`) into DIR/NODE/, as pcapng; `observer
    /// replay DIR/NODE/*.pcapng` then counts them again, per peer and
    /// reason.
    #[arg(long, value_name = "DIR")]
    pub capture_dir: Option<PathBuf>,

    /// The BGP scenarios' routing mode, as Calico's: none (direct routing,
    /// pod traffic routed via the peer on eth0) or ipip (via the peer on
    /// tunl0, onlink: the kernel's tunnel, or the lab's userspace one on a
    /// kernel without IPIP).
    #[arg(long, value_enum, default_value_t = BgpEncap::None, value_name = "MODE")]
    pub bgp_encap: BgpEncap,

    /// Instead of the pings, run `observer probe` on every node at once
    /// (each probes the others over VXLAN and IPIP, with a size ladder)
    /// while the observers watch. Without it the probes run after the
    /// pings, once the observers stopped; the write-up shows each node's
    /// results either way. Not for the BGP scenarios, which probe after
    /// their run with --bgp-encap ipip (direct routing has no tunnel).
    #[arg(long)]
    pub probe: bool,
}

/// How the BGP scenarios' nodes carry pod traffic (`observer lab
/// --bgp-encap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BgpEncap {
    /// Direct routing: routes via the peer node on the underlay.
    None,
    /// Calico's IPIP mode: routes via the peer node on tunl0, onlink.
    Ipip,
}

impl BgpEncap {
    /// Its name, as the option takes it.
    pub fn name(self) -> &'static str {
        match self {
            BgpEncap::None => "none",
            BgpEncap::Ipip => "ipip",
        }
    }
}

/// Options of `observer attach`.
#[derive(Debug, Clone, Args)]
pub struct AttachArgs {
    /// Interfaces to observe (the underlay: eth0, bond0, ...); may come
    /// from the config file instead.
    #[arg(value_name = "IFACE")]
    pub ifaces: Vec<String>,

    /// TOML settings file (keys as the long options, with underscores:
    /// interfaces, interval, textfile_dir, max_peers, allow_sets, ...).
    /// Options given on the command line win over the file. SIGHUP
    /// re-reads it; docs/commands.md says what a reload can change.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,

    /// Also write the counters every interval to DIR/observer.prom for
    /// node_exporter's textfile collector (atomically). The file is
    /// removed on a clean exit.
    #[arg(long, value_name = "DIR")]
    pub textfile_dir: Option<std::path::PathBuf>,

    /// Write evidence to DIR: the first --capture-snap bytes of every
    /// frame the observer flags (a drop reason such as calico_allow_set or
    /// bad_inner_checksum) or sees the kernel drop on a watched device, as
    /// pcapng files for Wireshark, each frame commented with its reasons,
    /// stage, direction, peer and interface (docs/evidence.md). Rate-limited
    /// in the kernel (--capture-rate); at most --capture-files files of
    /// --capture-file-size each, oldest removed; never written while the
    /// file system has less than 256 MiB free. `observer replay` re-counts
    /// a file. [default: off]
    #[arg(long, value_name = "DIR")]
    pub capture_dir: Option<PathBuf>,

    /// Bytes of each frame to keep, 64 to 1024 (enough for every header
    /// of a tunnel packet). [default: 256]
    #[arg(long, value_name = "BYTES")]
    pub capture_snap: Option<u32>,

    /// Evidence frames each CPU may capture per second; the rest are
    /// counted (observer_evidence_frames_total{outcome="rate_limited"}),
    /// not captured. [default: 100]
    #[arg(long, value_name = "N")]
    pub capture_rate: Option<u32>,

    /// Size at which an evidence file is completed and the next begun, in
    /// MiB. [default: 16]
    #[arg(long, value_name = "MIB")]
    pub capture_file_size: Option<u64>,

    /// Completed evidence files to keep; the oldest is removed beyond
    /// it. [default: 8]
    #[arg(long, value_name = "N")]
    pub capture_files: Option<usize>,

    /// Pages (4 KiB) of each CPU's evidence ring, a power of two: a burst
    /// larger than the ring holds before the observer reads it (every
    /// interval) is lost, and counted (outcome="lost"). [default: room
    /// for four intervals at --capture-rate, 8 to 1024 pages]
    #[arg(long, value_name = "PAGES")]
    pub capture_ring_pages: Option<usize>,

    /// This node's name: the `node` label of every series in the textfile,
    /// and of observer_node_info{node,address}, which maps this node's
    /// underlay addresses to it (`observer cluster` and the node-pair
    /// rules join on it). In Kubernetes, the Downward API's spec.nodeName.
    /// [default: the host name]
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,

    /// Run the node's tools (ipset, nft, iptables-save) from the host's
    /// root filesystem mounted at DIR (chrooted into it), for an image
    /// that holds nothing but the observer: the host's own binaries, in
    /// the host's iptables mode. Needs CAP_SYS_CHROOT, kept for them.
    /// [default: the tools on PATH]
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,

    /// Also serve the textfile's metrics on http://ADDR/metrics (e.g.
    /// 0.0.0.0:9477), for Prometheus to scrape the observer directly (a
    /// ServiceMonitor) instead of through node_exporter's textfile
    /// collector. Bound before the capabilities are dropped. [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Peers that get their own `peer` label value in the textfile (the
    /// top ones by packets and drops); the rest are summed as peer="other".
    /// [default: 200]
    #[arg(long, value_name = "N")]
    pub max_peers: Option<usize>,

    /// Attach inside this named network namespace (see `ip netns list`).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,

    /// Probe every peer node over the routes' encapsulations (what
    /// `observer probe` does, with its default bounds: 5 probes per pair
    /// and a size ladder, 20 per second) now and then every DURATION, on
    /// a thread of its own; the textfile gets observer_probe_* series and
    /// JSON output `probe` lines. Needs CAP_NET_RAW. [default: off]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub probe_interval: Option<Duration>,

    /// How often to read the counters, print and export [default: 1s].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Option<Duration>,

    /// Stop after this long (e.g. 30s, 5m), printing the final counters.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// table (refreshed, for people) or json (one object per line).
    /// Default: table on a terminal, json otherwise.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

    /// How to count received packets: auto tries native XDP, then generic
    /// XDP, then tc ingress (when another XDP program owns the interface);
    /// on a veth with tcx (Linux 6.6+) auto uses tc ingress first, as
    /// native XDP would move the veth to a copying receive path.
    /// [default: auto]
    #[arg(long, value_enum, value_name = "MODE")]
    pub xdp_mode: Option<XdpMode>,

    /// Which UDP ports mean which encapsulation.
    #[command(flatten)]
    pub ports: PortArgs,

    /// Capacity of the kernel flow map (rows shared by all CPUs). When
    /// full, the least recently used row is evicted and counted.
    /// [default: 16384]
    #[arg(long, value_name = "N")]
    pub max_flows: Option<u32>,

    /// Extra allow-set (ipset or nftables set name) of sources allowed to
    /// send VXLAN (`vxlan=NAME`, the default) or IPIP (`ipip=NAME`), beside
    /// Calico's cali40all-vxlan-net, cali60all-vxlan-net and
    /// cali40all-hosts-net. Sources outside count as drop reason
    /// calico_allow_set.
    #[arg(long = "allow-set", value_name = "[PROTO=]NAME")]
    pub allow_sets: Vec<Tagged<String>>,

    /// Prefix allowed to send VXLAN (`vxlan=CIDR`, the default) or IPIP
    /// (`ipip=CIDR`), for setups without sets. Repeatable.
    #[arg(long = "allow-cidr", value_name = "[PROTO=]CIDR")]
    pub allow_cidrs: Vec<Tagged<ipnet::IpNet>>,

    /// How often allow-sets are re-read, and every third period Calico's
    /// drop-rule counters (each read runs ipset, nft, iptables on a thread of its own, so
    /// a slow tool never delays an interval; a tool that hangs is given up
    /// after 10s and reported); changes take effect in the programs at the
    /// first interval after the read. Local vxlan devices (for vni_unknown)
    /// are re-read when netlink reports a change. [default: 5s]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub allow_set_refresh: Option<Duration>,

    /// Span over which anomalies are judged: one-way traffic must last this
    /// long, and a condition clears after this long without it. [default: 5s]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub anomaly_window: Option<Duration>,

    /// Packets in one direction (or with an unexpected encapsulation) over
    /// the window before the anomaly counts. [default: 5]
    #[arg(long, value_name = "N")]
    pub anomaly_min_packets: Option<u64>,

    /// A device that carries an encapsulation the kernel does not know it
    /// carries: a userspace tunnel on a TUN device (wireguard-go,
    /// boringtun). Routes through it then count as prescribing PROTO
    /// (vxlan, vxlan-gpe, geneve, ipip, ip6ip, gre, wireguard). Repeatable.
    #[arg(long = "tunnel-device", value_name = "NAME=PROTO")]
    pub tunnel_devices: Vec<crate::model::dataplane::DeclaredTunnel>,

    /// Devices whose kernel drops are counted after decapsulation, besides
    /// the attached interfaces: `tunnels` (the data plane's tunnel devices:
    /// vxlan.calico, tunl0, flannel.1, ...) and interface names, a trailing
    /// `*` matching any rest; `none` for none. Each drop is attributed to
    /// the node whose pod block holds the inner source (or, on the way
    /// out, the inner destination), with stage tunnel or pod and the kernel
    /// function that dropped it. Followed as devices come and go.
    /// [default: tunnels,cali*,cni0,veth*]
    #[arg(long, value_name = "DEVICES")]
    pub after_decap: Option<crate::model::after_decap::DevicePatterns>,

    /// Drops per second of one peer that make a drop_spike. [default: 5]
    #[arg(long, value_name = "PER_SECOND")]
    pub drop_spike_rate: Option<f64>,

    /// Control socket of a BIRD whose BGP sessions to follow (what
    /// `birdc show protocols all` and `calicoctl node status` show), read
    /// every interval on a thread of its own. Repeatable. A socket that is
    /// not there is reported once; the rest keeps working. A session not
    /// Established is a bgp_down anomaly. [default:
    /// /var/run/calico/bird.ctl, /var/run/calico/bird6.ctl]
    #[arg(long = "bird-socket", value_name = "PATH")]
    pub bird_sockets: Vec<PathBuf>,

    /// Times a BGP session may re-establish within --bgp-flap-window; one
    /// more is a bgp_flap anomaly. [default: 3]
    #[arg(long, value_name = "N")]
    pub bgp_flaps: Option<u32>,

    /// Span over which BGP re-establishments are counted. [default: 10m]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub bgp_flap_window: Option<Duration>,
}

/// Options of `observer replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Capture files: pcap or pcapng (e.g. `tcpdump -i eth0 -w FILE`).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// An address of the node that captured (repeatable): frames from it
    /// count as sent (tx, peer = outer destination) instead of received.
    #[arg(long = "local", value_name = "ADDR")]
    pub local: Vec<IpAddr>,

    /// table (for people) or json (one object per line, attach's schema
    /// plus a `replay` line per capture). Default: table on a terminal,
    /// json otherwise.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

    /// Which UDP ports mean which encapsulation.
    #[command(flatten)]
    pub ports: PortArgs,

    /// Allow-set (ipset or nftables set on this node) of sources allowed
    /// to send VXLAN (`vxlan=NAME`, the default) or IPIP (`ipip=NAME`),
    /// beside Calico's sets, read once at start. Received tunnel frames
    /// from other sources count as drop reason calico_allow_set.
    #[arg(long = "allow-set", value_name = "[PROTO=]NAME")]
    pub allow_sets: Vec<Tagged<String>>,

    /// Prefix allowed to send VXLAN (`vxlan=CIDR`, the default) or IPIP
    /// (`ipip=CIDR`), e.g. the capturing cluster's node network. Repeatable.
    #[arg(long = "allow-cidr", value_name = "[PROTO=]CIDR")]
    pub allow_cidrs: Vec<Tagged<ipnet::IpNet>>,

    /// Load the observer's eBPF programs into this kernel (attached to
    /// nothing) and run each frame through them with BPF_PROG_TEST_RUN,
    /// instead of their parser compiled into observer. Needs root, or
    /// CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON. Counts the same, about ten
    /// times slower: use it to see what this kernel's build of the
    /// programs makes of a capture.
    #[arg(long)]
    pub kernel: bool,
}

/// UDP ports that mean an encapsulation (attach, diagnose, replay).
#[derive(Debug, Clone, Default, Args)]
pub struct PortArgs {
    /// UDP destination port(s) carrying VXLAN [default: 4789, 8472].
    #[arg(long = "vxlan-port", value_name = "PORT")]
    pub vxlan_ports: Vec<u16>,

    /// UDP port(s) carrying VXLAN-GPE [default: 4790].
    #[arg(long = "vxlan-gpe-port", value_name = "PORT")]
    pub vxlan_gpe_ports: Vec<u16>,

    /// UDP port(s) carrying Geneve [default: 6081].
    #[arg(long = "geneve-port", value_name = "PORT")]
    pub geneve_ports: Vec<u16>,

    /// UDP port(s) carrying WireGuard, matched as destination or source
    /// [default: 51820, 51821].
    #[arg(long = "wireguard-port", value_name = "PORT")]
    pub wireguard_ports: Vec<u16>,
}

/// Parses `500ms`, `2s`, `1m`, `1h30m`; a bare number means seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 500ms, 2s, 1m)"))?
        }
    };
    if duration.is_zero() {
        return Err("must be greater than zero".to_string());
    }
    // Timers add it to the clock, which must not overflow.
    if duration > MAX_DURATION {
        return Err("must be at most 10 years (87600h)".to_string());
    }
    Ok(duration)
}

/// The longest `--interval`, `--duration` or refresh period accepted.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Width the generated docs wrap `--help` at.
    const DOCS_WIDTH: usize = 100;

    /// docs/reference.md: `observer --help` and every command's `--help`,
    /// as clap renders them, so no option table in the docs can drift
    /// from the flags.
    fn reference_markdown() -> String {
        let mut cli = Cli::command().term_width(DOCS_WIDTH);
        cli.build();
        let mut text = String::from(
            "# Command reference\n\n\
             Generated from the observer's `--help` by `cargo xtask docs`; \
             `cargo xtask test` fails\nwhen it differs. The man pages are in \
             [man/](man/) (`man ./docs/man/observer-attach.1`).\n\n",
        );
        let mut section = |title: &str, cmd: &mut clap::Command| {
            let help = cmd.render_long_help().to_string();
            let help: Vec<&str> = help.lines().map(str::trim_end).collect();
            text.push_str(&format!(
                "## {title}\n\n```text\n{}\n```\n\n",
                help.join("\n")
            ));
        };
        section("observer", &mut cli.clone());
        for sub in cli.get_subcommands_mut() {
            let title = format!("observer {}", sub.get_name());
            section(&title, sub);
        }
        format!("{}\n", text.trim_end())
    }

    /// docs/man/: a man page per command (`observer.1`,
    /// `observer-attach.1`, ...), rendered by clap_mangen.
    fn man_pages() -> Vec<(String, Vec<u8>)> {
        let dir = tempfile::tempdir().expect("a directory for the man pages");
        clap_mangen::generate_to(Cli::command(), dir.path()).expect("rendering the man pages");
        let mut pages: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
            .expect("listing the man pages")
            .map(|entry| {
                let path = entry.expect("a man page").path();
                let name = path.file_name().unwrap().to_string_lossy();
                (format!("man/{name}"), std::fs::read(&path).unwrap())
            })
            .collect();
        pages.sort();
        pages
    }

    /// The generated docs match the flags (`cargo xtask docs`, which sets
    /// OBSERVER_WRITE_DOCS=1, rewrites them).
    #[test]
    fn generated_docs_match_the_help() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let mut generated = man_pages();
        generated.push((
            "reference.md".to_string(),
            reference_markdown().into_bytes(),
        ));
        let write = std::env::var("OBSERVER_WRITE_DOCS").is_ok_and(|v| v == "1");
        if write {
            let _ = std::fs::remove_dir_all(docs.join("man"));
            std::fs::create_dir_all(docs.join("man")).expect("creating docs/man");
        }
        let pages: std::collections::BTreeSet<String> = std::fs::read_dir(docs.join("man"))
            .map(|dir| {
                dir.flatten()
                    .map(|e| format!("man/{}", e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default();
        let expected: std::collections::BTreeSet<String> = generated
            .iter()
            .filter(|(n, _)| n.starts_with("man/"))
            .map(|(n, _)| n.clone())
            .collect();
        assert!(
            write || pages == expected,
            "docs/man holds {pages:?}, the commands make {expected:?}: run `cargo xtask docs`"
        );
        for (name, generated) in generated {
            let path = docs.join(name);
            if write {
                std::fs::write(&path, &generated).expect("writing the generated docs");
                continue;
            }
            let current = std::fs::read(&path).unwrap_or_default();
            assert!(
                current == generated,
                "{} differs from the observer's --help: run `cargo xtask docs`",
                path.display()
            );
        }
    }

    /// The README stays a short entry point and nothing a user reads or
    /// a test opens points outside the repository.
    #[test]
    fn the_readme_is_short_and_the_repository_stands_alone() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        assert!(
            readme.lines().count() <= 250,
            "README.md has {} lines: move the detail to docs/",
            readme.lines().count()
        );
        let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
        for dir in ["docs", "observer/tests", "observer/tests/support"] {
            for entry in std::fs::read_dir(root.join(dir)).expect(dir).flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "md" || e == "rs") {
                    files.push(path);
                }
            }
        }
        for path in files {
            let text = std::fs::read_to_string(&path).expect("reading a doc or test");
            assert!(
                !text.contains(concat!("../", "shared")),
                "{} refers to a folder outside the repository",
                path.display()
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("examples"));
        // Would overflow the clock's deadlines.
        assert!(
            parse_duration("18446744073709551615")
                .unwrap_err()
                .contains("at most")
        );
        assert_eq!(parse_duration("87600h"), Ok(MAX_DURATION));
    }

    #[test]
    fn attach_parses_ports_and_modes() {
        let cli = Cli::try_parse_from([
            "observer",
            "attach",
            "eth0",
            "eth1",
            "--vxlan-port",
            "4789",
            "--vxlan-port",
            "9000",
            "--xdp-mode",
            "off",
            "--output",
            "json",
        ])
        .unwrap();
        let Command::Attach(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args.ifaces, ["eth0", "eth1"]);
        assert_eq!(args.ports.vxlan_ports, [4789, 9000]);
        assert_eq!(args.xdp_mode, Some(XdpMode::Off));
        assert_eq!(args.output, Some(Format::Json));
    }

    #[test]
    fn diagnose_takes_the_attach_options_and_no_interface() {
        let cli = Cli::try_parse_from([
            "observer",
            "diagnose",
            "--netns",
            "gpu",
            "--anomaly-window",
            "3s",
        ])
        .unwrap();
        let Command::Diagnose(args) = cli.command else {
            panic!("not diagnose")
        };
        assert!(args.attach.ifaces.is_empty());
        assert_eq!(args.attach.netns.as_deref(), Some("gpu"));
        assert_eq!(args.attach.anomaly_window, Some(Duration::from_secs(3)));
    }

    #[test]
    fn replay_takes_files_and_local_addresses() {
        let cli = Cli::try_parse_from([
            "observer",
            "replay",
            "a.pcap",
            "b.pcapng",
            "--local",
            "10.0.0.5",
            "--local",
            "2001:db8::5",
            "--allow-cidr",
            "ipip=10.0.0.0/24",
        ])
        .unwrap();
        let Command::Replay(args) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(args.files.len(), 2);
        assert_eq!(args.local.len(), 2);
        assert_eq!(args.allow_cidrs.len(), 1);
        assert!(Cli::try_parse_from(["observer", "replay"]).is_err());
    }
}

/// A failure (or its absence) the lab rebuilds (`observer lab --scenario`);
/// what each does is in `lab::scenarios`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// docs/incidents.md: the router drops UDP/4789 from the GPU node and
    /// source-NATs VXLAN toward it to 10.10.10.244, which Calico drops; IPIP
    /// passes with the real node addresses.
    Incident,
    /// Only the one-way block: UDP/4789 from the GPU node toward the
    /// control plane is dropped by the router.
    UdpBlock,
    /// The router's link toward the GPU node has MTU 1400 (nodes 1500):
    /// 1400-byte pod pings overflow the path, 1300-byte ones fit.
    Mtu,
    /// The fix half-applied: the GPU node routes cp1's VXLAN block over
    /// tunl0 (IPIP) while cp1 still sends VXLAN.
    EncapMismatch,
    /// Everything works in both directions.
    Healthy,
    /// Calico's BGP mode: four nodes in a full iBGP mesh (AS 64512), each
    /// with its own BIRD; BIRD stops on n4, the others lose its block and
    /// pings to it die, then BIRD comes back and so do the routes.
    BgpDown,
    /// The same mesh, where n1's BIRD import filter rejects the block of
    /// n4, the newest node: n1 has no route to n4's pods while n2 and n3
    /// do.
    NewNode,
    /// The same mesh; n4 leaves (its BIRD stops, its link goes down, the
    /// others drop it from their BIRD configs) but n1 keeps a route to its
    /// old block.
    StaleRoute,
}

/// Output format of `observer lab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LabFormat {
    /// Live per-node view, then the write-up, for people.
    Text,
    /// One JSON object per line, for scripts and tests.
    Json,
}
