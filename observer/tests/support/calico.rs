//! Calico's node-side drop machinery inside a test namespace (owned by the
//! drop tests): the ipset / nftables allow-sets and the iptables / nftables
//! rules that drop tunnel traffic from sources outside them, their
//! counters and the kernel's drop reason names. Everything lives in namespaces that [`Netns`]
//! deletes, so nothing outlives a test, also when it panics.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::netns::{Netns, ObserverProcess, ObserverRun, WAIT, run};

/// Calico's IPv4 VXLAN allow-set.
pub const VXLAN_SET: &str = "cali40all-vxlan-net";
/// Calico's IPIP allow-set (all Calico hosts).
pub const HOSTS_SET: &str = "cali40all-hosts-net";
/// Comment of Calico's rule accepting VXLAN from the allow-set.
pub const VXLAN_ALLOW_RULE: &str = "Allow IPv4 VXLAN packets from allowed hosts";
/// Comment of Calico's rule dropping VXLAN from other sources.
pub const VXLAN_DROP_RULE: &str = "Drop IPv4 VXLAN packets from non-allowed hosts";
/// Comment of Calico's rule dropping IPIP from non-Calico hosts.
pub const IPIP_DROP_RULE: &str = "Drop IPIP packets from non-Calico hosts";

// ------------------------------------------------------------ ipset

/// `ipset create NAME hash:net` with `members`, in `ns`.
pub fn ipset_create(ns: &Netns, name: &str, members: &[&str]) {
    ns.exec_ok(&["ipset", "create", name, "hash:net"]);
    for member in members {
        ipset_add(ns, name, member);
    }
}

/// `ipset add NAME MEMBER`.
pub fn ipset_add(ns: &Netns, name: &str, member: &str) {
    ns.exec_ok(&["ipset", "add", name, member]);
}

/// `ipset del NAME MEMBER`.
pub fn ipset_del(ns: &Netns, name: &str, member: &str) {
    ns.exec_ok(&["ipset", "del", name, member]);
}

// ------------------------------------------------------------ iptables

/// Chain `cali-INPUT`, jumped to from INPUT, as Calico's iptables data
/// plane has it.
fn cali_input(ns: &Netns) {
    if !ns
        .exec(&["iptables", "-w", "-n", "-L", "cali-INPUT"])
        .status
        .success()
    {
        ns.exec_ok(&["iptables", "-w", "-N", "cali-INPUT"]);
        ns.exec_ok(&["iptables", "-w", "-A", "INPUT", "-j", "cali-INPUT"]);
    }
}

/// Calico's VXLAN rule pair (iptables data plane): accept UDP 4789 to a
/// local address from [`VXLAN_SET`], drop it from anyone else.
pub fn iptables_vxlan_rules(ns: &Netns) {
    cali_input(ns);
    ns.exec_ok(&[
        "iptables",
        "-w",
        "-A",
        "cali-INPUT",
        "-p",
        "udp",
        "-m",
        "comment",
        "--comment",
        VXLAN_ALLOW_RULE,
        "-m",
        "set",
        "--match-set",
        VXLAN_SET,
        "src",
        "-m",
        "addrtype",
        "--dst-type",
        "LOCAL",
        "-m",
        "udp",
        "--dport",
        "4789",
        "-j",
        "ACCEPT",
    ]);
    ns.exec_ok(&[
        "iptables",
        "-w",
        "-A",
        "cali-INPUT",
        "-p",
        "udp",
        "-m",
        "comment",
        "--comment",
        VXLAN_DROP_RULE,
        "-m",
        "addrtype",
        "--dst-type",
        "LOCAL",
        "-m",
        "udp",
        "--dport",
        "4789",
        "-j",
        "DROP",
    ]);
}

/// Calico's IPIP rule (iptables data plane): drop protocol 4 from sources
/// outside [`HOSTS_SET`].
pub fn iptables_ipip_rule(ns: &Netns) {
    cali_input(ns);
    ns.exec_ok(&[
        "iptables",
        "-w",
        "-A",
        "cali-INPUT",
        "-p",
        "ipencap",
        "-m",
        "set",
        "!",
        "--match-set",
        HOSTS_SET,
        "src",
        "-m",
        "comment",
        "--comment",
        IPIP_DROP_RULE,
        "-j",
        "DROP",
    ]);
}

/// `iptables -w RULE... -m comment --comment COMMENT -j DROP` in `ns`
/// (`rule`: the table, chain and matches); [`iptables_counter`] reads it
/// back by its comment.
pub fn iptables_drop(ns: &Netns, rule: &[&str], comment: &str) {
    let mut argv = vec!["iptables", "-w"];
    argv.extend_from_slice(rule);
    argv.extend(["-m", "comment", "--comment", comment, "-j", "DROP"]);
    ns.exec_ok(&argv);
}

/// (packets, bytes) of the iptables rule commented `comment`, from
/// `iptables-save -c` (`[P:B] -A chain ... --comment "..." ...`).
pub fn iptables_counter(ns: &Netns, comment: &str) -> (u64, u64) {
    let output = ns.exec_ok(&["iptables-save", "-c"]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let quoted = format!("--comment \"{comment}\"");
    let line = text
        .lines()
        .find(|l| l.starts_with('[') && l.contains(&quoted))
        .unwrap_or_else(|| panic!("no rule {quoted} in iptables-save -c:\n{text}"));
    let counters = &line[1..line.find(']').unwrap()];
    let (packets, bytes) = counters.split_once(':').unwrap();
    (packets.parse().unwrap(), bytes.parse().unwrap())
}

// ------------------------------------------------------------ nftables

/// Calico's nftables data plane, reduced to what matters here: `table ip
/// calico` with the interval set [`VXLAN_SET`] holding `members`, and the
/// VXLAN accept / drop rules (with counters and Calico's comments) in a
/// base chain on the input hook.
pub fn nft_vxlan_table(ns: &Netns, members: &[&str]) {
    let elements = if members.is_empty() {
        String::new()
    } else {
        format!("elements = {{ {} }}", members.join(", "))
    };
    let ruleset = format!(
        r#"table ip calico {{
    set {VXLAN_SET} {{
        type ipv4_addr
        flags interval
        {elements}
    }}
    chain filter-INPUT {{
        type filter hook input priority filter; policy accept;
        ip saddr @{VXLAN_SET} fib daddr type local udp dport 4789 counter accept comment "{VXLAN_ALLOW_RULE}"
        fib daddr type local udp dport 4789 counter drop comment "{VXLAN_DROP_RULE}"
    }}
}}
"#
    );
    let file = super::netns::temp_path("calico", "nft");
    std::fs::write(&file, ruleset).expect("writing the nft ruleset");
    let output = ns.exec(&["nft", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "nft -f: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `nft add element ip calico SET { MEMBER }`.
pub fn nft_add_element(ns: &Netns, set: &str, member: &str) {
    ns.exec_ok(&[
        "nft",
        "add",
        "element",
        "ip",
        "calico",
        set,
        &format!("{{ {member} }}"),
    ]);
}

/// (packets, bytes) of the counter of the nftables rule commented
/// `comment`, from `nft -j list ruleset`.
pub fn nft_counter(ns: &Netns, comment: &str) -> (u64, u64) {
    let output = ns.exec_ok(&["nft", "-j", "list", "ruleset"]);
    let json: Value = serde_json::from_slice(&output.stdout).expect("nft -j output");
    let rule = json["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["rule"]["comment"] == comment)
        .unwrap_or_else(|| panic!("no nft rule commented {comment:?}: {json}"));
    let counter = rule["rule"]["expr"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.get("counter"))
        .unwrap_or_else(|| panic!("rule without counter: {rule}"));
    (
        counter["packets"].as_u64().unwrap(),
        counter["bytes"].as_u64().unwrap(),
    )
}

// ------------------------------------------------------------ kernel

/// Names of the running kernel's `enum skb_drop_reason`, without the
/// `SKB_DROP_REASON_` prefix, as bpftool reads them from
/// /sys/kernel/btf/vmlinux (independently of the observer's BTF reader).
pub fn kernel_drop_reasons() -> BTreeMap<String, u64> {
    let output = run(
        "bpftool",
        &[
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "raw",
        ],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut names = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line.contains("ENUM 'skb_drop_reason'");
            continue;
        }
        if !inside {
            continue;
        }
        // `\t'SKB_DROP_REASON_NO_SOCKET' val=3`
        let line = line.trim();
        let Some((name, value)) = line.split_once(" val=") else {
            continue;
        };
        let name = name.trim_matches('\'');
        let name = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(name);
        names.insert(name.to_string(), value.parse().unwrap());
    }
    assert!(
        names.contains_key("NETFILTER_DROP"),
        "no enum skb_drop_reason in the kernel's BTF"
    );
    names
}

// ------------------------------------------------------------ observer lines

/// Identity of a `drop` line: (iface, proto, peer, vni, origin, reason).
pub type DropKey = (String, String, String, u64, String, String);

/// The drop key of (iface, proto, peer, vni, origin, reason).
pub fn drop_key(
    iface: &str,
    proto: &str,
    peer: &str,
    vni: u64,
    origin: &str,
    reason: &str,
) -> DropKey {
    (
        iface.to_string(),
        proto.to_string(),
        peer.to_string(),
        vni,
        origin.to_string(),
        reason.to_string(),
    )
}

/// Latest `drop` line per key among `lines` (each holds its cumulative total).
pub fn drops(lines: &[Value]) -> BTreeMap<DropKey, Value> {
    let mut rows = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "drop") {
        let key = (
            line["iface"].as_str().unwrap().to_string(),
            line["proto"].as_str().unwrap().to_string(),
            line["peer"].as_str().unwrap_or("null").to_string(),
            line["vni"].as_u64().unwrap(),
            line["origin"].as_str().unwrap().to_string(),
            line["reason"].as_str().unwrap().to_string(),
        );
        rows.insert(key, line.clone());
    }
    rows
}

/// Packets of the latest drop line of `key` (0 when none).
pub fn drop_packets(lines: &[Value], key: &DropKey) -> u64 {
    drops(lines)
        .get(key)
        .map_or(0, |l| l["packets"].as_u64().unwrap())
}

/// Latest `allow_set` line of `proto` (`vxlan`, `ipip`).
pub fn allow_set<'a>(lines: &'a [Value], proto: &str) -> Option<&'a Value> {
    lines
        .iter()
        .rev()
        .find(|l| l["type"] == "allow_set" && l["proto"] == proto)
}

/// Latest `peer` line of rx (iface, proto, peer, vni).
pub fn rx_peer<'a>(
    lines: &'a [Value],
    iface: &str,
    proto: &str,
    peer: &str,
    vni: u64,
) -> Option<&'a Value> {
    lines.iter().rev().find(|l| {
        l["type"] == "peer"
            && l["direction"] == "rx"
            && l["iface"] == iface
            && l["proto"] == proto
            && l["peer"] == peer
            && l["vni"] == vni
    })
}

/// Packets of the latest rx peer line (0 when none).
pub fn rx_packets(lines: &[Value], iface: &str, proto: &str, peer: &str, vni: u64) -> u64 {
    rx_peer(lines, iface, proto, peer, vni).map_or(0, |l| l["packets"].as_u64().unwrap())
}

/// The `drops` object of a peer line as a map (empty when absent).
pub fn peer_drops(line: &Value) -> BTreeMap<String, u64> {
    match line.get("drops") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect(),
        Some(other) => panic!("drops is not an object: {other}"),
    }
}

/// The lines of the final snapshot: everything after the last non-final
/// `stats` line (the run must have ended with a final one).
pub fn final_snapshot(run: &ObserverRun) -> &[Value] {
    run.final_stats();
    let start = run
        .lines
        .iter()
        .rposition(|l| l["type"] == "stats" && l["final"] == false)
        .map_or(0, |i| i + 1);
    &run.lines[start..]
}

/// `netfilter` lines of `lines` for the rule commented `rule`.
pub fn netfilter_lines<'a>(lines: &'a [Value], rule: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "netfilter" && l["rule"] == rule)
        .collect()
}

/// Number of `stats` lines (one per interval).
pub fn intervals(lines: &[Value]) -> usize {
    lines.iter().filter(|l| l["type"] == "stats").count()
}

/// Waits until the observer printed two more intervals than now: every
/// packet the kernel finished before this call is then in the output.
pub fn settle(observer: &ObserverProcess) {
    let now = intervals(&observer.lines());
    assert!(
        observer.wait_for_lines(|lines| intervals(lines) >= now + 2),
        "observer stopped printing: {:#?}",
        observer.lines()
    );
}

/// Distinct `reason`s of drop lines (for messages).
pub fn reasons(lines: &[Value]) -> BTreeSet<String> {
    drops(lines).keys().map(|k| k.5.clone()).collect()
}

/// Polls `done` every 20 ms for up to [`WAIT`]; returns whether it held.
pub fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wrappers for the node's netfilter tools (iptables, ip6tables, their
/// `-save`, nft, ipset) that log every command line the observer runs, then
/// run the real tool: put [`ToolLog::path`] on the observer's PATH. The
/// wrappers' folder is removed on drop.
pub struct ToolLog {
    dir: std::path::PathBuf,
}

impl ToolLog {
    /// Writes the wrappers; a tool not installed gets none (the observer
    /// then finds it missing, as without the wrapper).
    pub fn new(tag: &str) -> ToolLog {
        use std::os::unix::fs::PermissionsExt;
        let dir = super::netns::temp_path(tag, "tools");
        std::fs::create_dir_all(&dir).expect("creating the tool wrappers' folder");
        let log = dir.join("log");
        for tool in [
            "iptables",
            "ip6tables",
            "iptables-save",
            "ip6tables-save",
            "nft",
            "ipset",
        ] {
            let Some(real) = ["/usr/sbin", "/sbin", "/usr/bin"]
                .iter()
                .map(|d| std::path::Path::new(d).join(tool))
                .find(|p| p.exists())
            else {
                continue;
            };
            let wrapper = dir.join(tool);
            let script = format!(
                "#!/bin/sh\necho \"{tool} $*\" >> '{}'\nexec '{}' \"$@\"\n",
                log.display(),
                real.display()
            );
            std::fs::write(&wrapper, script).expect("writing a tool wrapper");
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
                .expect("making a tool wrapper executable");
        }
        ToolLog { dir }
    }

    /// PATH with the wrappers first.
    pub fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// Every command line run so far, in order.
    pub fn commands(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for ToolLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The kernel's SNMP counter `name` of group `group` (`TcpExt`, `Tcp`, ...)
/// in `ns`, from `/proc/net/netstat` or `/proc/net/snmp` (a line of names,
/// then a line of values, each starting with the group).
pub fn snmp_counter(ns: &Netns, group: &str, name: &str) -> u64 {
    let prefix = format!("{group}:");
    for file in ["/proc/net/netstat", "/proc/net/snmp"] {
        let output = ns.exec_ok(&["cat", file]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let mut rows = text.lines().filter(|l| l.starts_with(&prefix));
        let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
            continue;
        };
        if let Some(at) = names.split_whitespace().position(|n| n == name) {
            return values.split_whitespace().nth(at).unwrap().parse().unwrap();
        }
    }
    panic!("no {group}:{name} in /proc/net/netstat or /proc/net/snmp")
}
