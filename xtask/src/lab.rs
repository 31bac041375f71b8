//! `cargo xtask lab`: a three-node overlay in network namespaces, observed
//! live.
//!
//! ```text
//!        198.18.0.2/30          198.18.0.1/30   198.18.0.5/30          198.18.0.6/30
//!  node-b  veth-a  <------------>  veth-b   node-a   veth-c  <------------>  veth-a  node-c
//!  vxlan4096 198.19.1.2/24   vxlan4096 198.19.1.1/24   flannel.1 198.19.10.0/32   flannel.1 198.19.12.0/32
//!       VNI 4096, UDP 4789 (a <-> b)                    VNI 1, UDP 8472, flannel-style (a <-> c)
//! ```
//!
//! node-a is in the middle; the observer attaches to its two underlay
//! interfaces. IPv6 is off and every neighbour (underlay and overlay) is
//! static, so the only traffic is the pings this task sends, and only to
//! addresses inside these namespaces. Namespaces are named
//! `obslab-<pid>-a|b|c`; deleting them removes every device in them.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::util::{self, workspace_root};

/// Options of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Echo requests sent by each of the four pings (one every 50 ms).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=1000))]
    count: u32,
    /// How long the observer runs, in seconds (its `--duration`).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(2..=600))]
    duration: u64,
    /// Output format of the observer (default: table on a terminal, JSON otherwise).
    #[arg(long, value_parser = ["table", "json"])]
    output: Option<String>,
}

const PREFIX: &str = "obslab-";

/// One namespace of the lab.
struct Node {
    ns: String,
    label: &'static str,
}

/// What must be undone; dropping it kills the lab's processes and deletes
/// its namespaces (with them every veth and vxlan device).
struct Lab {
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
}

impl Lab {
    fn spawn(&mut self, what: &str, cmd: &mut Command) -> Result<usize> {
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {what}: `{}`", util::display(cmd)))?;
        self.children.push((what.to_string(), child));
        Ok(self.children.len() - 1)
    }

    fn stop_children(&mut self) {
        for (_, child) in &mut self.children {
            if let Ok(None) = child.try_wait() {
                // SAFETY: plain kill(2) of our own child, still unreaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for (what, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        eprintln!("lab: {what} ignores SIGTERM; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.children.clear();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_children();
        if self.namespaces.is_empty() {
            return;
        }
        for ns in &self.namespaces {
            if let Err(e) = util::output(Command::new("ip").args(["netns", "del", ns])) {
                eprintln!("lab: cleanup: {e:#}");
            }
        }
        println!("lab: removed namespaces {}", self.namespaces.join(" "));
    }
}

/// Set by SIGINT / SIGTERM / SIGHUP; checked between steps and while waiting.
fn interrupted(flag: &AtomicBool) -> Result<()> {
    if flag.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Runs `program` with the whitespace-separated words of `args` (none of
/// the lab's arguments contain spaces), quietly; fails with its message.
fn sh(program: &str, args: &str) -> Result<()> {
    util::output(Command::new(program).args(args.split_whitespace())).map(drop)
}

/// `ip ARGS`; see [`sh`].
fn ip(args: &str) -> Result<()> {
    sh("ip", args)
}

/// Runs the demo.
pub fn lab(args: &LabArgs) -> Result<()> {
    let flag = Arc::new(AtomicBool::new(false));
    {
        let flag = flag.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("cannot install the Ctrl-C handler")?;
    }

    println!("lab: building the observer");
    crate::build_release()?;
    let observer = workspace_root().join("target/release/observer");
    interrupted(&flag)?;

    remove_stale_labs();

    let pid = std::process::id();
    let node = |x: &str, label| Node {
        ns: format!("{PREFIX}{pid}-{x}"),
        label,
    };
    let (a, b, c) = (
        node("a", "node-a"),
        node("b", "node-b"),
        node("c", "node-c"),
    );
    let mut lab = Lab {
        namespaces: Vec::new(),
        children: Vec::new(),
    };

    println!(
        "lab: creating namespaces {} (node-a), {} (node-b), {} (node-c)",
        a.ns, b.ns, c.ns
    );
    for n in [&a, &b, &c] {
        ip(&format!("netns add {}", n.ns))?;
        lab.namespaces.push(n.ns.clone());
        // IPv6 off before any device exists, so no router solicitations or
        // MLD reports appear in the counters.
        sh(
            "ip",
            &format!(
                "netns exec {} sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 \
                 net.ipv6.conf.default.disable_ipv6=1",
                n.ns
            ),
        )
        .with_context(|| format!("disabling IPv6 in {}", n.label))?;
        ip(&format!("-n {} link set lo up", n.ns))?;
        interrupted(&flag)?;
    }

    // Fixed MACs so the static neighbour entries can name them.
    const A_VETH_B: &str = "02:0b:5e:00:0a:0b";
    const B_VETH_A: &str = "02:0b:5e:00:0b:0a";
    const A_VETH_C: &str = "02:0b:5e:00:0a:0c";
    const C_VETH_A: &str = "02:0b:5e:00:0c:0a";
    const A_VXLAN: &str = "02:0b:5e:01:0a:00";
    const B_VXLAN: &str = "02:0b:5e:01:0b:00";
    const A_FLANNEL: &str = "02:0b:5e:02:0a:00";
    const C_FLANNEL: &str = "02:0b:5e:02:0c:00";

    println!("lab: underlay  node-a veth-b 198.18.0.1/30 <-> node-b veth-a 198.18.0.2/30");
    println!("lab: underlay  node-a veth-c 198.18.0.5/30 <-> node-c veth-a 198.18.0.6/30");
    let ends = |n1: &Node, n2: &Node| format!("{} <-> {}", n1.label, n2.label);
    underlay(
        (&a, "veth-b", A_VETH_B, "198.18.0.1"),
        (&b, "veth-a", B_VETH_A, "198.18.0.2"),
    )
    .with_context(|| format!("underlay {}", ends(&a, &b)))?;
    underlay(
        (&a, "veth-c", A_VETH_C, "198.18.0.5"),
        (&c, "veth-a", C_VETH_A, "198.18.0.6"),
    )
    .with_context(|| format!("underlay {}", ends(&a, &c)))?;
    interrupted(&flag)?;

    println!(
        "lab: overlay   vxlan4096 (VNI 4096, UDP 4789): node-a 198.19.1.1/24 <-> node-b 198.19.1.2/24"
    );
    let vxlan = [
        (
            &a,
            "veth-b",
            A_VXLAN,
            "198.18.0.1 remote 198.18.0.2",
            "198.19.1.1/24",
            "198.19.1.2",
            B_VXLAN,
        ),
        (
            &b,
            "veth-a",
            B_VXLAN,
            "198.18.0.2 remote 198.18.0.1",
            "198.19.1.2/24",
            "198.19.1.1",
            A_VXLAN,
        ),
    ];
    for (n, dev, mac, local_remote, addr, peer, peer_mac) in vxlan {
        let ns = &n.ns;
        ip(&format!(
            "-n {ns} link add vxlan4096 address {mac} type vxlan id 4096 dstport 4789 \
             local {local_remote} dev {dev} nolearning"
        ))?;
        ip(&format!("-n {ns} addr add {addr} dev vxlan4096"))?;
        ip(&format!("-n {ns} link set vxlan4096 up"))?;
        ip(&format!(
            "-n {ns} neigh replace {peer} lladdr {peer_mac} dev vxlan4096 nud permanent"
        ))?;
    }
    interrupted(&flag)?;

    // flannel's vxlan backend: a /32 on flannel.1 per node, a route to each
    // remote node's subnet via its flannel.1 address (onlink), a permanent
    // neighbour for that address and an FDB entry mapping its MAC to the
    // node's underlay address.
    println!(
        "lab: overlay   flannel.1 (VNI 1, UDP 8472, flannel-style): node-a 198.19.10.0/32 \
         (subnet 198.19.10.0/24) <-> node-c 198.19.12.0/32 (subnet 198.19.12.0/24)"
    );
    let flannel = [
        (
            &a,
            "veth-c",
            A_FLANNEL,
            "198.18.0.5",
            "198.19.10.0",
            "198.19.12.0",
            C_FLANNEL,
            "198.18.0.6",
        ),
        (
            &c,
            "veth-a",
            C_FLANNEL,
            "198.18.0.6",
            "198.19.12.0",
            "198.19.10.0",
            A_FLANNEL,
            "198.18.0.5",
        ),
    ];
    for (n, dev, mac, local, addr, peer, peer_mac, peer_underlay) in flannel {
        let ns = &n.ns;
        ip(&format!(
            "-n {ns} link add flannel.1 address {mac} type vxlan id 1 dstport 8472 \
             local {local} dev {dev} nolearning"
        ))?;
        ip(&format!("-n {ns} addr add {addr}/32 dev flannel.1"))?;
        ip(&format!("-n {ns} link set flannel.1 up"))?;
        ip(&format!(
            "-n {ns} neigh replace {peer} lladdr {peer_mac} dev flannel.1 nud permanent"
        ))?;
        sh(
            "bridge",
            &format!(
                "-n {ns} fdb append {peer_mac} dev flannel.1 dst {peer_underlay} self permanent"
            ),
        )?;
        ip(&format!(
            "-n {ns} route add {peer}/24 via {peer} dev flannel.1 onlink"
        ))?;
    }
    interrupted(&flag)?;

    // One echo each way before the demo, so a broken topology says so here
    // rather than as an empty table.
    let pings = [
        (&a, "198.19.1.2", "node-a -> node-b over vxlan4096"),
        (&b, "198.19.1.1", "node-b -> node-a over vxlan4096"),
        (&a, "198.19.12.0", "node-a -> node-c over flannel.1"),
        (&c, "198.19.10.0", "node-c -> node-a over flannel.1"),
    ];
    for (n, dst, what) in pings {
        ip(&format!("netns exec {} ping -q -n -c 1 -W 2 {dst}", n.ns)).with_context(|| {
            format!("the lab's overlay does not work: ping {what} ({dst}) failed")
        })?;
    }
    println!("lab: overlay works in all four directions (one ping each)");

    let ping_secs = f64::from(args.count) * 0.055;
    println!();
    println!(
        "lab: now running, in node-a: {} attach --netns {} --interval 1s --duration {}s veth-b veth-c",
        Path::new("target/release/observer").display(),
        a.ns,
        args.duration
    );
    println!(
        "lab: and {} pings (-c {} -i 0.05, about {ping_secs:.1}s each) in both directions on both tunnels",
        pings.len(),
        args.count
    );
    let total = 2 * args.count;
    println!("lab: what to look at, every second:");
    println!(
        "       - veth-b, peer 198.18.0.2, vxlan, VNI 4096: rx and tx each grow by ~36 packets/s \
         (echo requests one way + replies the other), 148 bytes per packet on the wire \
         (98-byte inner frame + 50 bytes of VXLAN/UDP/IPv4/Ethernet)"
    );
    println!("       - veth-c, peer 198.18.0.6, vxlan, VNI 1 (port 8472, flannel-style): the same");
    println!(
        "       - once the pings end, every one of those four rows totals {total} packets \
         ({} requests + {} replies)",
        args.count, args.count
    );
    // Pings start 1 s after the observer and take ~55 ms per request.
    if 1.0 + ping_secs > args.duration as f64 {
        println!(
            "       (--count {} outlasts --duration {}s: the pings will be cut short)",
            args.count, args.duration
        );
    }
    println!("       - inner samples: 198.19.1.x on veth-b, 198.19.10.0 <-> 198.19.12.0 on veth-c");
    println!("       - nothing unclassified: IPv6 is off and no ARP is needed (static neighbours)");
    println!();

    let mut cmd = Command::new(&observer);
    cmd.args(["attach", "--netns", &a.ns, "--interval", "1s"])
        .arg("--duration")
        .arg(format!("{}s", args.duration));
    if let Some(output) = &args.output {
        cmd.args(["--output", output]);
    }
    cmd.args(["veth-b", "veth-c"]);
    let observer_idx = lab.spawn("the observer", &mut cmd)?;

    // Let the observer load and attach before traffic starts; stop early if
    // it fails.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        interrupted(&flag)?;
        if let Some(status) = lab.children[observer_idx].1.try_wait()? {
            bail!("the observer exited before traffic started ({status})");
        }
        thread::sleep(Duration::from_millis(20));
    }

    let count = args.count.to_string();
    let mut ping_idx = Vec::new();
    for (n, dst, what) in pings {
        let idx = lab.spawn(
            what,
            Command::new("ip")
                .args(["netns", "exec", &n.ns])
                .args(["ping", "-q", "-n", "-c", &count, "-i", "0.05", dst])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )?;
        ping_idx.push(idx);
    }

    // Wait for the observer to finish its --duration.
    let observer_status = loop {
        interrupted(&flag)?;
        if let Some(status) = lab.children[observer_idx].1.try_wait()? {
            break status;
        }
        thread::sleep(Duration::from_millis(50));
    };

    // Pings normally end before the observer; stop any still running soon
    // after it (the observer no longer shows them).
    let deadline = Instant::now() + Duration::from_secs(2);
    println!();
    for idx in ping_idx {
        let (what, child) = &mut lab.children[idx];
        while child.try_wait()?.is_none() && Instant::now() < deadline {
            interrupted(&flag)?;
            thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait()?.is_none() {
            println!("lab: ping {what}: still running; stopping it");
            continue;
        }
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            use std::io::Read;
            let _ = stdout.read_to_string(&mut out);
        }
        let summary = out
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or("no summary")
            .to_string();
        println!("lab: ping {what}: {summary}");
    }
    if !observer_status.success() {
        bail!("the observer failed ({observer_status})");
    }
    println!("lab: done; removing the lab");
    drop(lab);
    Ok(())
}

/// One end of a veth pair: namespace, device name, MAC, IPv4 address (/30).
type End<'a> = (&'a Node, &'a str, &'a str, &'a str);

/// Creates a veth pair between two namespaces with fixed MACs, addresses
/// and static neighbour entries.
fn underlay(one: End, two: End) -> Result<()> {
    let ((n1, if1, mac1, _), (n2, if2, mac2, _)) = (one, two);
    ip(&format!(
        "-n {} link add {if1} address {mac1} type veth peer name {if2} address {mac2} netns {}",
        n1.ns, n2.ns
    ))?;
    for ((n, dev, _, addr), (_, _, peer_mac, peer)) in [(one, two), (two, one)] {
        let ns = &n.ns;
        ip(&format!("-n {ns} addr add {addr}/30 dev {dev}"))?;
        ip(&format!("-n {ns} link set {dev} up"))?;
        ip(&format!(
            "-n {ns} neigh replace {peer} lladdr {peer_mac} dev {dev} nud permanent"
        ))?;
    }
    Ok(())
}

/// Deletes namespaces left by a lab whose process no longer exists (killed
/// with SIGKILL, so its cleanup never ran).
fn remove_stale_labs() {
    let Ok(out) = util::output(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match ip(&format!("netns del {name}")) {
            Ok(()) => println!("lab: removed {name}, left over by an earlier lab that was killed"),
            Err(e) => eprintln!("lab: cannot remove stale namespace {name}: {e:#}"),
        }
    }
}
