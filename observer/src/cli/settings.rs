//! Settings of `observer attach`: the command line over an optional TOML
//! file over defaults, and what a reload (SIGHUP) may change.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use serde::Deserialize;

use crate::{
    bpf::XdpMode,
    cli::{AttachArgs, PortArgs, parse_duration},
    model::after_decap::DevicePatterns,
    model::anomalies::Thresholds,
    model::dataplane::DeclaredTunnel,
    model::ports::PortConfig,
    node::allowsets::Tagged,
};

/// Default `--interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default `--allow-set-refresh`.
pub const DEFAULT_ALLOW_SET_REFRESH: Duration = Duration::from_secs(5);
/// Default `--max-peers`.
pub const DEFAULT_MAX_PEERS: usize = 200;

/// The config file. Every key is optional; names are the long options with
/// underscores. Unknown keys are an error (a typo must not be ignored).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    interfaces: Option<Vec<String>>,
    interval: Option<String>,
    textfile_dir: Option<PathBuf>,
    max_peers: Option<usize>,
    xdp_mode: Option<String>,
    max_flows: Option<u32>,
    vxlan_ports: Option<Vec<u16>>,
    vxlan_gpe_ports: Option<Vec<u16>>,
    geneve_ports: Option<Vec<u16>>,
    wireguard_ports: Option<Vec<u16>>,
    allow_sets: Option<Vec<String>>,
    allow_cidrs: Option<Vec<String>>,
    allow_set_refresh: Option<String>,
    anomaly_window: Option<String>,
    anomaly_min_packets: Option<u64>,
    tunnel_devices: Option<Vec<String>>,
    after_decap: Option<String>,
    drop_spike_rate: Option<f64>,
    bird_sockets: Option<Vec<PathBuf>>,
    bgp_flaps: Option<u32>,
    bgp_flap_window: Option<String>,
    probe_interval: Option<String>,
    node_name: Option<String>,
    metrics_listen: Option<String>,
    host_root: Option<PathBuf>,
    capture_dir: Option<PathBuf>,
    capture_snap: Option<u32>,
    capture_rate: Option<u32>,
    capture_file_size: Option<u64>,
    capture_files: Option<usize>,
    capture_ring_pages: Option<usize>,
}

impl FileConfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        FileConfig::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Parses the text of a config file (the values are checked by
    /// [`Settings::resolve`]).
    pub fn parse(text: &str) -> Result<FileConfig> {
        Ok(toml::from_str(text)?)
    }
}

/// Resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Interfaces to observe.
    pub interfaces: Vec<String>,
    /// Read/print/export period.
    pub interval: Duration,
    /// node_exporter textfile directory.
    pub textfile_dir: Option<PathBuf>,
    /// Peer label cap of the textfile.
    pub max_peers: usize,
    /// How received packets are counted (fixed at start).
    pub xdp_mode: XdpMode,
    /// Flow map capacity (fixed at start).
    pub max_flows: u32,
    /// UDP ports (fixed at start).
    pub ports: PortConfig,
    /// Extra allow-sets.
    pub allow_sets: Vec<Tagged<String>>,
    /// Fixed allowed prefixes.
    pub allow_cidrs: Vec<Tagged<IpNet>>,
    /// Allow-set and vxlan device refresh period.
    pub allow_set_refresh: Duration,
    /// Anomaly rules' thresholds.
    pub thresholds: Thresholds,
    /// Devices declared to carry a tunnel.
    pub tunnel_devices: Vec<DeclaredTunnel>,
    /// Devices whose drops are counted after decapsulation.
    pub after_decap: DevicePatterns,
    /// BIRD control sockets whose BGP sessions are followed.
    pub bird_sockets: Vec<PathBuf>,
    /// How often to probe the peers (`None`: never).
    pub probe_interval: Option<Duration>,
    /// The `node` label of every exported series.
    pub node_name: String,
    /// Where to serve the metrics on /metrics (fixed at start).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The host's root filesystem the node's tools run in (fixed at start).
    pub host_root: Option<PathBuf>,
    /// Evidence capture (`--capture-dir`; fixed at start).
    pub capture: Option<Capture>,
}

/// Default `--capture-snap`.
pub const DEFAULT_CAPTURE_SNAP: u32 = 256;
/// Default `--capture-rate`.
pub const DEFAULT_CAPTURE_RATE: u32 = 100;
/// Default `--capture-file-size`, MiB.
pub const DEFAULT_CAPTURE_FILE_MIB: u64 = 16;
/// Default `--capture-files`.
pub const DEFAULT_CAPTURE_FILES: usize = 8;

/// Evidence capture's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    /// Where the pcapng files go.
    pub dir: PathBuf,
    /// Bytes of each frame.
    pub snap: u32,
    /// Records per CPU and second.
    pub rate: u32,
    /// Bytes at which a file is completed.
    pub file_bytes: u64,
    /// Completed files kept.
    pub files: usize,
    /// Pages of each CPU's ring (`None`: sized for the rate and the
    /// interval, `monitor::evidence::ring_pages`).
    pub ring_pages: Option<usize>,
}

impl Capture {
    /// The options given, else the file's, else the defaults; `None`
    /// without a directory (then the other options are an error: they
    /// would silently do nothing).
    fn resolve(args: &AttachArgs, file: &FileConfig) -> Result<Option<Capture>> {
        let Some(dir) = args.capture_dir.clone().or(file.capture_dir.clone()) else {
            let given = args.capture_snap.is_some()
                || args.capture_rate.is_some()
                || args.capture_file_size.is_some()
                || args.capture_files.is_some()
                || args.capture_ring_pages.is_some();
            if given {
                bail!(
                    "--capture-snap, --capture-rate, --capture-file-size, --capture-files and --capture-ring-pages need --capture-dir DIR"
                );
            }
            return Ok(None);
        };
        let snap = args
            .capture_snap
            .or(file.capture_snap)
            .unwrap_or(DEFAULT_CAPTURE_SNAP);
        if !(64..=observer_common::EVIDENCE_MAX_SNAP).contains(&snap) {
            bail!(
                "capture_snap {snap}: give 64 to {} bytes",
                observer_common::EVIDENCE_MAX_SNAP
            );
        }
        let rate = args
            .capture_rate
            .or(file.capture_rate)
            .unwrap_or(DEFAULT_CAPTURE_RATE);
        if rate == 0 {
            bail!(
                "capture_rate 0 would capture nothing: give frames per CPU and second, 1 or more (or leave out --capture-dir)"
            );
        }
        let file_mib = args
            .capture_file_size
            .or(file.capture_file_size)
            .unwrap_or(DEFAULT_CAPTURE_FILE_MIB);
        if !(1..=4096).contains(&file_mib) {
            bail!("capture_file_size {file_mib}: give 1 to 4096 MiB");
        }
        let files = args
            .capture_files
            .or(file.capture_files)
            .unwrap_or(DEFAULT_CAPTURE_FILES);
        if !(1..=10_000).contains(&files) {
            bail!("capture_files {files}: give 1 to 10000 files");
        }
        let ring_pages = args.capture_ring_pages.or(file.capture_ring_pages);
        if let Some(pages) = ring_pages
            && (!pages.is_power_of_two() || pages > 4096)
        {
            bail!("capture_ring_pages {pages}: give a power of two from 1 to 4096");
        }
        Ok(Some(Capture {
            dir,
            snap,
            rate,
            file_bytes: file_mib << 20,
            files,
            ring_pages,
        }))
    }
}

impl PortArgs {
    /// The ports given here, else `file`'s, else the defaults, per
    /// encapsulation; `file` holds the config file's VXLAN, VXLAN-GPE,
    /// Geneve and WireGuard lists.
    pub fn resolve(&self, file: [Option<Vec<u16>>; 4]) -> PortConfig {
        let defaults = PortConfig::default();
        let [vxlan, vxlan_gpe, geneve, wireguard] = file;
        PortConfig {
            vxlan: pick(&self.vxlan_ports, vxlan, defaults.vxlan),
            vxlan_gpe: pick(&self.vxlan_gpe_ports, vxlan_gpe, defaults.vxlan_gpe),
            geneve: pick(&self.geneve_ports, geneve, defaults.geneve),
            wireguard: pick(&self.wireguard_ports, wireguard, defaults.wireguard),
        }
    }
}

/// The command-line values when given, else the file's, else `default`.
fn pick<T: Clone>(cli: &[T], file: Option<Vec<T>>, default: Vec<T>) -> Vec<T> {
    if !cli.is_empty() {
        cli.to_vec()
    } else {
        file.unwrap_or(default)
    }
}

fn parse_all<T: std::str::FromStr<Err = String>>(
    key: &str,
    values: Option<Vec<String>>,
) -> Result<Option<Vec<T>>> {
    values
        .map(|list| {
            list.iter()
                .map(|v| v.parse::<T>())
                .collect::<Result<Vec<T>, String>>()
                .map_err(|e| anyhow::anyhow!("{key}: {e}"))
        })
        .transpose()
}

/// The UTS namespace's host name (what `hostname` prints), or "unknown".
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

fn duration(key: &str, value: Option<String>) -> Result<Option<Duration>> {
    value
        .map(|v| parse_duration(&v).map_err(|e| anyhow::anyhow!("{key} = {v:?}: {e}")))
        .transpose()
}

impl Settings {
    /// The command line over `file` over defaults.
    pub fn resolve(args: &AttachArgs, file: FileConfig) -> Result<Settings> {
        let capture = Capture::resolve(args, &file)?;
        let xdp_mode = match (args.xdp_mode, file.xdp_mode) {
            (Some(mode), _) => mode,
            (None, Some(text)) => {
                <XdpMode as clap::ValueEnum>::from_str(&text, true).map_err(|_| {
                    anyhow::anyhow!("xdp_mode = {text:?}: use auto, native, generic or off")
                })?
            }
            (None, None) => XdpMode::Auto,
        };
        let settings = Settings {
            capture,
            interfaces: pick(&args.ifaces, file.interfaces, Vec::new()),
            interval: args
                .interval
                .or(duration("interval", file.interval)?)
                .unwrap_or(DEFAULT_INTERVAL),
            textfile_dir: args.textfile_dir.clone().or(file.textfile_dir),
            max_peers: args
                .max_peers
                .or(file.max_peers)
                .unwrap_or(DEFAULT_MAX_PEERS),
            xdp_mode,
            max_flows: args
                .max_flows
                .or(file.max_flows)
                .unwrap_or(observer_common::DEFAULT_MAX_FLOWS),
            ports: args.ports.resolve([
                file.vxlan_ports,
                file.vxlan_gpe_ports,
                file.geneve_ports,
                file.wireguard_ports,
            ]),
            allow_sets: pick(
                &args.allow_sets,
                parse_all("allow_sets", file.allow_sets)?,
                Vec::new(),
            ),
            allow_cidrs: pick(
                &args.allow_cidrs,
                parse_all("allow_cidrs", file.allow_cidrs)?,
                Vec::new(),
            ),
            allow_set_refresh: args
                .allow_set_refresh
                .or(duration("allow_set_refresh", file.allow_set_refresh)?)
                .unwrap_or(DEFAULT_ALLOW_SET_REFRESH),
            tunnel_devices: pick(
                &args.tunnel_devices,
                parse_all("tunnel_devices", file.tunnel_devices)?,
                Vec::new(),
            ),
            after_decap: match (&args.after_decap, file.after_decap) {
                (Some(patterns), _) => patterns.clone(),
                (None, Some(text)) => text
                    .parse()
                    .map_err(|e| anyhow::anyhow!("after_decap = {text:?}: {e}"))?,
                (None, None) => DevicePatterns::default(),
            },
            bird_sockets: pick(
                &args.bird_sockets,
                file.bird_sockets,
                crate::node::bird::CALICO_SOCKETS
                    .iter()
                    .map(PathBuf::from)
                    .collect(),
            ),
            probe_interval: args
                .probe_interval
                .or(duration("probe_interval", file.probe_interval)?),
            node_name: match args.node_name.clone().or(file.node_name) {
                Some(name) if name.trim().is_empty() => {
                    bail!(
                        "--node-name / node_name is empty: give the node's name (Kubernetes: spec.nodeName)"
                    )
                }
                Some(name) => name,
                None => hostname(),
            },
            metrics_listen: match (args.metrics_listen, file.metrics_listen) {
                (Some(addr), _) => Some(addr),
                (None, Some(text)) => Some(text.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "metrics_listen = {text:?}: give ADDRESS:PORT, e.g. \"0.0.0.0:9477\""
                    )
                })?),
                (None, None) => None,
            },
            host_root: args.host_root.clone().or(file.host_root),
            thresholds: {
                let defaults = Thresholds::default();
                Thresholds {
                    window: args
                        .anomaly_window
                        .or(duration("anomaly_window", file.anomaly_window)?)
                        .unwrap_or(defaults.window),
                    min_packets: args
                        .anomaly_min_packets
                        .or(file.anomaly_min_packets)
                        .unwrap_or(defaults.min_packets),
                    drop_spike_pps: args
                        .drop_spike_rate
                        .or(file.drop_spike_rate)
                        .unwrap_or(defaults.drop_spike_pps),
                    bgp_flaps: args
                        .bgp_flaps
                        .or(file.bgp_flaps)
                        .unwrap_or(defaults.bgp_flaps),
                    bgp_flap_window: args
                        .bgp_flap_window
                        .or(duration("bgp_flap_window", file.bgp_flap_window)?)
                        .unwrap_or(defaults.bgp_flap_window),
                }
            },
        };
        if !(settings.thresholds.drop_spike_pps.is_finite()
            && settings.thresholds.drop_spike_pps >= 0.0)
        {
            bail!("drop_spike_rate must be a number of drops per second, 0 or more");
        }
        if settings.interfaces.is_empty() {
            bail!(
                "no interface to observe: name them on the command line or as `interfaces = [...]` in the config file"
            );
        }
        Ok(settings)
    }

    /// Reads `args.config` (if any) and resolves.
    pub fn load(args: &AttachArgs) -> Result<Settings> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Settings::resolve(args, file)
    }

    /// Settings a reload cannot change (they shape the loaded programs or
    /// the attachments), named when they differ.
    pub fn fixed_changes(&self, new: &Settings) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.xdp_mode != new.xdp_mode {
            changed.push("xdp_mode");
        }
        if self.max_flows != new.max_flows {
            changed.push("max_flows");
        }
        if self.ports != new.ports {
            changed.push("ports");
        }
        // The data-plane view is built with them once, at start.
        if self.tunnel_devices != new.tunnel_devices {
            changed.push("tunnel_devices");
        }
        // The reading thread is started with them.
        if self.bird_sockets != new.bird_sockets {
            changed.push("bird_sockets");
        }
        // So is the probing thread.
        if self.probe_interval != new.probe_interval {
            changed.push("probe_interval");
        }
        // The socket is bound before the capabilities are dropped.
        if self.metrics_listen != new.metrics_listen {
            changed.push("metrics_listen");
        }
        // So is CAP_SYS_CHROOT kept, or not.
        if self.capture != new.capture {
            changed.push("capture_*");
        }
        if self.host_root != new.host_root {
            changed.push("host_root");
        }
        if new.interfaces.iter().any(|i| !self.interfaces.contains(i))
            || self.interfaces.iter().any(|i| !new.interfaces.contains(i))
        {
            changed.push("interfaces");
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(argv: &[&str]) -> AttachArgs {
        let mut full = vec!["observer", "attach"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Attach(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn file(text: &str) -> FileConfig {
        FileConfig::parse(text).unwrap()
    }

    #[test]
    fn defaults() {
        let s = Settings::resolve(&args(&["eth0"]), FileConfig::default()).unwrap();
        assert_eq!(s.interval, DEFAULT_INTERVAL);
        assert_eq!(s.max_peers, DEFAULT_MAX_PEERS);
        assert_eq!(s.xdp_mode, XdpMode::Auto);
        assert_eq!(s.ports, PortConfig::default());
        assert_eq!(s.textfile_dir, None);
    }

    #[test]
    fn file_fills_what_the_command_line_leaves_out() {
        let f = file(
            r#"
            interfaces = ["eth1"]
            interval = "15s"
            textfile_dir = "/var/lib/node_exporter/textfile_collector"
            max_peers = 50
            xdp_mode = "generic"
            allow_sets = ["ipip=hosts"]
            allow_cidrs = ["10.0.0.0/8"]
            vxlan_ports = [4789]
            "#,
        );
        let s = Settings::resolve(&args(&["--config", "x", "--interval", "2s"]), f).unwrap();
        assert_eq!(s.interfaces, ["eth1"]);
        assert_eq!(s.interval, Duration::from_secs(2), "command line wins");
        assert_eq!(s.max_peers, 50);
        assert_eq!(s.xdp_mode, XdpMode::Generic);
        assert_eq!(s.allow_sets[0].value, "hosts");
        assert_eq!(s.ports.vxlan, [4789]);
        assert_eq!(s.ports.geneve, PortConfig::default().geneve);
    }

    #[test]
    fn capture_needs_a_directory_and_sane_bounds() {
        let resolve = |argv: &[&str], text: &str| Settings::resolve(&args(argv), file(text));
        assert_eq!(resolve(&["eth0"], "").unwrap().capture, None);
        let err = resolve(&["eth0", "--capture-rate", "5"], "").unwrap_err();
        assert!(err.to_string().contains("need --capture-dir"), "{err}");
        let s = resolve(&["eth0", "--capture-dir", "/srv/ev"], "").unwrap();
        assert_eq!(
            s.capture,
            Some(Capture {
                dir: "/srv/ev".into(),
                snap: DEFAULT_CAPTURE_SNAP,
                rate: DEFAULT_CAPTURE_RATE,
                file_bytes: DEFAULT_CAPTURE_FILE_MIB << 20,
                files: DEFAULT_CAPTURE_FILES,
                ring_pages: None,
            })
        );
        let s = resolve(
            &["eth0", "--capture-snap", "128"],
            "capture_dir = \"/srv/ev\"\ncapture_files = 3\ncapture_ring_pages = 16",
        )
        .unwrap()
        .capture
        .unwrap();
        assert_eq!((s.snap, s.files, s.ring_pages), (128, 3, Some(16)));
        for (option, value, named) in [
            ("--capture-snap", "2000", "64 to 1024"),
            ("--capture-rate", "0", "capture nothing"),
            ("--capture-file-size", "0", "1 to 4096"),
            ("--capture-files", "0", "1 to 10000"),
            ("--capture-ring-pages", "3", "power of two"),
        ] {
            let err =
                resolve(&["eth0", "--capture-dir", "/srv/ev", option, value], "").unwrap_err();
            assert!(err.to_string().contains(named), "{option} {value}: {err}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        assert!(FileConfig::parse("intervall = \"1s\"").is_err());
        let err = Settings::resolve(&args(&["eth0"]), file("interval = \"soon\"")).unwrap_err();
        assert!(err.to_string().contains("interval"), "{err}");
        let err = Settings::resolve(&args(&["eth0"]), file("xdp_mode = \"fast\"")).unwrap_err();
        assert!(
            err.to_string().contains("auto, native, generic or off"),
            "{err}"
        );
        let err = Settings::resolve(&args(&["--config", "x"]), FileConfig::default()).unwrap_err();
        assert!(err.to_string().contains("no interface"), "{err}");
        let err = FileConfig::load(Path::new("/nonexistent/observer.toml")).unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/observer.toml"),
            "{err:#}"
        );
    }

    #[test]
    fn fixed_settings_are_reported_on_reload() {
        let a = Settings::resolve(&args(&["eth0"]), FileConfig::default()).unwrap();
        let mut b = a.clone();
        b.max_peers = 5;
        b.interval = Duration::from_secs(9);
        assert!(a.fixed_changes(&b).is_empty());
        b.max_flows = 1;
        b.interfaces.push("eth1".into());
        assert_eq!(a.fixed_changes(&b), ["max_flows", "interfaces"]);
    }
}
