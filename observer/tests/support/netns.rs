//! What the namespace tests run inside the namespaces (owned by the
//! namespace tests): the observer binary, tcpdump and a raw-frame sender,
//! each behind a guard that cleans up also when a test panics. The
//! namespaces themselves, veth pairs and the two-namespace pair are
//! `observer_testkit`'s, re-exported here.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use observer_testkit::netns::*;
use serde_json::Value;

/// How long a fixture waits for a process to become ready or to exit.
pub const WAIT: Duration = Duration::from_secs(20);

/// `base` times `$OBSERVER_TEST_TIME_SCALE` (default 1): `cargo xtask
/// vm-test` sets it in its emulated VMs, where loading the programs alone
/// takes seconds. Only waits scale; counts never do.
pub fn scaled(base: Duration) -> Duration {
    let factor = std::env::var("OBSERVER_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    base * factor
}

/// Sends signal `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a child we own.
    let ret = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        ret,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Stops a child that may still run: SIGTERM, then SIGKILL after
/// `grace`; reaps it either way.
pub fn terminate(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(None)) {
        // SAFETY: kill(2) of our own, unreaped child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        if wait_timeout(child, grace).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for `child` to exit, at most `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waitpid") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lines collected from a pipe by a reader thread.
#[derive(Default)]
struct Collected {
    lines: Mutex<(Vec<String>, bool)>,
    changed: Condvar,
}

impl Collected {
    fn spawn_reader(self: &Arc<Self>, pipe: impl Read + Send + 'static) -> JoinHandle<()> {
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                me.lines.lock().unwrap().0.push(line);
                me.changed.notify_all();
            }
            me.lines.lock().unwrap().1 = true;
            me.changed.notify_all();
        })
    }

    /// Waits until `done(lines)` or the pipe closes or the timeout; returns
    /// whether `done` held.
    fn wait_for(&self, timeout: Duration, done: impl Fn(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lines.lock().unwrap();
        loop {
            if done(&guard.0) {
                return true;
            }
            let now = Instant::now();
            if guard.1 || now >= deadline {
                return false;
            }
            guard = self.changed.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    fn snapshot(&self) -> Vec<String> {
        self.lines.lock().unwrap().0.clone()
    }

    fn wait_closed(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lines.lock().unwrap();
        while !guard.1 && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            guard = self.changed.wait_timeout(guard, left).unwrap().0;
        }
    }
}

/// Key of a peer row: (iface, direction, proto, peer, vni).
pub type PeerKey = (String, String, String, Option<String>, u64);

/// What a stopped observer printed.
#[derive(Debug)]
pub struct ObserverRun {
    /// Every stdout line, parsed.
    pub lines: Vec<Value>,
    /// Exit status.
    pub status: ExitStatus,
    /// Everything printed on stderr.
    pub stderr: String,
}

impl ObserverRun {
    /// Latest `peer` line per key: each holds its cumulative total.
    pub fn peers(&self) -> BTreeMap<PeerKey, &Value> {
        let mut rows = BTreeMap::new();
        for line in self.lines.iter().filter(|l| l["type"] == "peer") {
            let key = (
                line["iface"].as_str().unwrap().to_string(),
                line["direction"].as_str().unwrap().to_string(),
                line["proto"].as_str().unwrap().to_string(),
                line["peer"].as_str().map(str::to_string),
                line["vni"].as_u64().unwrap(),
            );
            rows.insert(key, line);
        }
        rows
    }

    /// (packets, bytes) of one row, (0, 0) when it does not exist.
    pub fn counts(
        &self,
        iface: &str,
        direction: &str,
        proto: &str,
        peer: Option<&str>,
        vni: u64,
    ) -> (u64, u64) {
        let key = (
            iface.to_string(),
            direction.to_string(),
            proto.to_string(),
            peer.map(str::to_string),
            vni,
        );
        self.peers().get(&key).map_or((0, 0), |row| {
            (
                row["packets"].as_u64().unwrap(),
                row["bytes"].as_u64().unwrap(),
            )
        })
    }

    /// Latest `unclassified` line per (iface, direction, reason).
    pub fn unclassified(&self) -> BTreeMap<(String, String, String), &Value> {
        let mut rows = BTreeMap::new();
        for line in self.lines.iter().filter(|l| l["type"] == "unclassified") {
            let key = (
                line["iface"].as_str().unwrap().to_string(),
                line["direction"].as_str().unwrap().to_string(),
                line["reason"].as_str().unwrap().to_string(),
            );
            rows.insert(key, line);
        }
        rows
    }

    /// The `attach` lines.
    pub fn attach_lines(&self) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|l| l["type"] == "attach")
            .collect()
    }

    /// The last line, which must be the final stats line.
    pub fn final_stats(&self) -> &Value {
        let last = self.lines.last().expect("observer printed nothing");
        assert_eq!(
            last["type"], "stats",
            "last line is not a stats line: {last}"
        );
        assert_eq!(last["final"], true, "last stats line is not final: {last}");
        last
    }
}

/// The observer binary running `attach --output json`, killed on drop.
pub struct ObserverProcess {
    child: Child,
    stdout: Arc<Collected>,
    stderr: Arc<Collected>,
    readers: Vec<JoinHandle<()>>,
}

impl ObserverProcess {
    /// Path of the binary under test.
    pub fn binary() -> &'static str {
        env!("CARGO_BIN_EXE_observer")
    }

    /// Spawns `observer attach --output json --interval 200ms [--netns NS] ARGS...`
    /// without waiting.
    pub fn spawn(netns: Option<&str>, args: &[&str]) -> ObserverProcess {
        Self::spawn_with_env(netns, args, &[])
    }

    /// [`ObserverProcess::spawn`] with extra environment variables (e.g. a
    /// PATH without the node's tools).
    pub fn spawn_with_env(
        netns: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ObserverProcess {
        Self::spawn_as(&[Self::binary()], netns, args, env)
    }

    /// [`ObserverProcess::spawn_with_env`] run by `launch`: the binary
    /// itself, or a wrapper that ends by executing the binary it names last
    /// in its own process (e.g. `setpriv --reuid=nobody ... --
    /// /tmp/.../observer`, a [`super::unprivileged::BinaryCopy`]), so that
    /// the process id and the signals are the observer's.
    pub fn spawn_as(
        launch: &[&str],
        netns: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ObserverProcess {
        let (program, launch_args) = launch.split_first().expect("a program to run");
        let mut command = Command::new(program);
        command.args(launch_args);
        command.envs(env.iter().copied());
        command.args(["attach", "--output", "json"]);
        // Short intervals keep the tests quick, unless the test sets its own.
        if !args.contains(&"--interval") {
            command.args(["--interval", "200ms"]);
        }
        // Not the host's BIRD (Calico's sockets, the default), unless the
        // test names its own: a host running Calico must not change what
        // a test sees.
        if !args.contains(&"--bird-socket") {
            command.args(["--bird-socket", "/nonexistent/observer-test-bird.ctl"]);
        }
        if let Some(ns) = netns {
            command.args(["--netns", ns]);
        }
        command
            .args(args)
            .env("OBSERVER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawning the observer");
        let stdout = Arc::new(Collected::default());
        let stderr = Arc::new(Collected::default());
        let readers = vec![
            stdout.spawn_reader(child.stdout.take().unwrap()),
            stderr.spawn_reader(child.stderr.take().unwrap()),
        ];
        ObserverProcess {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Spawns the observer on `ifaces` (plus extra `args`) and waits until
    /// it is ready (see [`ObserverProcess::wait_ready`]).
    pub fn start(netns: Option<&str>, ifaces: &[&str], args: &[&str]) -> ObserverProcess {
        Self::start_as(&[Self::binary()], netns, ifaces, args)
    }

    /// [`ObserverProcess::start`] run by `launch` (see
    /// [`ObserverProcess::spawn_as`]).
    pub fn start_as(
        launch: &[&str],
        netns: Option<&str>,
        ifaces: &[&str],
        args: &[&str],
    ) -> ObserverProcess {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(ifaces);
        let process = Self::spawn_as(launch, netns, &all, &[]);
        process.wait_ready(ifaces.len());
        process
    }

    /// Waits for one `attach` line per interface and then for the first
    /// `stats` line, so the observer is known to be reading its maps.
    pub fn wait_ready(&self, ifaces: usize) -> Vec<Value> {
        let ready = self.stdout.wait_for(scaled(WAIT), |lines| {
            let attach = lines
                .iter()
                .filter(|l| l.contains(r#""type":"attach""#))
                .count();
            attach >= ifaces && lines.iter().any(|l| l.contains(r#""type":"stats""#))
        });
        if !ready {
            self.stderr.wait_closed(Duration::from_millis(500));
            panic!(
                "observer not ready after {:?}\nstdout: {:?}\nstderr: {}",
                scaled(WAIT),
                self.stdout.snapshot(),
                self.stderr.snapshot().join("\n")
            );
        }
        self.attach_lines()
    }

    /// The `attach` lines printed so far.
    pub fn attach_lines(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["type"] == "attach")
            .collect()
    }

    /// Every line printed so far, parsed.
    pub fn lines(&self) -> Vec<Value> {
        self.stdout
            .snapshot()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
            .collect()
    }

    /// Waits until the printed lines satisfy `done`; false after [`WAIT`]
    /// or when the process closed its output.
    pub fn wait_for_lines(&self, done: impl Fn(&[Value]) -> bool) -> bool {
        self.stdout.wait_for(scaled(WAIT), |lines| {
            let parsed: Vec<Value> = lines
                .iter()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            done(&parsed)
        })
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT and collects the output.
    pub fn stop(self) -> ObserverRun {
        self.stop_with(libc::SIGINT)
    }

    /// Sends SIGINT, collects the output and asserts exit status 0.
    pub fn stop_ok(self) -> ObserverRun {
        let run = self.stop();
        assert_eq!(
            run.status.code(),
            Some(0),
            "observer exit {}: {}",
            run.status,
            run.stderr
        );
        run
    }

    /// Sends `sig` and collects everything the process printed.
    pub fn stop_with(self, sig: libc::c_int) -> ObserverRun {
        signal(self.pid(), sig);
        self.wait()
    }

    /// Waits for the process to exit by itself (`--duration`, errors).
    pub fn wait(mut self) -> ObserverRun {
        let status = wait_timeout(&mut self.child, scaled(WAIT)).unwrap_or_else(|| {
            panic!(
                "observer did not exit within {:?}; stderr: {}",
                scaled(WAIT),
                self.stderr.snapshot().join("\n")
            )
        });
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let lines = self
            .stdout
            .snapshot()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect();
        ObserverRun {
            lines,
            status,
            stderr: self.stderr.snapshot().join("\n"),
        }
    }

    /// kill -9, then reaps the process; returns its status.
    pub fn kill9(mut self) -> ExitStatus {
        signal(self.pid(), libc::SIGKILL);
        wait_timeout(&mut self.child, scaled(WAIT)).expect("observer survived SIGKILL")
    }
}

impl Drop for ObserverProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Frame records of a pcap file: (captured bytes, original length). A
/// record still being written (partial) is left out.
pub fn pcap_records(path: &Path) -> Vec<(Vec<u8>, u32)> {
    let data = std::fs::read(path).unwrap_or_default();
    if data.len() < 24 {
        return Vec::new();
    }
    let magic = u32::from_le_bytes(data[0..4].try_into().unwrap());
    let u32_at = |off: usize| -> u32 {
        let bytes: [u8; 4] = data[off..off + 4].try_into().unwrap();
        match magic {
            0xa1b2c3d4 | 0xa1b23c4d => u32::from_le_bytes(bytes),
            0xd4c3b2a1 | 0x4d3cb2a1 => u32::from_be_bytes(bytes),
            _ => panic!("{} is not a pcap file (magic {magic:#x})", path.display()),
        }
    };
    let mut records = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let caplen = u32_at(off + 8) as usize;
        let orig = u32_at(off + 12);
        if off + 16 + caplen > data.len() {
            break;
        }
        records.push((data[off + 16..off + 16 + caplen].to_vec(), orig));
        off += 16 + caplen;
    }
    records
}

/// `tcpdump -w` running inside a namespace, stopped with SIGINT.
pub struct Tcpdump {
    child: Child,
    file: PathBuf,
    stderr: Arc<Collected>,
    reader: Option<JoinHandle<()>>,
}

impl Tcpdump {
    /// Starts `tcpdump -i IFACE -w FILE -U FILTER` in `ns` and waits until it
    /// says "listening on".
    pub fn start(ns: &Netns, iface: &str, filter: &str) -> Tcpdump {
        let file = temp_path("capture", "pcap");
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                "tcpdump",
                "-n",
                "-i",
                iface,
                "-U",
                "--immediate-mode",
            ])
            .args(["-Z", "root", "-s", "256", "-B", "8192", "-w"])
            .arg(&file)
            .arg(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tcpdump");
        let stderr = Arc::new(Collected::default());
        let reader = stderr.spawn_reader(child.stderr.take().unwrap());
        let mut tcpdump = Tcpdump {
            child,
            file,
            stderr,
            reader: Some(reader),
        };
        let listening = tcpdump.stderr.wait_for(scaled(WAIT), |lines| {
            lines.iter().any(|l| l.contains("listening on"))
        });
        if !listening {
            let _ = tcpdump.child.kill();
            panic!(
                "tcpdump did not start: {}",
                tcpdump.stderr.snapshot().join("\n")
            );
        }
        tcpdump
    }

    /// Waits until the file holds at least `frames` frames (tcpdump reads
    /// the socket asynchronously), then stops tcpdump.
    pub fn stop_after(mut self, frames: usize) -> Capture {
        let deadline = Instant::now() + Duration::from_secs(5);
        while pcap_records(&self.file).len() < frames && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(self.child.id(), libc::SIGINT);
        let status = wait_timeout(&mut self.child, scaled(WAIT)).expect("tcpdump did not stop");
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let stderr = self.stderr.snapshot().join("\n");
        assert!(status.success(), "tcpdump failed ({status}): {stderr}");
        // "N packets dropped by kernel": a capture that lost frames is no reference.
        assert!(
            stderr
                .lines()
                .any(|l| l.trim() == "0 packets dropped by kernel"),
            "tcpdump dropped frames: {stderr}"
        );
        Capture {
            file: std::mem::take(&mut self.file),
        }
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !self.file.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.file);
        }
    }
}

/// A finished capture file, removed on drop.
pub struct Capture {
    file: PathBuf,
}

impl Capture {
    /// Path of the pcap file.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// Frames `filter` selects, as tcpdump counts them
    /// (`tcpdump --count -nr FILE FILTER` prints "N packets"; without
    /// `--count` a tunnelled frame can take more than one line).
    pub fn count(&self, filter: &str) -> u64 {
        let path = self.file.to_str().unwrap();
        let output = run("tcpdump", &["--count", "-nr", path, filter]);
        let text = String::from_utf8_lossy(&output.stdout);
        text.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected tcpdump --count output: {text:?}"))
    }

    /// Original lengths of the frames `filter` selects
    /// (`tcpdump -r FILE -w SUBSET FILTER`, then read).
    pub fn frame_lengths(&self, filter: &str) -> Vec<u32> {
        let subset = temp_path("subset", "pcap");
        let path = self.file.to_str().unwrap();
        let output = try_run(
            "tcpdump",
            &["-r", path, "-w", subset.to_str().unwrap(), filter],
        );
        let records = pcap_records(&subset);
        let _ = std::fs::remove_file(&subset);
        assert!(
            output.status.success(),
            "tcpdump -r: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        records.into_iter().map(|(_, orig)| orig).collect()
    }

    /// (frames, sum of their lengths) that `filter` selects.
    pub fn totals(&self, filter: &str) -> (u64, u64) {
        let lengths = self.frame_lengths(filter);
        (
            lengths.len() as u64,
            lengths.iter().map(|&l| l as u64).sum(),
        )
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Sends `copies` of each frame on `iface` of namespace `ns` through an
/// AF_PACKET raw socket (the frames carry their Ethernet header). Sent
/// frames go through tc egress of `iface`, and arrive at its veth peer.
pub fn send_frames(ns: &Netns, iface: &str, frames: Vec<(Vec<u8>, u32)>) {
    let iface = iface.to_string();
    ns.run(move || {
        let name = std::ffi::CString::new(iface.clone()).unwrap();
        // SAFETY: valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(ifindex, 0, "no interface {iface}");
        // Protocol 0: this socket sends only, it receives nothing.
        // SAFETY: plain socket(2).
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd was just returned by socket(2) and is owned here.
        let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        for (frame, copies) in &frames {
            // SAFETY: zeroed sockaddr_ll is valid; fields set below.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_ifindex = ifindex as i32;
            addr.sll_protocol = u16::from_be_bytes([frame[12], frame[13]]).to_be();
            addr.sll_halen = 6;
            addr.sll_addr[..6].copy_from_slice(&frame[..6]);
            for _ in 0..*copies {
                loop {
                    // SAFETY: buffer and address valid for the given lengths.
                    let sent = unsafe {
                        libc::sendto(
                            socket.as_raw_fd(),
                            frame.as_ptr().cast(),
                            frame.len(),
                            0,
                            (&addr as *const libc::sockaddr_ll).cast(),
                            std::mem::size_of::<libc::sockaddr_ll>() as u32,
                        )
                    };
                    if sent == frame.len() as isize {
                        break;
                    }
                    let err = std::io::Error::last_os_error();
                    // A full queue: wait, then send the same frame again.
                    if err.raw_os_error() == Some(libc::ENOBUFS)
                        || err.raw_os_error() == Some(libc::EAGAIN)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    panic!("sendto on {iface}: {sent} bytes, {err}");
                }
            }
        }
    });
}

/// A free TCP port on `ns`'s loopback: port 0 bound there, and let go.
pub fn free_port(ns: &Netns) -> u16 {
    ns.run(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind 127.0.0.1:0")
            .local_addr()
            .unwrap()
            .port()
    })
}

/// Waits (at most [`WAIT`]) until `server`, started in the namespace
/// `netns`, accepts TCP connections on its loopback `port`; fails naming
/// `what` and its `log` when it exits or never listens.
pub fn wait_listening(
    netns: &str,
    port: u16,
    what: &str,
    server: &mut Child,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let addr = format!("127.0.0.1:{port}");
        if in_netns(netns, move || std::net::TcpStream::connect(addr).is_ok()) {
            return;
        }
        if let Ok(Some(status)) = server.try_wait() {
            panic!("{what} exited ({status}): {}", log());
        }
        assert!(Instant::now() < deadline, "{what} not listening: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
}
