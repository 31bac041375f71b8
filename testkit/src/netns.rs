//! Network namespace fixtures: namespaces, veth pairs and VXLAN devices,
//! each namespace behind a guard that deletes it also when a test panics.
//!
//! Names are unique per process and per call (pid + counter), so tests run
//! in parallel, also with other test binaries.
//!
//! Every helper comes twice: `x` panics with the failing command's output
//! (what a test wants), `x_checked` returns it as a [`CmdError`] (what
//! `cargo xtask soak` wants).

use std::{
    fmt,
    fs::File,
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use serde_json::Value;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique in this process and among processes: `obs<tag><pid>x<n>`.
pub fn unique(tag: &str) -> String {
    format!(
        "obs{tag}{}x{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh path in the temporary directory (not named `obs*`, so that
/// cleanups of other tools' namespaces and files leave it alone).
pub fn temp_path(tag: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "nstest-{tag}-{}-{}.{ext}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A command that could not be started or that failed; its message names
/// the command and holds its output.
pub struct CmdError(String);

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Debug as Display: `unwrap`/`expect` and `fn main() -> Result` print the
// command's output as it is, not escaped.
impl fmt::Debug for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CmdError {}

impl CmdError {
    /// An error saying `message`.
    pub fn new(message: String) -> CmdError {
        CmdError(message)
    }
}

/// Panics with the error's message (the `x` of every `x_checked`).
pub(crate) fn or_panic<T>(result: Result<T, CmdError>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `program args`, panicking with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    or_panic(run_checked(program, args))
}

/// Runs `program args`; an error with its output when it fails.
pub fn run_checked(program: &str, args: &[&str]) -> Result<Output, CmdError> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CmdError(format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        return Err(CmdError(format!(
            "`{program} {}` failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(output)
}

/// Runs `program args` and returns its output, whatever the exit status.
pub fn try_run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Runs `f` on a new thread that has entered network namespace `name`
/// (setns only moves the calling thread). Sockets created there stay in the
/// namespace and may be used from any thread afterwards.
pub fn in_netns<T, F>(name: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: valid fd of a network namespace file.
        let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(ret, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Interface counters as the kernel reports them (`ip -s link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Packets received but dropped.
    pub rx_dropped: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Packets that could not be sent.
    pub tx_dropped: u64,
}

/// A named network namespace (`ip netns add`), deleted on drop. IPv6 is
/// disabled inside (no router/neighbour solicitations, no MLD) and `lo` is up.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace named after `tag` (keep it short).
    pub fn new(tag: &str) -> Netns {
        or_panic(Netns::create(&unique(tag)))
    }

    /// Creates the namespace `name`, exactly so named (for callers that
    /// find their namespaces by name again, like `cargo xtask soak`).
    pub fn create(name: &str) -> Result<Netns, CmdError> {
        run_checked("ip", &["netns", "add", name])?;
        // From here on, the guard deletes it whatever fails.
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec_checked(&[
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ])?;
        ns.ip_checked(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (for `--netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME args`, panicking on failure; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        or_panic(self.ip_checked(args))
    }

    /// `ip -n NAME args`; returns stdout.
    pub fn ip_checked(&self, args: &[&str]) -> Result<String, CmdError> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        let output = run_checked("ip", &all)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `bridge -n NAME args`, panicking on failure.
    pub fn bridge(&self, args: &[&str]) {
        or_panic(self.bridge_checked(args))
    }

    /// `bridge -n NAME args`.
    pub fn bridge_checked(&self, args: &[&str]) -> Result<(), CmdError> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run_checked("bridge", &all).map(drop)
    }

    /// `ip netns exec NAME argv...`, whatever the exit status.
    pub fn exec(&self, argv: &[&str]) -> Output {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(argv);
        try_run("ip", &all)
    }

    /// `ip netns exec NAME argv...`, panicking on failure.
    pub fn exec_ok(&self, argv: &[&str]) -> Output {
        or_panic(self.exec_checked(argv))
    }

    /// `ip netns exec NAME argv...`.
    pub fn exec_checked(&self, argv: &[&str]) -> Result<Output, CmdError> {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(argv);
        run_checked("ip", &all)
    }

    /// Counters of `iface`.
    pub fn link_stats(&self, iface: &str) -> LinkStats {
        let text = self.ip(&["-s", "-j", "link", "show", "dev", iface]);
        let json: Value = serde_json::from_str(&text).expect("ip -j output");
        let stats = &json[0]["stats64"];
        let get = |dir: &str, field: &str| {
            stats[dir][field]
                .as_u64()
                .unwrap_or_else(|| panic!("no {dir}.{field} in {text}"))
        };
        LinkStats {
            rx_packets: get("rx", "packets"),
            rx_dropped: get("rx", "dropped"),
            tx_packets: get("tx", "packets"),
            tx_dropped: get("tx", "dropped"),
        }
    }

    /// `ip -d link show dev iface`.
    pub fn link_details(&self, iface: &str) -> String {
        self.ip(&["-d", "link", "show", "dev", iface])
    }

    /// Adds a permanent neighbour entry, so that no ARP is ever sent.
    pub fn neigh(&self, addr: &str, mac: &str, dev: &str) {
        or_panic(self.neigh_checked(addr, mac, dev))
    }

    /// See [`Netns::neigh`].
    pub fn neigh_checked(&self, addr: &str, mac: &str, dev: &str) -> Result<(), CmdError> {
        self.ip_checked(&[
            "neigh",
            "replace",
            addr,
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ])
        .map(drop)
    }

    /// Creates the VXLAN device `vxlan` (left down, no address).
    pub fn add_vxlan(&self, vxlan: &VxlanDevice) {
        or_panic(self.add_vxlan_checked(vxlan))
    }

    /// See [`Netns::add_vxlan`].
    pub fn add_vxlan_checked(&self, vxlan: &VxlanDevice) -> Result<(), CmdError> {
        let (vni, port) = (vxlan.vni.to_string(), vxlan.port.to_string());
        let mut args = vec![
            "link",
            "add",
            vxlan.name,
            "address",
            vxlan.mac,
            "type",
            "vxlan",
            "id",
            &vni,
            "dstport",
            &port,
            "local",
            vxlan.local,
        ];
        if let Some(remote) = vxlan.remote {
            args.extend(["remote", remote]);
        }
        if let Some(lower) = vxlan.lower {
            args.extend(["dev", lower]);
        }
        if !vxlan.learning {
            args.push("nolearning");
        }
        self.ip_checked(&args).map(drop)
    }

    /// Runs `f` inside the namespace (see [`in_netns`]).
    pub fn run<T, F>(&self, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        in_netns(&self.name, f)
    }

    /// Pings `dst` `count` times, 10 ms apart; returns (transmitted, received).
    pub fn ping(&self, dst: &str, count: u32) -> (u32, u32) {
        let count = count.to_string();
        let output = self.exec(&[
            "ping", "-n", "-q", "-c", &count, "-i", "0.01", "-W", "2", dst,
        ]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        ping_summary(&text)
    }
}

/// (transmitted, received) of ping's output `text`.
pub fn ping_summary(text: &str) -> (u32, u32) {
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {text}"));
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().unwrap())
        .collect();
    (numbers[0], numbers[1])
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys its interfaces, veth peers included.
        // Errors are ignored: a drop must not panic (it may run while a
        // failed test unwinds).
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .output();
    }
}

/// One end of a veth pair.
#[derive(Debug, Clone)]
pub struct VethEnd {
    /// Interface name inside its namespace.
    pub iface: String,
    /// MAC address.
    pub mac: String,
    /// IPv4 address (no prefix).
    pub addr: String,
}

impl VethEnd {
    /// An end named `iface` with `mac` and IPv4 address `addr`.
    pub fn new(iface: &str, mac: &str, addr: &str) -> VethEnd {
        VethEnd {
            iface: iface.to_string(),
            mac: mac.to_string(),
            addr: addr.to_string(),
        }
    }
}

/// Creates a veth pair directly inside `a` and `b`, with fixed MACs,
/// `addr/prefix` addresses, up, and static neighbour entries for each other.
pub fn veth_pair(a: &Netns, end_a: &VethEnd, b: &Netns, end_b: &VethEnd, prefix: u8) {
    or_panic(veth_pair_checked(a, end_a, b, end_b, prefix))
}

/// See [`veth_pair`].
pub fn veth_pair_checked(
    a: &Netns,
    end_a: &VethEnd,
    b: &Netns,
    end_b: &VethEnd,
    prefix: u8,
) -> Result<(), CmdError> {
    a.ip_checked(&[
        "link",
        "add",
        &end_a.iface,
        "address",
        &end_a.mac,
        "type",
        "veth",
        "peer",
        "name",
        &end_b.iface,
        "netns",
        b.name(),
        "address",
        &end_b.mac,
    ])?;
    for (ns, end) in [(a, end_a), (b, end_b)] {
        ns.ip_checked(&[
            "addr",
            "add",
            &format!("{}/{prefix}", end.addr),
            "dev",
            &end.iface,
        ])?;
        ns.ip_checked(&["link", "set", &end.iface, "up"])?;
    }
    a.neigh_checked(&end_b.addr, &end_b.mac, &end_a.iface)?;
    b.neigh_checked(&end_a.addr, &end_a.mac, &end_b.iface)
}

/// A VXLAN device for [`Netns::add_vxlan`]: `ip link add NAME address MAC
/// type vxlan id VNI dstport PORT local LOCAL [remote REMOTE] [dev LOWER]
/// [nolearning]`.
#[derive(Debug, Clone, Copy)]
pub struct VxlanDevice<'a> {
    /// Device name.
    pub name: &'a str,
    /// The device's MAC (the VTEP's).
    pub mac: &'a str,
    /// VNI.
    pub vni: u32,
    /// Destination UDP port.
    pub port: u16,
    /// Outer source address.
    pub local: &'a str,
    /// Unicast remote; without it, only FDB entries say where frames go.
    pub remote: Option<&'a str>,
    /// Lower device; without it, the route to the remote decides, and
    /// deleting the veth leaves the device in place.
    pub lower: Option<&'a str>,
    /// Whether the device learns remote MACs (`nolearning` when not).
    pub learning: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_summary_reads_transmitted_and_received() {
        let text = "--- 198.19.0.2 ping statistics ---\n\
                    50 packets transmitted, 49 received, 2% packet loss, time 501ms\n";
        assert_eq!(ping_summary(text), (50, 49));
    }

    #[test]
    fn unique_names_differ() {
        let (a, b) = (unique("du2a"), unique("du2a"));
        assert_ne!(a, b);
        assert!(a.starts_with("obsdu2a"), "{a}");
    }

    #[test]
    fn a_failed_command_names_itself() {
        let err = run_checked("false", &["x"]).unwrap_err().to_string();
        assert!(err.starts_with("`false x` failed"), "{err}");
        let err = run_checked("/nonexistent/tool", &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot run /nonexistent/tool"), "{err}");
    }
}
