//! Fixtures of the monitor tests (owned by tests/monitor.rs): the
//! Prometheus text format as node_exporter's textfile collector reads it,
//! temporary directories and a read-only bind mount, node_exporter and
//! promtool, a watcher that keeps every version of the textfile, a fast
//! raw-frame storm (sendmmsg), and a process' resident memory.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use observer_testkit::storm::Storm;

use super::netns::{
    Netns, WAIT, free_port, in_netns, run, temp_path, terminate, try_run, wait_listening,
};

/// Debian's node_exporter (package prometheus-node-exporter).
pub const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
/// Prometheus' promtool (package prometheus).
pub const PROMTOOL: &str = "/usr/bin/promtool";

/// True when running under CI (`CI=true`), where missing tools are failures.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the tool at `path` exists; when it does not, panics under CI
/// (the setup step installs it) and otherwise says the test is skipped.
pub fn have_tool(test: &str, path: &str, package: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    if under_ci() {
        panic!("{test}: {path} is missing (Debian package {package}) and CI=true");
    }
    eprintln!("skipping {test}: {path} is missing (apt-get install {package})");
    false
}

// ------------------------------------------------------------------ format

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Label pairs, by name.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed exposition (classic text format): samples, and the TYPE of
/// each family.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// The text as read.
    pub text: String,
    /// Sample lines in order.
    pub samples: Vec<Sample>,
    /// `# TYPE` of each family.
    pub types: BTreeMap<String, String>,
}

/// Reads a label value after its opening quote; returns it and the rest
/// after the closing quote.
fn label_value(s: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, &s[i + 1..]),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, other)) => value.push(other),
                None => break,
            },
            c => value.push(c),
        }
    }
    panic!("unterminated label value in {s:?}");
}

impl Exposition {
    /// Parses `text`; panics on a line that is not a comment, blank or a
    /// sample (promtool checks the finer points).
    pub fn parse(text: &str) -> Exposition {
        let mut samples = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                    types.insert(name.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let name_end = line
                .find(['{', ' '])
                .unwrap_or_else(|| panic!("no value in sample line {line:?}"));
            let name = line[..name_end].to_string();
            let mut labels = BTreeMap::new();
            let mut rest = &line[name_end..];
            if let Some(mut inner) = rest.strip_prefix('{') {
                loop {
                    inner = inner.trim_start_matches([',', ' ']);
                    if let Some(after) = inner.strip_prefix('}') {
                        rest = after;
                        break;
                    }
                    let eq = inner
                        .find("=\"")
                        .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                    let key = inner[..eq].to_string();
                    let (value, after) = label_value(&inner[eq + 2..]);
                    labels.insert(key, value);
                    inner = after;
                }
            }
            let mut words = rest.split_whitespace();
            let value = words
                .next()
                .unwrap_or_else(|| panic!("no value in {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Exposition {
            text: text.to_string(),
            samples,
            types,
        }
    }

    /// Reads and parses `path`; `None` when it does not exist.
    pub fn read(path: &Path) -> Option<Exposition> {
        match std::fs::read_to_string(path) {
            Ok(text) => Some(Exposition::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("reading {}: {e}", path.display()),
        }
    }

    /// Samples of `name` whose labels include every pair of `filter`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The value of the one sample of `name` matching `filter`; `None` when
    /// there is none, a panic when there are several.
    pub fn value(&self, name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.select(name, filter).collect();
        assert!(
            found.len() <= 1,
            "{name} {filter:?} matches {} samples:\n{}",
            found.len(),
            self.text
        );
        found.first().map(|s| s.value)
    }

    /// Sum of the samples of `name` matching `filter` (0 when none).
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.select(name, filter).map(|s| s.value).sum()
    }

    /// Distinct values of `label` among the samples of `name`.
    pub fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.labels.get(label).cloned())
            .collect()
    }

    /// Every sample of a counter family, keyed by name and labels.
    pub fn counters(&self) -> BTreeMap<(String, Vec<(String, String)>), f64> {
        self.samples
            .iter()
            .filter(|s| self.types.get(&s.name).map(String::as_str) == Some("counter"))
            .map(|s| {
                let labels = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                ((s.name.clone(), labels), s.value)
            })
            .collect()
    }
}

/// Counter series of `later` that are smaller than in `earlier`, as text.
pub fn decreased(earlier: &Exposition, later: &Exposition) -> Vec<String> {
    let before = earlier.counters();
    later
        .counters()
        .into_iter()
        .filter_map(|(key, now)| match before.get(&key) {
            Some(&was) if now < was => Some(format!("{key:?}: {was} -> {now}")),
            _ => None,
        })
        .collect()
}

/// Waits until the file at `path` parses into something `done` accepts;
/// returns it, or panics with the last version after [`WAIT`].
pub fn wait_for_file(path: &Path, what: &str, done: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + WAIT;
    loop {
        let current = Exposition::read(path);
        if let Some(e) = &current
            && done(e)
        {
            return current.unwrap();
        }
        if Instant::now() >= deadline {
            panic!(
                "{}: not {what} after {WAIT:?}; last version:\n{}",
                path.display(),
                current.map_or("(no file)".to_string(), |e| e.text)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ------------------------------------------------------------ directories

/// A directory in the temporary directory, removed with its content on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `nstest-<tag>-<pid>-<n>.d`.
    pub fn new(tag: &str) -> TempDir {
        let path = temp_path(tag, "d");
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `source` bind-mounted read-only on `target` (root writes nowhere through
/// it: EROFS, whatever the permission bits), unmounted on drop.
pub struct ReadOnlyBind {
    target: PathBuf,
    mounted: bool,
}

impl ReadOnlyBind {
    /// Creates `target` if needed and mounts `source` on it, read-only.
    pub fn new(source: &Path, target: &Path) -> ReadOnlyBind {
        std::fs::create_dir_all(target).unwrap();
        let (source, target) = (source.to_str().unwrap(), target.to_str().unwrap());
        run("mount", &["--bind", source, target]);
        let guard = ReadOnlyBind {
            target: target.into(),
            mounted: true,
        };
        run("mount", &["-o", "remount,bind,ro", target]);
        guard
    }

    /// Remounts the target read-write.
    pub fn make_writable(&self) {
        run(
            "mount",
            &["-o", "remount,bind,rw", self.target.to_str().unwrap()],
        );
    }
}

impl Drop for ReadOnlyBind {
    fn drop(&mut self) {
        if self.mounted {
            let _ = try_run("umount", &[self.target.to_str().unwrap()]);
        }
    }
}

// ---------------------------------------------------------------- watcher

/// Reads a file every few milliseconds on a thread and keeps every distinct
/// version seen (the observer replaces it atomically, so each read is a
/// whole version). Versions are parsed only when the content changed.
pub struct FileWatcher {
    stop: Arc<AtomicBool>,
    versions: Arc<Mutex<Vec<Exposition>>>,
    thread: Option<JoinHandle<()>>,
}

impl FileWatcher {
    /// Starts watching `path` (which need not exist yet).
    pub fn start(path: &Path) -> FileWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let versions = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, versions, path) = (stop.clone(), versions.clone(), path.to_path_buf());
            std::thread::spawn(move || {
                let mut last = String::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(text) = std::fs::read_to_string(&path)
                        && text != last
                    {
                        versions.lock().unwrap().push(Exposition::parse(&text));
                        last = text;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        FileWatcher {
            stop,
            versions,
            thread: Some(thread),
        }
    }

    /// Versions seen so far.
    pub fn count(&self) -> usize {
        self.versions.lock().unwrap().len()
    }

    /// Stops the thread and returns every version seen, in order.
    pub fn stop(mut self) -> Vec<Exposition> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("watcher thread panicked");
        }
        std::mem::take(&mut *self.versions.lock().unwrap())
    }
}

impl Drop for FileWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------- node_exporter

/// node_exporter with only the textfile collector, listening on 127.0.0.1
/// inside a test namespace (so its port cannot clash with anything on the
/// host); stopped on drop.
pub struct NodeExporter {
    child: Child,
    netns: String,
    port: u16,
    log: PathBuf,
}

impl NodeExporter {
    /// Starts it on a free port of `ns`'s loopback, reading `dir`, and waits
    /// until it accepts connections.
    pub fn start(ns: &Netns, dir: &Path) -> NodeExporter {
        let port = free_port(ns);
        let log = temp_path("node-exporter", "log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), NODE_EXPORTER])
            .args([
                "--collector.disable-defaults".to_string(),
                "--collector.textfile".to_string(),
                format!("--collector.textfile.directory={}", dir.display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("spawning node_exporter");
        let mut exporter = NodeExporter {
            child,
            netns: ns.name().to_string(),
            port,
            log,
        };
        wait_listening(
            ns.name(),
            port,
            "node_exporter",
            &mut exporter.child,
            || std::fs::read_to_string(&exporter.log).unwrap_or_default(),
        );
        exporter
    }

    /// The port it listens on (127.0.0.1 of its namespace).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /metrics` over HTTP/1.0; returns the body (panics unless 200).
    pub fn scrape(&self) -> String {
        let addr = format!("127.0.0.1:{}", self.port);
        let response = in_netns(&self.netns, move || {
            let mut stream = TcpStream::connect(&addr).expect("connect to node_exporter");
            stream.set_read_timeout(Some(WAIT)).unwrap();
            write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).expect("read response");
            response
        });
        let (head, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP header end: {response:?}"));
        let status = head.lines().next().unwrap_or_default();
        assert!(status.contains(" 200 "), "node_exporter: {status}\n{head}");
        body.to_string()
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(5));
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `promtool check metrics` of `text` (on stdin): exit status and
/// everything it printed (stdout and stderr).
pub fn promtool_check_metrics(text: &str) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning promtool");
    let mut stdin = child.stdin.take().unwrap();
    let input = text.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("promtool");
    writer.join().unwrap().expect("writing to promtool");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

// ----------------------------------------------------------------- memory

/// Resident memory of process `pid` in KiB (VmRSS of /proc/PID/status);
/// `None` once it has exited (a zombie has no VmRSS).
pub fn try_rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// [`try_rss_kib`] of a process that must be running.
pub fn rss_kib(pid: u32) -> u64 {
    try_rss_kib(pid).unwrap_or_else(|| panic!("process {pid} is not running (no VmRSS)"))
}

/// Samples the RSS of `pid` every few milliseconds on a thread; `stop`
/// returns the largest value seen (KiB).
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl RssSampler {
    /// Starts sampling.
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut max = 0;
            while !flag.load(Ordering::Relaxed) {
                match try_rss_kib(pid) {
                    Some(rss) => max = max.max(rss),
                    None => break,
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            max
        });
        RssSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops and returns the maximum (KiB).
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ------------------------------------------------------------------ storm

/// What [`send_storm`] did.
#[derive(Debug, Clone, Copy)]
pub struct StormReport {
    /// Frames the kernel accepted (each exactly once).
    pub frames: u64,
    /// sendmmsg calls that the full veth ring turned back (ENOBUFS) and
    /// that were retried.
    pub retries: u64,
    /// How long sending took.
    pub elapsed: Duration,
}

/// Sends `count` copies of `template` (untagged Ethernet + IPv4 without
/// options, UDP checksum 0) on `iface` of `ns`, the i-th with IPv4 source
/// `first_source + i` (header checksum recomputed), with sendmmsg in
/// batches. A frame the veth ring refuses (ENOBUFS) is sent again, so each
/// source is delivered exactly once.
pub fn send_storm(
    ns: &Netns,
    iface: &str,
    template: Vec<u8>,
    first_source: Ipv4Addr,
    count: u32,
) -> StormReport {
    let iface = iface.to_string();
    ns.run(move || {
        let mut storm = Storm::open(&iface, template).expect("storm socket");
        let start = Instant::now();
        let never = AtomicBool::new(false);
        let (frames, retries) = storm
            .send(
                u32::from(first_source),
                0,
                u64::from(count),
                u32::MAX,
                &never,
            )
            .unwrap_or_else(|e| panic!("sendmmsg on {iface}: {e}"));
        assert_eq!(frames, u64::from(count));
        StormReport {
            frames,
            retries,
            elapsed: start.elapsed(),
        }
    })
}
