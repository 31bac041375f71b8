//! `observer lab`: the incident of docs/incidents.md rebuilt in network
//! namespaces (a GPU node behind a router, two control-plane nodes, Calico's
//! devices, routes and rules), with pod-to-pod pings over VXLAN and IPIP,
//! this same binary observing every node, and a lab diagnosis composed from
//! what those observers printed.
//!
//! Modules: `topology` builds the network, `scenarios` says what each
//! scenario changes, `traffic` runs the pings, `observers` runs and reads
//! the node observers, `report` turns their output into facts and
//! findings, `view` prints, `cleanup` removes everything (also on signals
//! and panics), `tunnel` stands in for tunl0 on kernels without IPIP.
//! The BGP scenario (`bgp-down`) has its own network and run: `mesh`
//! (four nodes with BIRD, driven by `bird`), `bgp` (the run), `bgp_facts`
//! (its facts).
//!
//! A component of its own beside the commands: it drives the observer as
//! a user would (this binary in each node's namespace, read through its
//! JSON), and nothing of the observer's engine; `cmd::lab` only calls it.

mod bgp;
mod bgp_facts;
pub mod bird;
mod cleanup;
mod mesh;
mod observers;
mod probes;
mod report;
pub mod scenarios;
mod shell;
mod topology;
mod traffic;
mod tunnel;
pub mod view;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde_json::json;

use crate::cli::LabArgs;
use cleanup::Cleanup;
use observers::{ObserverSpec, Observers, Outputs};
use topology::{NODES, Names};
use traffic::{PING_INTERVAL, PING_LINGER};
use view::{Summary, View};

/// Tools the lab runs, with the Debian package that provides each.
const TOOLS: [(&str, &str); 5] = [
    ("ip", "iproute2"),
    ("bridge", "iproute2"),
    ("iptables", "iptables"),
    ("ipset", "ipset"),
    ("ping", "iputils-ping"),
];

/// Pings send at least this many requests each, or the lab refuses to run.
const MIN_PINGS: u64 = 10;

/// Time allowed beyond the planned traffic: for the observers' backstop,
/// and for them to write their final interval once stopped.
const TRAFFIC_SLACK: Duration = Duration::from_secs(60);

/// Tools the BGP scenarios run besides [`TOOLS`].
const BGP_TOOLS: [(&str, &str); 2] = [("bird", "bird2"), ("birdc", "bird2")];

/// Runs the lab: build, observe, ping, diagnose, remove.
pub fn run(args: LabArgs) -> Result<()> {
    preflight(args.scenario)?;
    cleanup::install_signal_handlers()?;
    cleanup::remove_stale_labs();
    let scenario = args.scenario;
    if scenario.is_bgp() {
        if args.probe {
            bail!(
                "--probe (probes instead of the pings) runs on the incident's scenarios \
                 (incident, udp-block, mtu, encap-mismatch, healthy), not on {}; the BGP \
                 scenarios probe every node after their run with --bgp-encap ipip",
                scenario.name()
            );
        }
        return bgp::run(&args);
    }
    let mut view = View::new(
        args.output,
        NODES.iter().map(|n| n.name.to_string()).collect(),
    );
    let names = Names::new(std::process::id());
    let mut lab = Cleanup::default();

    view.note_scenario(scenario)?;
    let ipip = topology::build(&mut lab, &names, scenario)?;
    view.note(&format!(
        "namespaces {} (gpu {}), {} (router), {} (cp1 {}), {} (cp2 {}); tunl0: {}",
        names.nodes[0],
        NODES[0].addr,
        names.router,
        names.nodes[1],
        NODES[1].addr,
        names.nodes[2],
        NODES[2].addr,
        match ipip {
            topology::IpipKind::Kernel => "the kernel's IPIP tunnel",
            topology::IpipKind::Userspace =>
                "this kernel has no IPIP (CONFIG_NET_IPIP), so a userspace tunnel on a TUN device \
                 sends the same IPIP packets (the observers are told so with --tunnel-device tunl0=ipip)",
        }
    ))?;
    view.lab_line(&json!({
        "fact": "start",
        "scenario": scenario.name(),
        "about": scenario.about(),
        "namespaces": {
            "gpu": names.nodes[0], "router": names.router,
            "cp1": names.nodes[1], "cp2": names.nodes[2],
        },
        "ipip": ipip,
        "duration_ms": args.duration.as_millis() as u64,
    }))?;

    // The observers are stopped once the pings ended, however long that
    // takes on a slow machine; their --duration only backs that up.
    let backstop = args.duration * 4 + TRAFFIC_SLACK;
    let specs: Vec<ObserverSpec> = NODES
        .iter()
        .zip(&names.nodes)
        .map(|(node, namespace)| ObserverSpec {
            node: node.name.to_string(),
            namespace: namespace.clone(),
            args: tunnel_args(ipip),
        })
        .collect();
    let mut observers = Observers::spawn(&mut lab, &specs, backstop, Outputs::of(&args))?;
    view.note("observers starting on gpu, cp1 and cp2 (observer diagnose ... eth0)")?;
    let first_ready = observers.wait_ready(&mut view, args.attach_timeout)?;

    if args.probe {
        return probe_run(args, lab, names, ipip, observers, view, backstop);
    }

    // The pings are sized to end within --duration of the first observer
    // being ready; the observers are stopped after them in any case.
    let tail = PING_LINGER + Duration::from_secs(1);
    let left = (first_ready + args.duration).saturating_duration_since(Instant::now() + tail);
    let count = (left.as_millis() / PING_INTERVAL.as_millis()) as u64;
    if count < MIN_PINGS {
        bail!(
            "--duration {:?} leaves time for only {count} pings after the observers attached \
             (they took {:?}); give a longer --duration",
            args.duration,
            first_ready.elapsed()
        );
    }
    let specs = scenario.pings();
    let pings = traffic::start(&mut lab, &names, &specs, count)?;
    view.traffic_started();
    view.note(&format!(
        "{} pings of {count} requests each, one every {PING_INTERVAL:?}, between pod addresses",
        specs.len()
    ))?;
    view.lab_line(&json!({
        "fact": "traffic",
        "pings": specs.len(),
        "count": count,
        "interval_ms": PING_INTERVAL.as_millis() as u64,
    }))?;

    // Every ping ends before the observers stop, and its last replies get
    // PING_LINGER more, so each packet is in the observers' final counters
    // also on a slow or emulated machine.
    let deadline = Instant::now() + backstop;
    while !traffic::all_ended(&mut lab, &pings)? {
        if Instant::now() >= deadline {
            bail!(
                "the pings did not end within {backstop:?}; the machine is too slow for this --duration"
            );
        }
        observers.pump(&mut view)?;
    }
    let linger = Instant::now() + PING_LINGER + scrape_grace(&args);
    while Instant::now() < linger {
        observers.pump(&mut view)?;
    }
    observers.stop(&mut lab);
    observers.wait_end(&mut lab, &mut view, TRAFFIC_SLACK)?;
    note_evidence(&view, &args)?;
    let results = traffic::finish(&mut lab, pings, Duration::from_secs(5))?;
    let counters = rule_counters(&names)?;
    // The decisive experiment as one command, once the observers and the
    // rule counters have what the pings did.
    view.note("observer probe on gpu, cp1 and cp2 at once")?;
    let runs = probes::run(&mut lab, &names.nodes, &tunnel_args(ipip), TRAFFIC_SLACK)?;
    drop(lab);
    summarize(&view, scenario, &results, &runs, &observers, &counters)
}

/// The rule counters of every node, read at the end.
fn rule_counters(names: &Names) -> Result<Vec<topology::RuleCounts>> {
    names
        .nodes
        .iter()
        .map(|ns| topology::rule_counters(ns))
        .collect()
}

/// With `--capture-dir`, where each node's evidence is and how to count it.
fn note_evidence(view: &View, args: &LabArgs) -> Result<()> {
    let Some(dir) = &args.capture_dir else {
        return Ok(());
    };
    let dir = dir.display();
    view.note(&format!(
        "each observer's evidence is in {dir}/NODE/ (NODE: gpu, cp1, cp2): open it in Wireshark, or count it again with observer replay {dir}/gpu/*.pcapng"
    ))
}

/// The write-up, from what the pings, the probes and the observers said.
fn summarize(
    view: &View,
    scenario: scenarios::Scenario,
    pings: &[traffic::PingResult],
    runs: &[probes::NodeProbe],
    observers: &Observers,
    counters: &[topology::RuleCounts],
) -> Result<()> {
    let facts = report::facts(&observers.lines, counters);
    view.summary(&Summary {
        scenario,
        pings,
        probes: runs
            .iter()
            .map(|r| (r.command.as_str(), r.lines.as_slice()))
            .collect(),
        facts: &facts,
        nodes: (0..NODES.len())
            .map(|i| (observers.command(i), observers.lines[i].as_slice()))
            .collect(),
    })
}

/// `--probe`: `observer probe` on every node at once instead of the
/// pings, while the observers watch; then the write-up with the probes'
/// results.
fn probe_run(
    args: LabArgs,
    mut lab: Cleanup,
    names: Names,
    ipip: topology::IpipKind,
    mut observers: Observers,
    mut view: View,
    backstop: Duration,
) -> Result<()> {
    let mut runs = probes::start(&mut lab, &names.nodes, &tunnel_args(ipip))?;
    view.traffic_started();
    view.note("observer probe on gpu, cp1 and cp2 at once, in place of the pings")?;
    view.lab_line(
        &json!({"fact": "probe", "commands": runs.iter().map(|r| &r.command).collect::<Vec<_>>()}),
    )?;
    probes::finish(&mut lab, &mut runs, || observers.pump(&mut view), backstop)?;
    // The probes' last answers reach the observers' counters.
    let linger = Instant::now() + PING_LINGER;
    while Instant::now() < linger {
        observers.pump(&mut view)?;
    }
    observers.stop(&mut lab);
    observers.wait_end(&mut lab, &mut view, TRAFFIC_SLACK)?;
    note_evidence(&view, &args)?;
    let counters = rule_counters(&names)?;
    drop(lab);
    summarize(&view, args.scenario, &[], &runs, &observers, &counters)
}

/// The arguments that declare the lab's userspace tunl0 (on a kernel
/// without IPIP) to the observers and the probes.
/// With `--textfile-dir`, how much longer the observers run after the
/// traffic: a scraper every second then holds their final counts before
/// each observer removes its file on exit.
fn scrape_grace(args: &LabArgs) -> Duration {
    if args.textfile_dir.is_some() {
        Duration::from_secs(3)
    } else {
        Duration::ZERO
    }
}

fn tunnel_args(ipip: topology::IpipKind) -> Vec<String> {
    match ipip {
        topology::IpipKind::Userspace => vec!["--tunnel-device".into(), "tunl0=ipip".into()],
        topology::IpipKind::Kernel => Vec::new(),
    }
}

/// Refuses to start without root or without the tools `scenario` runs.
fn preflight(scenario: scenarios::Scenario) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "observer lab must run as root: it creates network namespaces, devices and \
             iptables rules and loads eBPF programs (try: sudo observer lab)"
        );
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let bgp: &[(&str, &str)] = if scenario.is_bgp() { &BGP_TOOLS } else { &[] };
    for &(tool, package) in TOOLS.iter().chain(bgp) {
        if !std::env::split_paths(&path).any(|dir| is_executable(&dir.join(tool))) {
            bail!(
                "{tool} is not installed (or not on PATH): the lab needs it; install the Debian \
                 package {package} (apt-get install {package})"
            );
        }
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
