//! The observer on real traffic: VXLAN frames flooded through a veth pair
//! between two namespaces (S sends; in R a UDP socket on port 4789 drains
//! them with recvmmsg, so packets are consumed, not dropped: a drop per
//! packet would also run the kfree_skb program on each), with the built
//! observer attached to R's end or not.
//!
//! - `throughput_ratio`: received packets per second with the observer
//!   attached over without, rounds interleaved (order alternating), median;
//! - `tcpdump_cpu_ratio`: CPU per packet of `tcpdump -w /dev/null` with the
//!   equivalent filter (its process CPU) over the observer's (its process
//!   CPU plus its programs' `run_time_ns`, with kernel.bpf_stats_enabled on
//!   only for that measurement), on the same flood.
//!
//! The sender is `tests/support/storm.rs` (sendmmsg on AF_PACKET, 16 outer
//! sources); packets are counted by R's interface counters.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, ensure};

use super::{Namespaces, enter_netns, median, process_cpu, report, sh, storm::Storm, target_dir};

/// Length of one measured flood.
const FLOOD: Duration = Duration::from_secs(2);
/// Measured rounds per setting (plus one warm-up round).
const ROUNDS: usize = 5;
/// Outer sources 198.18.0.16 - 198.18.0.31.
const FIRST_SOURCE: u32 = 0xc612_0010;
const SOURCES: u32 = 16;
/// What tcpdump must capture to see what the observer counts.
const TCPDUMP_FILTER: &str = "udp port 4789 or udp port 8472 or udp port 4790 or udp port 6081 \
     or udp port 51820 or udp port 51821 or ip proto 4 or ip proto 41 or ip proto 47 \
     or ip6 proto 4 or ip6 proto 41 or ip6 proto 47";

/// Sender S (vs, 198.18.0.2, 02:..:02) and receiver R (vr, 198.18.0.1,
/// 02:..:01, a socket on UDP 4789): the addresses of `frames::vxlan()`.
struct Lab {
    s: String,
    r: String,
    stop: Arc<AtomicBool>,
    drain: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    _guard: Namespaces,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(drain) = self.drain.take() {
            let _ = drain.join();
        }
    }
}

/// Reads and discards datagrams on `socket` until `stop`, in batches.
fn drain(socket: &std::net::UdpSocket, stop: &AtomicBool) -> anyhow::Result<()> {
    const BATCH: usize = 256;
    let mut buffers = vec![[0u8; 2048]; BATCH];
    let mut iovecs: Vec<libc::iovec> = buffers
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut messages: Vec<libc::mmsghdr> = iovecs
        .iter_mut()
        .map(|iov| {
            // SAFETY: zeroed mmsghdr is valid; the iovec outlives the calls.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: messages point to live buffers; a read timeout bounds the wait.
        unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                messages.as_mut_ptr(),
                BATCH as u32,
                0,
                std::ptr::null_mut(),
            )
        };
    }
    Ok(())
}

impl Lab {
    fn new() -> anyhow::Result<Lab> {
        let tag = format!("obsbt{}", std::process::id());
        let (s, r) = (format!("{tag}s"), format!("{tag}r"));
        let guard = Namespaces(vec![s.clone(), r.clone()]);
        sh(&["ip", "netns", "add", &s])?;
        sh(&["ip", "netns", "add", &r])?;
        sh(&[
            "ip",
            "-n",
            &s,
            "link",
            "add",
            "vs",
            "address",
            "02:00:00:00:00:02",
            "type",
            "veth",
            "peer",
            "name",
            "vr",
            "netns",
            &r,
            "address",
            "02:00:00:00:00:01",
        ])?;
        sh(&["ip", "-n", &s, "addr", "add", "198.18.0.2/24", "dev", "vs"])?;
        sh(&["ip", "-n", &r, "addr", "add", "198.18.0.1/24", "dev", "vr"])?;
        sh(&["ip", "-n", &s, "link", "set", "vs", "up"])?;
        sh(&["ip", "-n", &r, "link", "set", "vr", "up"])?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, flag) = (r.clone(), stop.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let drainer = std::thread::spawn(move || -> anyhow::Result<()> {
            let socket = enter_netns(&ns).and_then(|()| {
                let socket = std::net::UdpSocket::bind("198.18.0.1:4789")?;
                socket.set_read_timeout(Some(Duration::from_millis(100)))?;
                Ok(socket)
            });
            let _ = ready_tx.send(socket.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            drain(&socket?, &flag)
        });
        ready_rx
            .recv()?
            .map_err(|e| anyhow!("UDP socket in {r}: {e}"))?;
        Ok(Lab {
            s,
            r,
            stop,
            drain: Some(drainer),
            _guard: guard,
        })
    }

    /// Packets R's vr received so far.
    fn received(&self) -> anyhow::Result<u64> {
        let out = Command::new("ip")
            .args(["-n", &self.r, "-s", "-j", "link", "show", "dev", "vr"])
            .output()?;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        json[0]["stats64"]["rx"]["packets"]
            .as_u64()
            .ok_or_else(|| anyhow!("no rx counter in `ip -s -j link` output"))
    }

    /// Floods `template` from S for `duration`; returns (received by R, seconds).
    fn flood(&self, template: &[u8], duration: Duration) -> anyhow::Result<(u64, f64)> {
        let before = self.received()?;
        let (s, template) = (self.s.clone(), template.to_vec());
        let start = Instant::now();
        std::thread::spawn(move || -> anyhow::Result<()> {
            enter_netns(&s)?;
            let mut storm = Storm::open("vs", template)?;
            let stop = AtomicBool::new(false);
            let mut sent = 0;
            while start.elapsed() < duration {
                sent += storm.send(FIRST_SOURCE, sent, 4096, SOURCES, &stop)?.0;
            }
            Ok(())
        })
        .join()
        .map_err(|_| anyhow!("sender panicked"))??;
        let seconds = start.elapsed().as_secs_f64();
        // Let R's softirq drain what is queued before reading.
        std::thread::sleep(Duration::from_millis(50));
        Ok((self.received()? - before, seconds))
    }
}

/// The built observer attached to R's vr.
struct Attached {
    child: Child,
    out: PathBuf,
}

impl Attached {
    fn start(lab: &Lab) -> anyhow::Result<Attached> {
        let out = target_dir().join(format!("bench-observer-{}.jsonl", std::process::id()));
        let child = Command::new(env!("CARGO_BIN_EXE_observer"))
            .args(["attach", "--netns", &lab.r, "vr", "--output", "json"])
            .env("OBSERVER_LOG", "error")
            .stdout(fs::File::create(&out)?)
            .spawn()?;
        let attached = Attached { child, out };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fs::read_to_string(&attached.out)?.contains(r#""type":"attach""#) {
            ensure!(
                Instant::now() < deadline,
                "observer did not attach within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(attached)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ids of the eBPF programs the process holds (from its fds' fdinfo).
    fn program_ids(&self) -> anyhow::Result<Vec<u32>> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(format!("/proc/{}/fdinfo", self.pid()))? {
            let text = fs::read_to_string(entry?.path()).unwrap_or_default();
            if let Some(id) = text
                .lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.out);
    }
}

/// Total `run_time_ns` of the programs `ids`.
fn bpf_run_ns(ids: &[u32]) -> u64 {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .map(|p| p.run_time().as_nanos() as u64)
        .sum()
}

/// Runs the traffic benches with copies of `vxlan` (outer 198.18.0.2 ->
/// 198.18.0.1, VNI 4096).
pub fn run(vxlan: &[u8]) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    throughput(&lab, vxlan)?;
    cpu(&lab, vxlan)
}

fn throughput(lab: &Lab, vxlan: &[u8]) -> anyhow::Result<()> {
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        // Alternate which setting goes first, so drift favours neither.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for attached in order {
            let observer = attached.then(|| Attached::start(lab)).transpose()?;
            let (packets, seconds) = lab.flood(vxlan, FLOOD)?;
            drop(observer);
            if round > 0 {
                let pps = packets as f64 / seconds;
                if attached { &mut with } else { &mut without }.push(pps);
            }
        }
    }
    let (without, with) = (median(&mut without), median(&mut with));
    report("throughput_without", format!("{without:.0}"), "pps");
    report("throughput_with", format!("{with:.0}"), "pps");
    report("throughput_ratio", format!("{:.3}", with / without), "x");
    Ok(())
}

fn cpu(lab: &Lab, vxlan: &[u8]) -> anyhow::Result<()> {
    let duration = Duration::from_secs(3);

    let observer = Attached::start(lab)?;
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling kernel.bpf_stats_enabled")?;
    let ids = observer.program_ids()?;
    ensure!(!ids.is_empty(), "the observer holds no eBPF programs");
    let (cpu0, bpf0) = (process_cpu(observer.pid())?, bpf_run_ns(&ids));
    let (packets, _) = lab.flood(vxlan, duration)?;
    // One more interval, so the reads of the flood are in the process time.
    std::thread::sleep(Duration::from_millis(1100));
    let (cpu1, bpf1) = (process_cpu(observer.pid())?, bpf_run_ns(&ids));
    drop(stats);
    drop(observer);
    let user_ns = (cpu1 - cpu0) * 1e9;
    let bpf_ns = (bpf1 - bpf0) as f64;
    let observer_per_packet = (user_ns + bpf_ns) / packets.max(1) as f64;

    let mut tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.r,
            "tcpdump",
            "-n",
            "-i",
            "vr",
            "-w",
            "/dev/null",
        ])
        .arg(TCPDUMP_FILTER)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("starting tcpdump")?;
    let mut stderr = BufReader::new(tcpdump.stderr.take().expect("piped"));
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        ensure!(stderr.read_line(&mut line)? > 0, "tcpdump exited: {line}");
    }
    // `ip netns exec` execs tcpdump: same process.
    let pid = tcpdump.id();
    let cpu0 = process_cpu(pid)?;
    let (tcpdump_packets, _) = lab.flood(vxlan, duration)?;
    std::thread::sleep(Duration::from_millis(200));
    let cpu1 = process_cpu(pid)?;
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let mut summary = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut summary)?;
    tcpdump.wait()?;
    let dropped: u64 = summary
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let tcpdump_per_packet = (cpu1 - cpu0) * 1e9 / tcpdump_packets.max(1) as f64;

    report(
        "observer_user_cpu",
        format!("{:.1}", user_ns / packets.max(1) as f64),
        "ns/pkt",
    );
    report(
        "observer_bpf_cpu",
        format!("{:.1}", bpf_ns / packets.max(1) as f64),
        "ns/pkt",
    );
    report(
        "observer_cpu",
        format!("{observer_per_packet:.1}"),
        "ns/pkt",
    );
    report("tcpdump_cpu", format!("{tcpdump_per_packet:.1}"), "ns/pkt");
    report("tcpdump_dropped", dropped, "packets");
    report(
        "tcpdump_cpu_ratio",
        format!("{:.1}", tcpdump_per_packet / observer_per_packet),
        "x",
    );
    Ok(())
}
