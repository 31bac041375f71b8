//! `cargo xtask soak --minutes N`: the release observer left running for N
//! minutes against steady VXLAN traffic plus a stream of new outer source
//! addresses (so its flow map churns and evicts all the time), with the
//! textfile export on. Every 10 s it prints the observer's resident memory
//! and the textfile's size; at the end one summary line:
//!
//! ```text
//! soak minutes=N rss_start_kib=.. rss_max_kib=.. rss_end_kib=.. file_bytes_max=.. evictions=..
//! ```
//!
//! Topology (two namespaces, removed at the end, also on Ctrl-C):
//!
//! ```text
//!   obssoak-<pid>-a: va 198.18.0.1/24  <-veth->  obssoak-<pid>-b: vb 198.18.0.2/24
//!                    vx0 198.19.0.1/24  VNI 4096, UDP 4789  vx0 198.19.0.2/24
//! ```
//!
//! Traffic: a ping from A to B's inner address through vx0 (VXLAN both
//! ways on va), and crafted VXLAN frames sent by B on vb from ever new
//! sources in 10.64.0.0/10 to a MAC nobody has (A drops them at once; the
//! observer counts them first, and the kernel drop program counts the
//! drop). Nothing leaves the two namespaces.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
// The namespaces and the flood sender are the tests' (observer-testkit).
use observer_testkit::{
    netns::Netns,
    pair::{B_INNER, B_MAC_BYTES, Lower, Pair},
    storm,
};

use crate::util::{self, workspace_root};

/// Options of `cargo xtask soak`.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long the observer runs, in minutes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1440))]
    minutes: u64,
    /// New outer source addresses per second (crafted VXLAN frames).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    churn_pps: u64,
    /// The observer's --max-flows.
    #[arg(long, default_value_t = 4096)]
    max_flows: u32,
    /// The observer's --max-peers.
    #[arg(long, default_value_t = 50)]
    max_peers: usize,
    /// The observer's --interval.
    #[arg(long, default_value = "1s")]
    interval: String,
}

const PREFIX: &str = "obssoak-";
/// Seconds between two rows of the table.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const NOBODY_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xee];

/// What must be undone; dropping it stops the threads and processes and
/// deletes the namespaces and the textfile directory.
struct Soak {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    children: Vec<(&'static str, Child)>,
    /// The two namespaces; deleted when dropped, after the processes stopped.
    pair: Option<Pair>,
    dir: Option<PathBuf>,
}

impl Soak {
    fn stop_children(&mut self) {
        for (_, child) in &mut self.children {
            if let Ok(None) = child.try_wait() {
                // SAFETY: kill(2) of our own, unreaped child.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (what, child) in &mut self.children {
            while let Ok(None) = child.try_wait() {
                if Instant::now() >= deadline {
                    eprintln!("soak: {what} ignores SIGTERM; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        self.children.clear();
    }
}

impl Drop for Soak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.stop_children();
        if let Some(pair) = self.pair.take() {
            let names = format!("{} {}", pair.a.name(), pair.b.name());
            drop(pair);
            println!("soak: removed namespaces {names}");
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// `ip ARGS` (whitespace-separated words), quietly; fails with its message.
fn ip(args: &str) -> Result<()> {
    util::output(Command::new("ip").args(args.split_whitespace())).map(drop)
}

/// Resident memory of `pid` in KiB, `None` once it has exited.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The number after `"key":` in a JSON line (no JSON parser in xtask).
fn json_u64(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Runs `f` on a thread inside network namespace `ns`.
fn in_netns<F>(ns: &str, f: F) -> Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    let file = File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("opening /run/netns/{ns}"))?;
    Ok(thread::spawn(move || {
        // SAFETY: valid fd of a network namespace file.
        let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if ret != 0 {
            eprintln!("soak: setns: {}", std::io::Error::last_os_error());
            return;
        }
        f()
    }))
}

fn ipv4_header(src: [u8; 4], dst: [u8; 4], proto: u8, payload_len: usize) -> Vec<u8> {
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    let sum = storm::internet_checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

/// A VXLAN frame (VNI 4096) from B to A's underlay address, to a MAC
/// nobody has, carrying an inner ICMP echo. UDP checksum 0 (none), so only
/// the outer source and IPv4 checksum change per frame.
fn churn_template() -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    icmp.extend((0..32).map(|i| i as u8));
    let sum = storm::internet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut inner = vec![2, 0, 0, 0, 2, 2, 2, 0, 0, 0, 2, 1, 0x08, 0x00];
    inner.extend(ipv4_header([198, 19, 9, 1], [198, 19, 9, 2], 1, icmp.len()));
    inner.extend(icmp);
    let mut vxlan = vec![0x08, 0, 0, 0];
    vxlan.extend_from_slice(&(4096u32 << 8).to_be_bytes());
    vxlan.extend(inner);
    let mut udp = 49153u16.to_be_bytes().to_vec();
    udp.extend_from_slice(&4789u16.to_be_bytes());
    udp.extend_from_slice(&((8 + vxlan.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend(vxlan);
    let mut frame = NOBODY_MAC.to_vec();
    frame.extend_from_slice(&B_MAC_BYTES);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend(ipv4_header([10, 64, 0, 0], [198, 18, 0, 1], 17, udp.len()));
    frame.extend(udp);
    frame
}

/// Sends crafted frames on `iface` at `pps`, each from the next address of
/// 10.64.0.0/10 (wrapping), until `stop`; counts them in `sent`.
fn churn(iface: &str, pps: u64, stop: &AtomicBool, sent: &AtomicU64) -> Result<()> {
    let mut storm = storm::Storm::open(iface, churn_template())?;
    let first = u32::from_be_bytes([10, 64, 0, 0]);
    let span = 1u32 << 22;
    let start = Instant::now();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * pps as f64) as u64;
        if next >= due {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let (frames, _retries) = storm.send(first, next, due - next, span, stop)?;
        next += frames;
        sent.store(next, Ordering::Relaxed);
    }
    Ok(())
}

/// What the observer's stdout reader keeps: the latest stats line's
/// counters and the number of lines.
#[derive(Default, Clone, Copy)]
struct Stats {
    lines: u64,
    flow_entries: u64,
    flow_evictions: u64,
    flow_insert_failures: u64,
    rows_forgotten: u64,
    final_seen: bool,
}

/// The textfile's size and its number of encap packet series.
fn textfile_facts(path: &Path) -> (u64, usize) {
    match std::fs::read_to_string(path) {
        Ok(text) => (
            text.len() as u64,
            text.lines()
                .filter(|l| l.starts_with("observer_encap_packets_total{"))
                .count(),
        ),
        Err(_) => (0, 0),
    }
}

/// Deletes namespaces left by a soak whose process no longer exists.
fn remove_stale_soaks() {
    let Ok(out) = util::output(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match ip(&format!("netns del {name}")) {
            Ok(()) => println!("soak: removed {name}, left over by a killed soak"),
            Err(e) => eprintln!("soak: cannot remove stale namespace {name}: {e:#}"),
        }
    }
}

fn interrupted(flag: &AtomicBool) -> Result<()> {
    if flag.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Runs the soak.
pub fn soak(args: &SoakArgs) -> Result<()> {
    if !util::is_root() {
        bail!("the soak needs root (network namespaces, eBPF)");
    }
    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupt.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("cannot install the Ctrl-C handler")?;
    }
    println!("soak: building the observer");
    crate::build_release()?;
    let binary = workspace_root().join("target/release/observer");
    interrupted(&interrupt)?;
    remove_stale_soaks();

    let pid = std::process::id();
    let (a, b) = (format!("{PREFIX}{pid}-a"), format!("{PREFIX}{pid}-b"));
    let dir = std::env::temp_dir().join(format!("{PREFIX}{pid}"));
    let mut soak = Soak {
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
        children: Vec::new(),
        pair: None,
        dir: None,
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    soak.dir = Some(dir.clone());

    println!("soak: namespaces {a} (observed) and {b}");
    let pair = Pair::build(Netns::create(&a)?, Netns::create(&b)?, "va", "vb")?;
    soak.pair.insert(pair).vxlan_checked(Lower::Route)?;
    ip(&format!("netns exec {a} ping -q -n -c 1 -W 2 {B_INNER}"))
        .context("the soak's VXLAN tunnel does not work")?;
    interrupted(&interrupt)?;

    // The observer, JSON on a pipe read by a thread (latest stats line).
    let textfile = dir.join("observer.prom");
    let log_path = dir.join("observer.log");
    let mut cmd = Command::new(&binary);
    cmd.args(["attach", "--netns", &a, "--output", "json"])
        .args(["--interval", &args.interval])
        .arg("--textfile-dir")
        .arg(&dir)
        .args(["--max-peers", &args.max_peers.to_string()])
        .args(["--max-flows", &args.max_flows.to_string()])
        .arg("va")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&log_path)?);
    println!("soak: {}", util::display(&cmd));
    let mut child = cmd.spawn().context("starting the observer")?;
    let stdout = child.stdout.take().expect("piped");
    let observer_pid = child.id();
    soak.children.push(("the observer", child));
    let stats = Arc::new(Mutex::new(Stats::default()));
    {
        let stats = stats.clone();
        soak.threads.push(thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut s = stats.lock().unwrap();
                s.lines += 1;
                if line.contains("\"type\":\"stats\"") {
                    s.flow_entries = json_u64(&line, "flow_entries").unwrap_or(0);
                    s.flow_evictions = json_u64(&line, "flow_evictions").unwrap_or(0);
                    s.flow_insert_failures = json_u64(&line, "flow_insert_failures").unwrap_or(0);
                    s.rows_forgotten = json_u64(&line, "rows_forgotten").unwrap_or(0);
                    s.final_seen |= line.contains("\"final\":true");
                }
            }
        }));
    }
    let observer_exited = |soak: &mut Soak| -> Result<()> {
        if let Some(status) = soak.children[0].1.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the observer exited ({status}); its log:\n{log}");
        }
        Ok(())
    };
    let ready = Instant::now();
    while !textfile.exists() {
        interrupted(&interrupt)?;
        observer_exited(&mut soak)?;
        if ready.elapsed() > Duration::from_secs(30) {
            bail!("no textfile after 30 s");
        }
        thread::sleep(Duration::from_millis(50));
    }
    let rss_start = rss_kib(observer_pid).context("observer gone")?;

    // Traffic: a ping through the tunnel, and the churn of new sources.
    let total = Duration::from_secs(args.minutes * 60);
    let ping = Command::new("ip")
        .args(["netns", "exec", &a, "ping", "-q", "-n", "-i", "0.002"])
        .args(["-w", &(total.as_secs() + 60).to_string(), B_INNER])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ping")?;
    soak.children.push(("ping", ping));
    let churned = Arc::new(AtomicU64::new(0));
    if args.churn_pps > 0 {
        let (stop, sent, pps) = (soak.stop.clone(), churned.clone(), args.churn_pps);
        let thread = in_netns(&b, move || {
            if let Err(e) = churn("vb", pps, &stop, &sent) {
                eprintln!("soak: churn sender: {e:#}");
            }
        })?;
        soak.threads.push(thread);
    }
    println!(
        "soak: {} min; ping every 2 ms through vx0, {} new sources/s; a row every {}s",
        args.minutes,
        args.churn_pps,
        SAMPLE_EVERY.as_secs()
    );
    println!(
        "{:>7} {:>9} {:>10} {:>7} {:>8} {:>12} {:>10} {:>12}",
        "elapsed",
        "rss_kib",
        "file_bytes",
        "series",
        "entries",
        "evictions",
        "forgotten",
        "new_sources"
    );

    let start = Instant::now();
    let (mut rss_max, mut file_bytes_max) = (rss_start, 0u64);
    let mut next_row = Duration::ZERO;
    loop {
        interrupted(&interrupt)?;
        observer_exited(&mut soak)?;
        let elapsed = start.elapsed();
        let rss = rss_kib(observer_pid).context("observer gone")?;
        rss_max = rss_max.max(rss);
        let (bytes, series) = textfile_facts(&textfile);
        file_bytes_max = file_bytes_max.max(bytes);
        if elapsed >= next_row || elapsed >= total {
            let s = *stats.lock().unwrap();
            println!(
                "{:>6}s {rss:>9} {bytes:>10} {series:>7} {:>8} {:>12} {:>10} {:>12}",
                elapsed.as_secs(),
                s.flow_entries,
                s.flow_evictions,
                s.rows_forgotten,
                churned.load(Ordering::Relaxed)
            );
            next_row += SAMPLE_EVERY;
        }
        if elapsed >= total {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    let rss_end = rss_kib(observer_pid).context("observer gone")?;

    // Stop the traffic, then the observer (SIGTERM: final counters, file removed).
    soak.stop.store(true, Ordering::SeqCst);
    let (_, observer) = &mut soak.children[0];
    // SAFETY: kill(2) of our own, unreaped child.
    unsafe { libc::kill(observer.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = observer.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            bail!("the observer did not stop within 10 s of SIGTERM");
        }
        thread::sleep(Duration::from_millis(20));
    };
    for thread in soak.threads.drain(..) {
        let _ = thread.join();
    }
    let s = *stats.lock().unwrap();
    if !status.success() {
        bail!("the observer failed at the end ({status})");
    }
    if !s.final_seen {
        bail!("the observer printed no final stats line");
    }
    if textfile.exists() {
        bail!(
            "the observer left {} behind after SIGTERM",
            textfile.display()
        );
    }
    println!(
        "soak: observer exited {status}; {} JSON lines; final flow_entries={} flow_insert_failures={} rows_forgotten={}",
        s.lines, s.flow_entries, s.flow_insert_failures, s.rows_forgotten
    );
    println!(
        "soak minutes={} rss_start_kib={rss_start} rss_max_kib={rss_max} rss_end_kib={rss_end} file_bytes_max={file_bytes_max} evictions={}",
        args.minutes, s.flow_evictions
    );
    drop(soak);
    Ok(())
}
