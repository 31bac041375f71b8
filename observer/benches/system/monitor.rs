//! What the monitor costs a node with no packets to count: CPU (its own
//! and its tools', as a share of one core) and RSS of `observer attach` in
//! steady state, on an idle namespace and on one holding Calico's rules at
//! scale (50,000 iptables rules, an nftables table of 50,000 rules, policy
//! sets of 10,000 elements, Calico's allow-sets and drop rules), with the
//! intervals it printed late.

use std::{
    fmt::Write as _,
    fs,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};

use super::{Namespaces, report, sh, target_dir};

/// Policy chains Calico writes per table, and rules in each: 50,000.
const CHAINS: usize = 500;
const RULES_PER_CHAIN: usize = 100;
/// Elements of each of the two policy sets.
const POLICY_SET_ELEMENTS: usize = 10_000;
/// Nodes in the VXLAN allow-set.
const NODES: usize = 1_000;

/// Both scenarios: the idle namespace for 30 s, Calico's for 305 s (its
/// window holds one of the searches for Calico's rules made every
/// `netfilter::RESCAN`, 5 minutes, so their cost is in the figure).
pub fn run() -> anyhow::Result<()> {
    let calico_window = observer::node::netfilter::RESCAN.as_secs() + 5;
    for (name, calico, window) in [("idle", false, 30), ("calico_50k", true, calico_window)] {
        let ns = format!("obsm{}{}", std::process::id(), &name[..1]);
        let _guard = Namespaces(vec![ns.clone()]);
        sh(&["ip", "netns", "add", &ns])?;
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        if calico {
            let loaded = Instant::now();
            load_calico(&ns)?;
            eprintln!(
                "bench: monitor: {} iptables rules, {} nft rules and two sets of {POLICY_SET_ELEMENTS} loaded in {:.1} s",
                CHAINS * RULES_PER_CHAIN,
                CHAINS * RULES_PER_CHAIN,
                loaded.elapsed().as_secs_f64()
            );
        }
        measure(name, &ns, Duration::from_secs(window))?;
    }
    Ok(())
}

/// Runs the release observer on `ns`'s lo and reports its steady-state
/// cost over `window`, from its first interval on (start-up, BTF parsing
/// and the first reads excluded).
fn measure(name: &str, ns: &str, window: Duration) -> anyhow::Result<()> {
    let out = target_dir().join(format!("bench-monitor-{}.jsonl", std::process::id()));
    // Another build (an earlier commit's) can be measured the same way.
    let binary =
        std::env::var("OBSERVER_BENCH_BINARY").unwrap_or(env!("CARGO_BIN_EXE_observer").into());
    let mut child = Command::new(binary)
        .args(["attach", "--netns", ns, "lo", "--output", "json"])
        .env("OBSERVER_LOG", "error")
        .stdout(fs::File::create(&out)?)
        .stdin(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let result = (|| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !fs::read_to_string(&out)?.contains(r#""type":"stats""#) {
            ensure!(
                Instant::now() < deadline,
                "observer printed no interval in 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (cpu_before, late_before) = (cpu_ticks(pid)?, late_intervals(&out)?);
        let start = Instant::now();
        let mut rss_max_kib = 0;
        while start.elapsed() < window {
            rss_max_kib = rss_max_kib.max(rss_kib(pid)?);
            std::thread::sleep(Duration::from_millis(100));
        }
        let seconds = start.elapsed().as_secs_f64();
        let (cpu_after, late_after) = (cpu_ticks(pid)?, late_intervals(&out)?);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let cpu = (cpu_after - cpu_before) as f64 / hz;
        report(
            &format!("monitor_{name}_cpu"),
            format!("{:.2}", cpu / seconds * 100.0),
            "% of a core",
        );
        report(
            &format!("monitor_{name}_rss"),
            format!("{:.1}", rss_max_kib as f64 / 1024.0),
            "MiB",
        );
        report(
            &format!("monitor_{name}_late_intervals"),
            late_after - late_before,
            &format!("of {:.0}", seconds),
        );
        Ok(())
    })();
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let _ = child.wait();
    let _ = fs::remove_file(&out);
    result
}

/// CPU ticks of process `pid` and of the children it has waited for (the
/// tools it runs): utime + stime + cutime + cstime of /proc/PID/stat.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: fields count from after its ')'.
    let after = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) .. cstime (17) are 11..15.
    let ticks: Vec<u64> = fields
        .get(11..15)
        .context("/proc/PID/stat too short")?
        .iter()
        .map(|f| f.parse())
        .collect::<Result<_, _>>()?;
    Ok(ticks.iter().sum())
}

/// Resident set size of process `pid`, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// `late_intervals` of the last stats line written to `out`.
fn late_intervals(out: &std::path::Path) -> anyhow::Result<u64> {
    let text = fs::read_to_string(out)?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains(r#""type":"stats""#))
        .context("no stats line")?;
    let stats: serde_json::Value = serde_json::from_str(line)?;
    stats["late_intervals"]
        .as_u64()
        .context("stats line without late_intervals")
}

/// Calico's rules at scale in `ns`, as its iptables and nftables data
/// planes write them: policy chains of `cali:`-commented rules matching
/// addresses and policy sets, `cali-INPUT` with the VXLAN and IPIP
/// allow-set rules, and the allow-sets themselves (ipset and nftables).
fn load_calico(ns: &str) -> anyhow::Result<()> {
    let node = |i: usize| format!("10.{}.{}.1", 64 + i / 256, i % 256);
    let member = |i: usize| format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256);

    let mut ipset = String::new();
    writeln!(
        ipset,
        "create cali40all-vxlan-net hash:net family inet maxelem {NODES}"
    )?;
    for i in 0..NODES {
        writeln!(ipset, "add cali40all-vxlan-net {}/32", node(i))?;
    }
    restore(ns, "ipset", &["restore"], &ipset)?;

    let mut iptables = String::from("*filter\n:cali-INPUT - [0:0]\n");
    for chain in 0..CHAINS {
        writeln!(iptables, ":cali-pi-{chain:04} - [0:0]")?;
    }
    iptables.push_str("-A INPUT -j cali-INPUT\n");
    iptables.push_str(
        "-A cali-INPUT -p udp -m comment --comment \"Allow IPv4 VXLAN packets from allowed hosts\" -m set --match-set cali40all-vxlan-net src -m addrtype --dst-type LOCAL -m udp --dport 4789 -j ACCEPT\n\
         -A cali-INPUT -p udp -m comment --comment \"Drop IPv4 VXLAN packets from non-allowed hosts\" -m addrtype --dst-type LOCAL -m udp --dport 4789 -j DROP\n",
    );
    for chain in 0..CHAINS {
        for rule in 0..RULES_PER_CHAIN {
            let i = chain * RULES_PER_CHAIN + rule;
            writeln!(
                iptables,
                "-A cali-pi-{chain:04} -s {}/32 -p tcp -m comment --comment \"cali:{i:016x}\" -m tcp --dport {} -j MARK --set-xmark 0x10000/0x10000",
                member(i),
                1024 + rule
            )?;
        }
    }
    iptables.push_str("COMMIT\n");
    restore(ns, "iptables-restore", &[], &iptables)?;

    let mut nft = String::from("table ip calico {\n");
    for (set, count) in [
        ("cali40all-vxlan-net", NODES),
        ("cali40s-policy-a", POLICY_SET_ELEMENTS),
        ("cali40s-policy-b", POLICY_SET_ELEMENTS),
    ] {
        writeln!(
            nft,
            "set {set} {{\ntype ipv4_addr\nflags interval\nelements = {{"
        )?;
        for i in 0..count {
            let address = if count == NODES {
                node(i)
            } else {
                member(i + usize::from(set.ends_with('b')) * POLICY_SET_ELEMENTS)
            };
            writeln!(nft, "{address},")?;
        }
        nft.push_str("}\n}\n");
    }
    nft.push_str(
        "chain filter-INPUT {\ntype filter hook input priority filter; policy accept;\n\
         ip saddr @cali40all-vxlan-net fib daddr type local udp dport 4789 counter accept comment \"Allow IPv4 VXLAN packets from allowed hosts\"\n\
         fib daddr type local udp dport 4789 counter drop comment \"Drop IPv4 VXLAN packets from non-allowed hosts\"\n}\n",
    );
    for chain in 0..CHAINS {
        writeln!(nft, "chain filter-cali-pi-{chain:04} {{")?;
        for rule in 0..RULES_PER_CHAIN {
            let i = chain * RULES_PER_CHAIN + rule;
            let set = if i.is_multiple_of(2) { "a" } else { "b" };
            writeln!(
                nft,
                "ip saddr @cali40s-policy-{set} tcp dport {} counter meta mark set mark or 0x10000 comment \"cali:{i:016x}\"",
                1024 + rule
            )?;
        }
        nft.push_str("}\n");
    }
    nft.push_str("}\n");
    restore(ns, "nft", &["-f", "-"], &nft)
}

/// Runs `tool args` in `ns` with `input` on its standard input.
fn restore(ns: &str, tool: &str, args: &[&str], input: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, tool])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(
        output.status.success(),
        "{tool} {} in {ns}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
