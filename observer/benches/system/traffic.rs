//! The observer on real traffic: VXLAN frames sent through a veth pair
//! between two namespaces, with something attached to R's end `vr` or not.
//! S sends with sendmmsg on AF_PACKET (`observer_testkit::storm`, 16 outer
//! sources); in R a UDP socket on port 4789 (64 MiB receive buffer) reads
//! every frame with recvmmsg, napping 1 ms whenever it has caught up. Every
//! flood is checked: frames sent but not read by R, UDP receive-buffer
//! errors, veth and backlog drops (a drop would run the observer's
//! kfree_skb program, a cost the bench would cause itself). A frame the
//! veth ring refuses is resent by the sender and counted in the drops.
//! The sender runs on CPU 0 ([`SENDER_CPU`], which also runs R's receive
//! path in its softirq) and R's reader on CPU 1 ([`READER_CPU`]).
//!
//! Throughput: the sender saturates, with at most [`WINDOW`] frames sent
//! and not yet read by R (so nothing overflows), for [`THROUGHPUT_FLOOD`];
//! the figure is frames per second read by R.
//! - `throughput_ratio`: `observer attach vr` as built (default
//!   `--xdp-mode auto`, which picks `traffic_rx_hook`) over nothing;
//! - `throughput_xdp_pass_ratio`: a program that only returns XDP_PASS
//!   (TC_ACT_UNSPEC when the observer picked tcx), attached in the mode
//!   the observer picked, over nothing: what turning
//!   XDP on costs by itself (on veth, native XDP moves receive to veth's
//!   NAPI + ptr_ring path and copies each frame that lacks XDP headroom
//!   into a page-pool page);
//! - `throughput_ratio_vs_xdp_pass`: the observer over that XDP_PASS: what
//!   the observer's programs and process add;
//! - `throughput_floor_ratio`: the cheapest program that counts the
//!   bench's frames per peer (`maptypes::load_vxlan_floor`), in the mode
//!   the observer picked, over nothing: the floor of any counting program
//!   at this hook; `throughput_floor_ratio_vs_xdp_pass` is what counting
//!   adds to the hook, `throughput_ratio_vs_floor` what the observer adds
//!   to counting;
//! - `throughput_receive_tracepoint_ratio`: an empty program on the
//!   net:netif_receive_skb tracepoint, which every received skb passes on
//!   any device, over nothing: the cost of the one hook outside tc and XDP
//!   that sees every received packet, against the pass program's
//!   (`throughput_receive_tracepoint_vs_xdp_pass`);
//! - `throughput_ratio_generic`, `throughput_ratio_xdp_off`: the observer
//!   with `--xdp-mode generic` / `--xdp-mode off` (tc ingress) over nothing.
//!
//! - `floor_proof_*` ([`floor_proof`]): the same floods with more rounds
//!   and settings that each add one thing to the one before (the hook,
//!   counting, the observer's receive program loaded once, loaded fresh,
//!   all its programs, its process), every ratio with a bootstrap 95 %
//!   interval: whether the target lies above the counting floor, and
//!   which step costs what. The receive program loaded once is attached
//!   without `attach`, so its interface's MTU is not in the map and the
//!   over-MTU check (one compare) is skipped.
//!
//! - `throughput_aa_ratio`: nothing over nothing, measured as a setting
//!   like the others: the bench's own resolution, with `throughput_aa_mad`
//!   and `throughput_ratio_mad` the median absolute deviations of the
//!   per-round ratios of nothing and of the observer.
//!
//! All settings run once in each of [`ROUNDS`] rounds (after a warm-up
//! round), the order rotating from round to round, and every flood of a
//! setting sits between two floods with nothing attached: its ratio to
//! nothing is its pps over the mean of those two, and a ratio figure is
//! the median of the per-round ratios (the host's throughput drifted by up
//! to 12 % within seconds, more than the hooks under test; bracketing
//! cancels that drift, where a ratio to one flood of nothing elsewhere in
//! the round did not). A pps figure is the median of its rounds.
//! `throughput_ratio_vs_xdp_pass` is the median per round of the
//! observer's ratio over XDP_PASS's. An observer's flood starts at its
//! first interval line, after its start-up (see [`Attached::start`]).
//!
//! CPU: the sender is paced at [`CPU_RATE`] frames/s (bursts of 256),
//! which R reads without drops in every setting, so every setting
//! processes the same frames. Rounds as above, without the bracketing
//! floods (the CPU figures subtract the same round's baseline).
//! - Machine-wide: busy time of all CPUs ([`cpu_busy_ns`]: monotonic clock
//!   minus cpuidle residency minus steal, per CPU) per frame read. With
//!   nothing attached that is `cpu_baseline`; a setting's cost is the
//!   median over rounds of (its busy - the same round's baseline busy) per
//!   frame: `tcpdump_cpu` (`tcpdump -w /dev/null` with the equivalent
//!   filter: its process plus AF_PACKET's tpacket_rcv in softirq, which
//!   runs the cBPF filter and copies each frame into the ring, plus its
//!   wake-ups), `observer_cpu` (the observer as built: its programs, its
//!   process and what native XDP changes in veth's receive path),
//!   `xdp_pass_cpu` (XDP_PASS in the same mode: that change alone),
//!   `observer_generic_cpu` and `observer_xdp_off_cpu` (the other modes).
//!   `tcpdump_process_cpu` and `observer_process_cpu` are the processes'
//!   own CPU-time clocks.
//! - The observer's own work, precisely: `observer_process_cpu` plus its
//!   programs' `run_time_ns` per frame from BPF run-time stats (separate
//!   floods with kernel.bpf_stats_enabled on, so the stats never inflate
//!   the machine-wide figures), MINUS the stats' own cost: they read the
//!   clock twice per run, tens of ns on this kind of VM. That cost is
//!   XDP_PASS's run time per run under the same stats and flood
//!   (`bpf_stats_per_run`; the program itself is one instruction) and is
//!   subtracted per run of each observer program. `observer_bpf_cpu_raw`
//!   is before, `observer_bpf_cpu` after; `runs_per_packet_*` says which
//!   programs ran per frame. The sum is `observer_program_cpu`.
//! - `tcpdump_cpu_ratio` = `tcpdump_cpu` / `observer_cpu`, both
//!   machine-wide, when the observer's machine-wide cost stands out of the
//!   round-to-round noise (more than twice `observer_cpu_mad`, the median
//!   absolute deviation of its per-round values); otherwise the difference
//!   is not measurable and `observer_program_cpu` is the divisor.
//!   `observer_cpu_basis` says which (`machine` or `programs`).
//!   `tcpdump_cpu_ratio_programs` = `tcpdump_cpu` / `observer_program_cpu`
//!   is always printed: tcpdump against the observer's own work, without
//!   what XDP changes in veth's receive path.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, ensure};

use super::{
    Namespaces, cpu_busy_ns, enter_netns, maptypes::ProbeHook, median, process_cpu, report, sh,
    storm::Storm, target_dir,
};

/// Outer sources 198.18.0.16 - 198.18.0.31.
const FIRST_SOURCE: u32 = 0xc612_0010;
const SOURCES: u32 = 16;
/// What tcpdump must capture to see what the observer counts.
const TCPDUMP_FILTER: &str = "udp port 4789 or udp port 8472 or udp port 4790 or udp port 6081 \
     or udp port 51820 or udp port 51821 or ip proto 4 or ip proto 41 or ip proto 47 \
     or ip6 proto 4 or ip6 proto 41 or ip6 proto 47";
/// R's socket receive buffer (SO_RCVBUFFORCE).
const RCVBUF: i32 = 64 << 20;
/// Throughput: frames sent and not yet read by R at most (far below what
/// [`RCVBUF`] holds, page-sized frames included).
const WINDOW: u64 = 8192;
/// Measured rounds per setting (plus one warm-up round).
const ROUNDS: usize = 7;
/// Measured rounds of the floor proof ([`floor_proof`]).
const FLOOR_ROUNDS: usize = 20;
/// The target set for `throughput_ratio`: 0.97 of the frames per second
/// with nothing attached.
const TARGET_RATIO: f64 = 0.97;
/// Length of one throughput flood.
const THROUGHPUT_FLOOD: Duration = Duration::from_millis(1500);
/// The CPU floods' rate and length.
const CPU_RATE: f64 = 120_000.0;
const CPU_FLOOD: Duration = Duration::from_millis(2000);
/// The CPU S's sender thread runs on. On veth, R's whole receive path up
/// to the socket (the hook under test included) runs in the sender's
/// softirq, on this CPU: it is the one a throughput flood saturates.
const SENDER_CPU: usize = 0;
/// The CPU R's reading thread runs on: apart from the sender, so that the
/// two never take turns on one CPU (unpinned, the scheduler put them
/// together in some floods and not others, which moved throughput more
/// than the hooks under test).
const READER_CPU: usize = 1;
/// Rounds of the floods with BPF run-time stats on.
const STATS_ROUNDS: usize = 2;

/// How a receive program is attached to vr.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Native,
    Generic,
    /// tc ingress through tcx (a tc program, not XDP).
    Tcx,
}

impl Mode {
    /// The mode of an `rx_hook` in the observer's `attach` line.
    fn of_rx_hook(hook: &str) -> Option<Mode> {
        match hook {
            "xdp-native" => Some(Mode::Native),
            "xdp-generic" => Some(Mode::Generic),
            "tcx" => Some(Mode::Tcx),
            _ => None,
        }
    }
}

/// What runs on R's vr during a flood.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setting {
    Nothing,
    /// `r0 = XDP_PASS; exit` attached with a bpf link.
    XdpPass(Mode),
    /// The cheapest program that counts the bench's frames per peer
    /// (`maptypes::load_vxlan_floor`), attached with a bpf link.
    Floor(Mode),
    /// An empty program on the net:netif_receive_skb tracepoint (every
    /// skb received on any device), attached while the setting is armed:
    /// what the cheapest hook outside tc and XDP costs.
    ReceiveTracepoint,
    /// The observer's programs, loaded and attached (`--xdp-mode auto`) by
    /// the bench through the observer library: no observer process.
    ObserverPrograms,
    /// The observer's receive program for the picked mode, loaded once
    /// through the observer library before the first round (as a monitor
    /// left running is), attached with a bpf link for each flood.
    ReceiveLoadedOnce(Mode),
    /// The same receive program, loaded through the observer library just
    /// before the flood (as the other observer settings are) and attached
    /// alone with a bpf link: the same code as [`Setting::ReceiveLoadedOnce`],
    /// so a difference between the two is the fresh load's, not work per
    /// packet.
    ReceiveLoadedFresh(Mode),
    /// The built `observer attach`, with `--xdp-mode` this if given.
    Observer(Option<&'static str>),
    /// `tcpdump -w /dev/null` with the equivalent filter.
    Tcpdump,
}

/// How fast S sends.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// As fast as it can with at most this many frames sent and not yet
    /// read by R's socket.
    Window(u64),
    /// This many frames per second.
    Rate(f64),
}

/// Sender S (vs, 198.18.0.2, 02:..:02) and receiver R (vr, 198.18.0.1,
/// 02:..:01, a socket on UDP 4789): the addresses of `frames::vxlan()`.
struct Lab {
    s: String,
    r: String,
    stop: Arc<AtomicBool>,
    /// Datagrams R's socket has read.
    delivered: Arc<AtomicU64>,
    /// Thread id of the drain thread (its /proc/.../net is R's).
    drain_tid: i32,
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

/// Pins the calling thread to `cpu`, or to the last CPU on a smaller
/// machine.
fn pin(cpu: usize) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = cpu.min(cpus - 1);
    observer::bpf::testrun::pin_to_cpu(cpu)
        .with_context(|| format!("pinning a thread to CPU {cpu}"))
}

/// Reads and discards datagrams on `socket` until `stop`, in batches,
/// counting them in `delivered`.
fn drain(socket: &std::net::UdpSocket, stop: &AtomicBool, delivered: &AtomicU64) {
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
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                messages.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n > 0 {
            delivered.fetch_add(n as u64, Ordering::Relaxed);
        }
        // Caught up: nap, so R wakes about once per millisecond instead of
        // once per few frames (wake-ups dominate the baseline's CPU and its
        // noise otherwise; the buffer holds far more than a millisecond).
        if (n as usize) < BATCH {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Drop counters that matter for a flood (all cumulative).
#[derive(Clone, Copy, Default, Debug)]
struct Drops {
    /// UDP receive-buffer overflows in R.
    rcvbuf: u64,
    /// rx_dropped of vr plus tx_dropped of vs.
    veth: u64,
    /// Backlog drops (/proc/net/softnet_stat, all CPUs).
    backlog: u64,
}

impl Drops {
    fn total(&self) -> u64 {
        self.rcvbuf + self.veth + self.backlog
    }
    fn minus(&self, before: &Drops) -> Drops {
        Drops {
            rcvbuf: self.rcvbuf - before.rcvbuf,
            veth: self.veth - before.veth,
            backlog: self.backlog - before.backlog,
        }
    }
}

/// One measured flood.
#[derive(Clone, Copy, Debug)]
struct Flood {
    sent: u64,
    /// Read by R's socket, including after S stopped.
    delivered: u64,
    /// Read by R's socket while S was sending (`seconds`).
    read_in_time: u64,
    seconds: f64,
    /// Busy time of all CPUs together, from S's start until R read the
    /// last frame.
    busy_ns: f64,
    drops: Drops,
}

impl Flood {
    /// Frames per second read by R while S was sending.
    fn pps(&self) -> f64 {
        self.read_in_time as f64 / self.seconds
    }
}

fn link_stat(ns: &str, dev: &str, dir: &str, field: &str) -> anyhow::Result<u64> {
    let out = Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .output()?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    json[0]["stats64"][dir][field]
        .as_u64()
        .ok_or_else(|| anyhow!("no {dir} {field} in `ip -s -j link show {dev}`"))
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
        let delivered = Arc::new(AtomicU64::new(0));
        let tid = Arc::new(AtomicI32::new(0));
        let (ns, flag, count, tid_out) = (r.clone(), stop.clone(), delivered.clone(), tid.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let drainer = std::thread::spawn(move || -> anyhow::Result<()> {
            // SAFETY: gettid has no preconditions.
            tid_out.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            let socket = pin(READER_CPU)
                .and_then(|()| enter_netns(&ns))
                .and_then(|()| {
                    let socket = std::net::UdpSocket::bind("198.18.0.1:4789")?;
                    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
                    set_rcvbuf(&socket, RCVBUF)?;
                    Ok(socket)
                });
            let _ = ready_tx.send(socket.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            drain(&socket?, &flag, &count);
            Ok(())
        });
        ready_rx
            .recv()?
            .map_err(|e| anyhow!("UDP socket in {r}: {e}"))?;
        Ok(Lab {
            s,
            r,
            stop,
            delivered,
            drain_tid: tid.load(Ordering::Relaxed),
            drain: Some(drainer),
            _guard: guard,
        })
    }

    fn drops(&self) -> anyhow::Result<Drops> {
        let snmp = fs::read_to_string(format!("/proc/self/task/{}/net/snmp", self.drain_tid))?;
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let (names, values) = (udp.next(), udp.next());
        let rcvbuf = names
            .zip(values)
            .and_then(|(n, v)| {
                let i = n.split_whitespace().position(|f| f == "RcvbufErrors")?;
                v.split_whitespace().nth(i)?.parse().ok()
            })
            .ok_or_else(|| anyhow!("no Udp RcvbufErrors in R's /proc/net/snmp"))?;
        let veth =
            link_stat(&self.r, "vr", "rx", "dropped")? + link_stat(&self.s, "vs", "tx", "dropped")?;
        let backlog = fs::read_to_string("/proc/net/softnet_stat")?
            .lines()
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
            .sum();
        Ok(Drops {
            rcvbuf,
            veth,
            backlog,
        })
    }

    /// Floods `template` from S for `duration` at `pace`.
    fn flood(&self, template: &[u8], duration: Duration, pace: Pace) -> anyhow::Result<Flood> {
        let drops0 = self.drops()?;
        let delivered0 = self.delivered.load(Ordering::Relaxed);
        let busy0 = cpu_busy_ns()?;
        let (s, template, delivered) = (self.s.clone(), template.to_vec(), self.delivered.clone());
        let start = Instant::now();
        let sent = std::thread::spawn(move || -> anyhow::Result<u64> {
            pin(SENDER_CPU)?;
            enter_netns(&s)?;
            let mut storm = Storm::open("vs", template)?;
            let stop = AtomicBool::new(false);
            let mut sent = 0;
            while start.elapsed() < duration {
                let batch = match pace {
                    Pace::Window(window) => {
                        let read = delivered.load(Ordering::Relaxed) - delivered0;
                        let room = window.saturating_sub(sent - read.min(sent));
                        if room < 32 {
                            std::thread::yield_now();
                            continue;
                        }
                        room.min(256)
                    }
                    Pace::Rate(pps) => {
                        let due = start + Duration::from_secs_f64(sent as f64 / pps);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        256
                    }
                };
                sent += storm.send(FIRST_SOURCE, sent, batch, SOURCES, &stop)?.0;
            }
            Ok(sent)
        })
        .join()
        .map_err(|_| anyhow!("sender panicked"))??;
        let seconds = start.elapsed().as_secs_f64();
        let read_in_time = self.delivered.load(Ordering::Relaxed) - delivered0;
        // Let R drain what is queued (bounded: some frames may be dropped).
        let settle = Instant::now();
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.delivered.load(Ordering::Relaxed) - delivered0;
            if now >= sent || now == last || settle.elapsed() > Duration::from_secs(1) {
                break;
            }
            last = now;
        }
        let busy1 = cpu_busy_ns()?;
        let delivered = self.delivered.load(Ordering::Relaxed) - delivered0;
        let drops = self.drops()?.minus(&drops0);
        Ok(Flood {
            sent,
            delivered,
            read_in_time,
            seconds,
            busy_ns: busy1 - busy0,
            drops,
        })
    }

    /// Puts `setting` in place on vr; dropping the result removes it.
    fn arm(&self, setting: Setting, probes: &Probes) -> anyhow::Result<Armed> {
        Ok(match setting {
            Setting::Nothing => Armed::Nothing,
            Setting::XdpPass(mode) => self.attach_probe(probes.pass, mode)?,
            Setting::Floor(mode) => self.attach_probe(probes.floor, mode)?,
            Setting::ReceiveLoadedOnce(mode) => self.attach_probe(probes.receive_once, mode)?,
            Setting::ReceiveLoadedFresh(mode) => {
                let loaded =
                    self.in_r(|| Ok(observer::bpf::Observer::load(&Default::default())?))?;
                let program = Probe::of(loaded.program_fd(receive_hook(mode))?)?;
                let link = self.attach_xdp(program.fd, mode)?;
                Armed::ProbeLoaded(link, program.id, Box::new(loaded))
            }
            Setting::ReceiveTracepoint => Armed::Probe(
                super::maptypes::attach_tracepoint(probes.receive_tracepoint.fd)?,
                probes.receive_tracepoint.id,
            ),
            Setting::ObserverPrograms => Armed::Programs(Box::new(self.in_r(|| {
                let mut observer = observer::bpf::Observer::load(&Default::default())?;
                observer.attach(
                    &observer::bpf::Interface::resolve("vr")?,
                    observer::bpf::XdpMode::Auto,
                )?;
                Ok(observer)
            })?)),
            Setting::Observer(mode) => Armed::Observer(Attached::start(self, mode)?),
            Setting::Tcpdump => Armed::Tcpdump(Tcpdump::start(self)?),
        })
    }

    /// Runs `f` on a thread that has entered R's namespace (setns moves
    /// only the calling thread).
    fn in_r<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let r = self.r.clone();
        std::thread::spawn(move || {
            enter_netns(&r)?;
            f()
        })
        .join()
        .map_err(|_| anyhow!("a thread in {} panicked", self.r))?
    }

    /// [`Lab::attach_xdp`] of `probe`, armed with its id.
    fn attach_probe(&self, probe: Probe, mode: Mode) -> anyhow::Result<Armed> {
        Ok(Armed::Probe(self.attach_xdp(probe.fd, mode)?, probe.id))
    }

    /// Attaches `prog` to vr with a bpf link (detached when it is closed):
    /// an XDP program in its mode, or a tc program with tcx.
    fn attach_xdp(&self, prog: BorrowedFd, mode: Mode) -> anyhow::Result<OwnedFd> {
        const BPF_LINK_CREATE: libc::c_long = 28;
        const BPF_XDP: u32 = 37;
        const BPF_TCX_INGRESS: u32 = 46;
        const XDP_FLAGS_SKB_MODE: u32 = 2;
        const XDP_FLAGS_DRV_MODE: u32 = 4;
        let prog = prog.as_raw_fd();
        self.in_r(move || {
            // SAFETY: NUL-terminated literal.
            let ifindex = unsafe { libc::if_nametoindex(c"vr".as_ptr()) };
            ensure!(ifindex != 0, "no vr in R's namespace");
            // union bpf_attr for BPF_LINK_CREATE: prog_fd, target_ifindex,
            // attach_type, flags; the rest zero.
            let mut attr = [0u32; 16];
            attr[0] = prog as u32;
            attr[1] = ifindex;
            (attr[2], attr[3]) = match mode {
                Mode::Native => (BPF_XDP, XDP_FLAGS_DRV_MODE),
                Mode::Generic => (BPF_XDP, XDP_FLAGS_SKB_MODE),
                Mode::Tcx => (BPF_TCX_INGRESS, 0),
            };
            // SAFETY: attr outlives the call; the size passed is its own.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_LINK_CREATE,
                    attr.as_ptr(),
                    std::mem::size_of_val(&attr) as u32,
                )
            };
            ensure!(
                fd >= 0,
                "attaching a probe program to vr: {}",
                std::io::Error::last_os_error()
            );
            // SAFETY: a new descriptor nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        })
    }
}

/// What [`Lab::arm`] put in place.
enum Armed {
    Nothing,
    /// A hand-written program's link (detached when closed) and the
    /// program's id.
    Probe(#[allow(dead_code)] OwnedFd, u32),
    Observer(Attached),
    /// A probe's link and id as in `Probe`, and the observer it belongs to.
    ProbeLoaded(
        #[allow(dead_code)] OwnedFd,
        u32,
        #[allow(dead_code)] Box<observer::bpf::Observer>,
    ),
    /// The observer's programs without its process (detached when dropped).
    Programs(#[allow(dead_code)] Box<observer::bpf::Observer>),
    Tcpdump(Tcpdump),
}

fn set_rcvbuf(socket: &std::net::UdpSocket, bytes: i32) -> std::io::Result<()> {
    // SAFETY: valid fd and a c_int option value of the size passed.
    let ret = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const i32).cast(),
            std::mem::size_of::<i32>() as u32,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The built observer attached to R's vr.
struct Attached {
    child: Child,
    out: PathBuf,
}

impl Attached {
    /// `xdp_mode`: the `--xdp-mode` value, if any (else the default, auto).
    /// Returns at the observer's first interval line: its start-up is
    /// over (loading, and the first reads of the node's facts, which run
    /// a few tools in the 0.2 s after attaching), and what a flood
    /// measures from then on is the steady state an SRE leaves running,
    /// as in the monitor bench. (Flooding from the attach line on, those
    /// tools ran on the sender's CPU in some floods and not others.)
    fn start(lab: &Lab, xdp_mode: Option<&str>) -> anyhow::Result<Attached> {
        let out = target_dir().join(format!("bench-observer-{}.jsonl", std::process::id()));
        let child = Command::new(env!("CARGO_BIN_EXE_observer"))
            .args(["attach", "--netns", &lab.r, "vr", "--output", "json"])
            .args(xdp_mode.iter().flat_map(|m| ["--xdp-mode", m]))
            .env("OBSERVER_LOG", "error")
            .stdout(fs::File::create(&out)?)
            .spawn()?;
        let attached = Attached { child, out };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fs::read_to_string(&attached.out)?.contains(r#""type":"stats""#) {
            ensure!(
                Instant::now() < deadline,
                "observer printed no interval within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(attached)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `attach` line the observer printed.
    fn attach_line(&self) -> anyhow::Result<serde_json::Value> {
        let text = fs::read_to_string(&self.out)?;
        let line = text
            .lines()
            .find(|l| l.contains(r#""type":"attach""#))
            .ok_or_else(|| anyhow!("no attach line"))?;
        Ok(serde_json::from_str(line)?)
    }

    /// Ids of the eBPF programs the process holds (from its fds' fdinfo).
    fn program_ids(&self) -> anyhow::Result<Vec<u32>> {
        fd_program_ids(self.pid())
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

/// Ids of the eBPF programs process `pid` holds (from its fds' fdinfo).
fn fd_program_ids(pid: u32) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
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

/// `tcpdump -w /dev/null` on vr with the equivalent filter.
struct Tcpdump {
    child: Child,
    stderr: BufReader<std::process::ChildStderr>,
}

impl Tcpdump {
    fn start(lab: &Lab) -> anyhow::Result<Tcpdump> {
        let mut child = Command::new("ip")
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
        let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
        let mut line = String::new();
        while !line.contains("listening on") {
            line.clear();
            ensure!(stderr.read_line(&mut line)? > 0, "tcpdump exited: {line}");
        }
        Ok(Tcpdump { child, stderr })
    }

    /// `ip netns exec` execs tcpdump: same process.
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops tcpdump; returns its "dropped by kernel" count.
    fn stop(mut self) -> anyhow::Result<u64> {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let mut summary = String::new();
        std::io::Read::read_to_string(&mut self.stderr, &mut summary)?;
        self.child.wait()?;
        Ok(summary
            .lines()
            .find(|l| l.contains("dropped by kernel"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0))
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

/// (id, name, run count, run time ns) of the programs `ids`.
fn program_stats(ids: &[u32]) -> Vec<(u32, String, u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .map(|p| {
            (
                p.id(),
                p.name_as_str().unwrap_or("?").to_string(),
                p.run_count(),
                p.run_time().as_nanos() as u64,
            )
        })
        .collect()
}

/// Id of the program behind `fd` (this process's fdinfo).
fn prog_id(fd: BorrowedFd) -> anyhow::Result<u32> {
    let text = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("fd {} is no eBPF program", fd.as_raw_fd()))
}

/// One setting's flood and what was measured beside it.
struct Measured {
    flood: Flood,
    /// CPU time of the observer's or tcpdump's process during the flood, ns.
    process_ns: f64,
    /// (name, runs, run time ns) of the setting's programs during the
    /// flood; zero unless kernel.bpf_stats_enabled is on.
    programs: Vec<(String, u64, u64)>,
    /// tcpdump's "dropped by kernel".
    tcpdump_dropped: u64,
}

impl Measured {
    fn per_packet(&self, ns: f64) -> f64 {
        ns / self.flood.delivered.max(1) as f64
    }
    fn busy_per_packet(&self) -> f64 {
        self.per_packet(self.flood.busy_ns)
    }
}

/// A setting's flood, with its ratio to the two floods with nothing
/// attached around it ([`Floods::bracketed`]).
struct Bracketed {
    measured: Measured,
    ratio: f64,
}

/// A loaded program the bench attaches, and its id (for its run-time
/// stats).
#[derive(Clone, Copy)]
struct Probe<'a> {
    fd: BorrowedFd<'a>,
    id: u32,
}

impl<'a> Probe<'a> {
    fn of(fd: BorrowedFd<'a>) -> anyhow::Result<Probe<'a>> {
        Ok(Probe {
            fd,
            id: prog_id(fd)?,
        })
    }
}

/// The loaded programs the bench attaches: in the observer's mode unless
/// said otherwise.
struct Probes<'a> {
    /// XDP_PASS, or TC_ACT_UNSPEC for tcx.
    pass: Probe<'a>,
    /// `maptypes::load_vxlan_floor` for that hook.
    floor: Probe<'a>,
    /// `maptypes::load_empty_tracepoint` for net:netif_receive_skb.
    receive_tracepoint: Probe<'a>,
    /// The observer's receive program for the picked mode, loaded once.
    receive_once: Probe<'a>,
}

/// How the floods of a bench are run.
struct Floods<'a> {
    lab: &'a Lab,
    vxlan: &'a [u8],
    probes: &'a Probes<'a>,
    duration: Duration,
    pace: Pace,
}

impl<'a> Floods<'a> {
    fn new(
        lab: &'a Lab,
        vxlan: &'a [u8],
        probes: &'a Probes<'a>,
        duration: Duration,
        pace: Pace,
    ) -> Floods<'a> {
        Floods {
            lab,
            vxlan,
            probes,
            duration,
            pace,
        }
    }

    /// Puts `setting` in place, floods once, and removes it.
    fn one(&self, setting: Setting, round: usize) -> anyhow::Result<Measured> {
        let armed = self.lab.arm(setting, self.probes)?;
        let (ids, pid) = match &armed {
            Armed::Nothing => (vec![], None),
            Armed::Probe(_, id) | Armed::ProbeLoaded(_, id, _) => (vec![*id], None),
            Armed::Programs(_) => (vec![], None),
            Armed::Observer(a) => (a.program_ids()?, Some(a.pid())),
            Armed::Tcpdump(t) => (vec![], Some(t.pid())),
        };
        let programs0 = program_stats(&ids);
        let cpu0 = pid.map(process_cpu).transpose()?.unwrap_or(0.0);
        let flood = self.lab.flood(self.vxlan, self.duration, self.pace)?;
        let cpu1 = pid.map(process_cpu).transpose()?.unwrap_or(0.0);
        let programs = program_stats(&ids)
            .into_iter()
            .map(|(id, name, runs, ns)| {
                let (runs0, ns0) = programs0
                    .iter()
                    .find(|p| p.0 == id)
                    .map_or((0, 0), |p| (p.2, p.3));
                (name, runs - runs0, ns - ns0)
            })
            .collect();
        let tcpdump_dropped = match armed {
            Armed::Tcpdump(t) => t.stop()?,
            _ => 0,
        };
        let unread = flood.sent.saturating_sub(flood.delivered);
        if flood.drops.total() > 0 || unread > 0 {
            eprintln!(
                "bench: note: {setting:?} round {round}: {unread} of {} frames not read by R, drops {:?}",
                flood.sent, flood.drops
            );
        }
        Ok(Measured {
            flood,
            process_ns: (cpu1 - cpu0) * 1e9,
            programs,
            tcpdump_dropped,
        })
    }

    /// Floods once per setting in each of `rounds` rounds plus a warm-up
    /// round (not kept), the order rotating by one each round. Returns the
    /// rounds of each setting, in the order of `settings`.
    fn interleave(
        &self,
        settings: &[Setting],
        rounds: usize,
    ) -> anyhow::Result<Vec<Vec<Measured>>> {
        let mut out: Vec<Vec<Measured>> = settings.iter().map(|_| Vec::new()).collect();
        for round in 0..=rounds {
            for k in 0..settings.len() {
                let i = (round + k) % settings.len();
                let measured = self.one(settings[i], round)?;
                if round > 0 {
                    out[i].push(measured);
                }
            }
        }
        Ok(out)
    }

    /// As [`Floods::interleave`], with a flood with nothing attached
    /// before the first setting of a round and after every setting: each
    /// setting's flood is then bracketed by two of nothing's, seconds
    /// apart, and its ratio to nothing is its pps over their mean, which
    /// cancels the host's drift (it moved throughput by up to 12 % within
    /// seconds here, more than the hooks under test). Returns the floods
    /// with nothing, and the rounds of each setting with their ratios.
    fn bracketed(
        &self,
        settings: &[Setting],
        rounds: usize,
    ) -> anyhow::Result<(Vec<Measured>, Vec<Vec<Bracketed>>)> {
        let mut nothing = Vec::new();
        let mut out: Vec<Vec<Bracketed>> = settings.iter().map(|_| Vec::new()).collect();
        for round in 0..=rounds {
            let mut before = self.one(Setting::Nothing, round)?;
            for k in 0..settings.len() {
                let i = (round + k) % settings.len();
                let measured = self.one(settings[i], round)?;
                let after = self.one(Setting::Nothing, round)?;
                let ratio = measured.flood.pps() / ((before.flood.pps() + after.flood.pps()) / 2.0);
                if round > 0 {
                    out[i].push(Bracketed { measured, ratio });
                    nothing.push(before);
                }
                before = after;
            }
            if round > 0 {
                nothing.push(before);
            }
        }
        Ok((nothing, out))
    }
}

/// Median of `f` over `rounds`.
fn median_of<T>(rounds: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(&mut rounds.iter().map(f).collect::<Vec<_>>())
}

/// Median absolute deviation of `values` from their median.
fn mad(values: &[f64]) -> f64 {
    let mid = median(&mut values.to_vec());
    median(&mut values.iter().map(|v| (v - mid).abs()).collect::<Vec<_>>())
}

/// Frames dropped, or sent and never read by R, in all of `measured`.
fn total_drops<'m>(measured: impl IntoIterator<Item = &'m Measured>) -> u64 {
    measured
        .into_iter()
        .map(|m| {
            let unread = m.flood.sent.saturating_sub(m.flood.delivered);
            m.flood.drops.total().max(unread)
        })
        .sum()
}

/// The observer's receive program for `mode`.
fn receive_hook(mode: Mode) -> observer::bpf::Hook {
    if mode == Mode::Tcx {
        observer::bpf::Hook::TcIngress
    } else {
        observer::bpf::Hook::Xdp
    }
}

/// Which parts of the traffic bench run.
#[derive(Clone, Copy)]
pub struct Parts {
    /// The throughput settings ([`throughput`]).
    pub throughput: bool,
    /// The floor proof ([`floor_proof`]).
    pub floor: bool,
    /// The CPU floods ([`cpu`]).
    pub cpu: bool,
}

impl Parts {
    /// Every part.
    pub const ALL: Parts = Parts {
        throughput: true,
        floor: true,
        cpu: true,
    };
}

/// Runs the traffic benches with copies of `vxlan` (outer 198.18.0.2 ->
/// 198.18.0.1, VNI 4096); `xdp_pass` is the trivial XDP program.
pub fn run(vxlan: &[u8], xdp_pass: BorrowedFd, parts: Parts) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    // The mode `observer attach` picks by itself on vr; XDP_PASS is
    // compared in the same mode.
    let rx_hook = Attached::start(&lab, None)?.attach_line()?["rx_hook"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let picked = Mode::of_rx_hook(&rx_hook).ok_or_else(|| {
        anyhow!("the observer attached to veth vr with rx_hook {rx_hook}; the traffic bench compares it with a pass program in the same mode, which it has for XDP and tcx only")
    })?;
    report("traffic_rx_hook", &rx_hook, "hook");
    // The "XDP_PASS" baseline in tcx mode: a tc program that only returns
    // TC_ACT_UNSPEC.
    let tc_pass = super::maptypes::load_tc_pass()?;
    let (xdp_pass, hook) = if picked == Mode::Tcx {
        (tc_pass.as_fd(), ProbeHook::Tcx)
    } else {
        (xdp_pass, ProbeHook::Xdp)
    };
    let floor = super::maptypes::load_vxlan_floor(hook)?;
    let receive_tracepoint =
        super::maptypes::load_empty_tracepoint("netif_receive_skb", b"rx_tp_empty")?;
    let loaded_once = observer::bpf::Observer::load(&Default::default())?;
    let receive_once = loaded_once.program_fd(receive_hook(picked))?;
    let probes = Probes {
        pass: Probe::of(xdp_pass)?,
        floor: Probe::of(floor.as_fd())?,
        receive_tracepoint: Probe::of(receive_tracepoint.as_fd())?,
        receive_once: Probe::of(receive_once)?,
    };
    if parts.throughput {
        throughput(&lab, vxlan, &probes, picked)?;
    }
    if parts.floor {
        floor_proof(&lab, vxlan, &probes, picked)?;
    }
    if parts.cpu {
        cpu(&lab, vxlan, &probes, picked)?;
    }
    Ok(())
}

/// Measures whether `throughput_ratio`'s target (0.97) is above what any
/// counting program reaches on this host, and how far the observer is
/// from that floor and why, with enough rounds ([`FLOOR_ROUNDS`]) for 95 %
/// intervals narrower than the gaps in question (1-3 %; one median of 7
/// rounds moved by 1-4 % from run to run here). Settings, each adding one
/// thing to the one before: the pass program (the hook), the counting
/// floor (counting per peer), the observer's receive program loaded once
/// (the observer's work per packet, as a monitor left running does it),
/// the same program loaded just before the flood (a fresh load), the
/// observer's programs loaded and attached by the library just before the
/// flood (its other programs and the interface's facts in the maps), and
/// `observer attach` (its process). Each ratio of one
/// setting over another is taken within a round, so the host's slower
/// drift cancels.
fn floor_proof(lab: &Lab, vxlan: &[u8], probes: &Probes, picked: Mode) -> anyhow::Result<()> {
    let settings = [
        Setting::XdpPass(picked),
        Setting::Floor(picked),
        Setting::ReceiveLoadedOnce(picked),
        Setting::ReceiveLoadedFresh(picked),
        Setting::ObserverPrograms,
        Setting::Observer(None),
    ];
    let floods = Floods::new(lab, vxlan, probes, THROUGHPUT_FLOOD, Pace::Window(WINDOW));
    let (nothing, m) = floods.bracketed(&settings, FLOOR_ROUNDS)?;
    let [pass, floor, once, fresh, programs, observer] = &m[..] else {
        unreachable!("six settings")
    };
    let ratios = |rounds: &[Bracketed]| rounds.iter().map(|r| r.ratio).collect::<Vec<_>>();
    report("floor_proof_rounds", FLOOR_ROUNDS, "rounds");
    for (name, values) in [
        ("floor_proof_pass_ratio", ratios(pass)),
        ("floor_proof_floor_ratio", ratios(floor)),
        ("floor_proof_floor_vs_pass", per_round_over(floor, pass)),
        ("floor_proof_loaded_once_ratio", ratios(once)),
        (
            "floor_proof_loaded_once_vs_floor",
            per_round_over(once, floor),
        ),
        (
            "floor_proof_fresh_vs_loaded_once",
            per_round_over(fresh, once),
        ),
        (
            "floor_proof_programs_vs_fresh",
            per_round_over(programs, fresh),
        ),
        ("floor_proof_observer_ratio", ratios(observer)),
        (
            "floor_proof_observer_vs_programs",
            per_round_over(observer, programs),
        ),
        (
            "floor_proof_observer_vs_floor",
            per_round_over(observer, floor),
        ),
    ] {
        let (low, high) = median_ci95(&values);
        report(name, format!("{:.3}", median(&mut values.clone())), "x");
        report(&format!("{name}_ci95"), format!("{low:.3}-{high:.3}"), "x");
    }
    let reached = floor.iter().filter(|r| r.ratio >= TARGET_RATIO).count();
    report(
        "floor_proof_floor_rounds_at_target",
        format!("{reached}/{FLOOR_ROUNDS}"),
        "rounds",
    );
    report("floor_proof_drops", bracketed_drops(&nothing, &m), "frames");
    Ok(())
}

/// [`total_drops`] of the floods [`Floods::bracketed`] returned.
fn bracketed_drops(nothing: &[Measured], settings: &[Vec<Bracketed>]) -> u64 {
    total_drops(
        nothing
            .iter()
            .chain(settings.iter().flatten().map(|r| &r.measured)),
    )
}

/// Per round, the ratio of `a`'s flood over `b`'s (each over the floods
/// with nothing around it).
fn per_round_over(a: &[Bracketed], b: &[Bracketed]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a.ratio / b.ratio).collect()
}

/// The percentile-bootstrap 95 % interval of the median of `values`
/// (not empty): 4,000 resamples with a fixed seed, so that the same
/// rounds always give the same interval.
fn median_ci95(values: &[f64]) -> (f64, f64) {
    const BOOTSTRAP_RESAMPLES: usize = 4000;
    let mut rng = fastrand::Rng::with_seed(12);
    let mut medians: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let mut sample: Vec<f64> = (0..values.len())
                .map(|_| values[rng.usize(..values.len())])
                .collect();
            median(&mut sample)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (
        medians[BOOTSTRAP_RESAMPLES / 40],
        medians[BOOTSTRAP_RESAMPLES - 1 - BOOTSTRAP_RESAMPLES / 40],
    )
}

fn throughput(lab: &Lab, vxlan: &[u8], probes: &Probes, picked: Mode) -> anyhow::Result<()> {
    let settings = [
        Setting::XdpPass(picked),
        Setting::Observer(None),
        Setting::Observer(Some("generic")),
        Setting::Observer(Some("off")),
        // Nothing as a setting too: its ratio to the floods around it is
        // the bench's own resolution (an A/A comparison).
        Setting::Nothing,
        Setting::Floor(picked),
        Setting::ReceiveTracepoint,
    ];
    let floods = Floods::new(lab, vxlan, probes, THROUGHPUT_FLOOD, Pace::Window(WINDOW));
    let (nothing, m) = floods.bracketed(&settings, ROUNDS)?;
    let [pass, observer, generic, off, again, floor, tracepoint] = &m[..] else {
        unreachable!("seven settings")
    };
    let pps =
        |rounds: &[Bracketed]| format!("{:.0}", median_of(rounds, |r| r.measured.flood.pps()));
    let ratio = |rounds: &[Bracketed]| format!("{:.3}", median_of(rounds, |r| r.ratio));
    let ratio_mad = |rounds: &[Bracketed]| {
        format!(
            "{:.3}",
            mad(&rounds.iter().map(|r| r.ratio).collect::<Vec<_>>())
        )
    };
    let over =
        |a: &[Bracketed], b: &[Bracketed]| format!("{:.3}", median(&mut per_round_over(a, b)));
    report(
        "throughput_without",
        format!("{:.0}", median_of(&nothing, |r| r.flood.pps())),
        "pps",
    );
    report("throughput_with", pps(observer), "pps");
    report("throughput_ratio", ratio(observer), "x");
    report("throughput_ratio_mad", ratio_mad(observer), "x");
    report("throughput_aa_ratio", ratio(again), "x");
    report("throughput_aa_mad", ratio_mad(again), "x");
    report("throughput_xdp_pass", pps(pass), "pps");
    report("throughput_xdp_pass_ratio", ratio(pass), "x");
    report("throughput_ratio_vs_xdp_pass", over(observer, pass), "x");
    report("throughput_floor_ratio", ratio(floor), "x");
    report("throughput_floor_ratio_mad", ratio_mad(floor), "x");
    report("throughput_floor_ratio_vs_xdp_pass", over(floor, pass), "x");
    report("throughput_ratio_vs_floor", over(observer, floor), "x");
    report(
        "throughput_receive_tracepoint_ratio",
        ratio(tracepoint),
        "x",
    );
    report(
        "throughput_receive_tracepoint_vs_xdp_pass",
        over(tracepoint, pass),
        "x",
    );
    report("throughput_with_generic", pps(generic), "pps");
    report("throughput_ratio_generic", ratio(generic), "x");
    report("throughput_ratio_xdp_off", ratio(off), "x");
    report("throughput_drops", bracketed_drops(&nothing, &m), "frames");
    Ok(())
}

fn cpu(lab: &Lab, vxlan: &[u8], probes: &Probes, picked: Mode) -> anyhow::Result<()> {
    let settings = [
        Setting::Nothing,
        Setting::Observer(None),
        Setting::XdpPass(picked),
        Setting::Tcpdump,
        Setting::Observer(Some("generic")),
        Setting::Observer(Some("off")),
    ];
    let floods = Floods::new(lab, vxlan, probes, CPU_FLOOD, Pace::Rate(CPU_RATE));
    let m = floods.interleave(&settings, ROUNDS)?;
    let [nothing, observer, pass, tcpdump, generic, off] = &m[..] else {
        unreachable!("five settings")
    };
    // A setting's cost in each round: its busy time per frame minus the
    // same round's baseline.
    let costs = |rounds: &[Measured]| -> Vec<f64> {
        rounds
            .iter()
            .zip(nothing)
            .map(|(s, base)| s.busy_per_packet() - base.busy_per_packet())
            .collect()
    };
    let observer_costs = costs(observer);
    let observer_cpu = median(&mut observer_costs.clone());
    let tcpdump_cpu = median(&mut costs(tcpdump));
    let pass_cpu = median(&mut costs(pass));
    let generic_cpu = median(&mut costs(generic));
    let observer_process = median_of(observer, |r| r.per_packet(r.process_ns));
    let tcpdump_process = median_of(tcpdump, |r| r.per_packet(r.process_ns));

    // The observer's programs with BPF run-time stats on, beside XDP_PASS
    // under the same stats: its run time per run is the stats' own cost
    // (two clock reads) plus a one-instruction program.
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enabling kernel.bpf_stats_enabled")?;
    let s = floods.interleave(
        &[Setting::XdpPass(picked), Setting::Observer(None)],
        STATS_ROUNDS,
    )?;
    drop(stats);
    let [pass_stats, observer_stats] = &s[..] else {
        unreachable!("two settings")
    };
    let stats_per_run = median_of(pass_stats, |r| {
        let (runs, ns) = r
            .programs
            .iter()
            .fold((0, 0), |(a, b), p| (a + p.1, b + p.2));
        ns as f64 / runs.max(1) as f64
    });
    let raw = median_of(observer_stats, |r| {
        r.per_packet(r.programs.iter().map(|p| p.2 as f64).sum())
    });
    let corrected = median_of(observer_stats, |r| {
        r.per_packet(
            r.programs
                .iter()
                .map(|p| p.2 as f64 - p.1 as f64 * stats_per_run)
                .sum(),
        )
    });
    let mut names: Vec<&str> = observer_stats[0]
        .programs
        .iter()
        .map(|p| p.0.as_str())
        .collect();
    names.sort_unstable();
    let program_cpu = observer_process + corrected;

    // Machine-wide when it stands out of the round-to-round noise.
    let machine = observer_cpu > 2.0 * mad(&observer_costs) && observer_cpu > 0.0;
    let observer_basis = if machine { observer_cpu } else { program_cpu };

    report("cpu_rate", format!("{CPU_RATE:.0}"), "pps");
    report(
        "cpu_packets",
        format!("{:.0}", median_of(nothing, |r| r.flood.delivered as f64)),
        "packets/flood",
    );
    report(
        "cpu_drops",
        total_drops(m.iter().flatten()) + total_drops(s.iter().flatten()),
        "frames",
    );
    report(
        "cpu_baseline",
        format!("{:.0}", median_of(nothing, Measured::busy_per_packet)),
        "ns/pkt",
    );
    report("tcpdump_cpu", format!("{tcpdump_cpu:.0}"), "ns/pkt");
    report(
        "tcpdump_process_cpu",
        format!("{tcpdump_process:.0}"),
        "ns/pkt",
    );
    report(
        "tcpdump_dropped",
        tcpdump.iter().map(|r| r.tcpdump_dropped).sum::<u64>(),
        "packets",
    );
    report("observer_cpu", format!("{observer_cpu:.0}"), "ns/pkt");
    report(
        "observer_cpu_mad",
        format!("{:.0}", mad(&observer_costs)),
        "ns/pkt",
    );
    report("xdp_pass_cpu", format!("{pass_cpu:.0}"), "ns/pkt");
    report(
        "observer_generic_cpu",
        format!("{generic_cpu:.0}"),
        "ns/pkt",
    );
    report(
        "observer_xdp_off_cpu",
        format!("{:.0}", median(&mut costs(off))),
        "ns/pkt",
    );
    report(
        "observer_process_cpu",
        format!("{observer_process:.1}"),
        "ns/pkt",
    );
    for name in names {
        let runs = median_of(observer_stats, |r| {
            let runs = r.programs.iter().find(|p| p.0 == name).map_or(0, |p| p.1);
            r.per_packet(runs as f64)
        });
        report(
            &format!("runs_per_packet_{name}"),
            format!("{runs:.3}"),
            "x",
        );
    }
    report("bpf_stats_per_run", format!("{stats_per_run:.1}"), "ns/run");
    report("observer_bpf_cpu_raw", format!("{raw:.1}"), "ns/pkt");
    report("observer_bpf_cpu", format!("{corrected:.1}"), "ns/pkt");
    report(
        "observer_program_cpu",
        format!("{program_cpu:.1}"),
        "ns/pkt",
    );
    report(
        "observer_cpu_basis",
        if machine { "machine" } else { "programs" },
        "basis",
    );
    report(
        "tcpdump_cpu_ratio",
        format!("{:.1}", tcpdump_cpu / observer_basis),
        "x",
    );
    report(
        "tcpdump_cpu_ratio_programs",
        format!("{:.1}", tcpdump_cpu / program_cpu),
        "x",
    );
    Ok(())
}
