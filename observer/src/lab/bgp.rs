//! The BGP scenarios (`bgp-down`, `new-node`, `stale-route`): Calico's BGP mode without
//! encapsulation rebuilt in namespaces ([`super::mesh`]): four nodes in a
//! full iBGP mesh, each with its own BIRD; a pod address on each node
//! pings a pod of n4, and n1's pings n2's as a control. `bgp-down`: BIRD
//! stops on n4 (`birdc down`), its peers lose n4's block and the pings to
//! it die; BIRD starts again and the routes return. `new-node`: n1's
//! import filter rejects the block of n4, the newest node, from the start.
//! `stale-route`: n4 leaves, n1 keeps a route to its old block.
//! This binary observes every node, reading its BIRD's control socket;
//! the facts ([`super::bgp_facts`]) are what each observer raised and
//! cleared, for which peer and block, how long the outages lasted, and
//! each node's verdict per node pair.

use std::time::{Duration, Instant};

use super::bird::Bird;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    bgp_facts::{self, PingCount},
    cleanup::{Cleanup, PREFIX},
    mesh::{self, DOWN, FILTERING, MESH, SETTLE},
    observers::{ObserverSpec, Observers, Outputs},
    probes,
    shell::run_tool,
    topology::{IpipKind, UNDERLAY},
    traffic::{self, Ping},
    view::View,
};
use crate::{
    cli::{LabArgs, Scenario},
    report::lab as render,
};

/// Traffic before BIRD stops and after every anomaly cleared.
const STEADY: Duration = Duration::from_secs(3);
/// Echo requests per ping: more than the run sends; the pings are ended
/// with SIGINT, on which ping prints its summary.
const PING_COUNT: u64 = 1_000_000;

/// Runs the BGP scenario `args.scenario`: build, BIRD, observe, the
/// scenario's event, report, remove.
pub fn run(args: &LabArgs) -> Result<()> {
    let scenario = args.scenario;
    let pid = std::process::id();
    let mut view = View::new(
        args.output,
        MESH.iter().map(|m| m.name.to_string()).collect(),
    );
    let names: Vec<String> = MESH
        .iter()
        .map(|m| format!("{PREFIX}{pid}-{}", m.name))
        .collect();
    let switch = format!("{PREFIX}{pid}-switch");
    let mut lab = Cleanup::default();
    view.note_scenario(scenario)?;
    let encap = args.bgp_encap;
    let ipip = mesh::build(&mut lab, &names, &switch, encap)?;
    // Dropped before `lab`, which deletes the namespaces: BIRD first.
    let birds = mesh::start_birds(&names, scenario, encap)?;
    mesh::wait_up(&names, &birds, scenario)?;
    view.note(&format!(
        "mesh up: {} nodes on {switch}'s bridge, each with its BIRD (AS 64512, full mesh, hold 6 s) announcing its /26 and installing the others' with proto bird{}",
        MESH.len(),
        match ipip {
            None => " (direct routing)".to_string(),
            Some(IpipKind::Kernel) => " via tunl0 onlink (IPIP, the kernel's tunnel)".to_string(),
            Some(IpipKind::Userspace) => " via tunl0 onlink (IPIP; this kernel has no IPIP, so a userspace tunnel on a TUN device sends the same packets, and the observers are told so with --tunnel-device tunl0=ipip)".to_string(),
        }
    ))?;
    let mut namespaces: serde_json::Map<String, Value> = MESH
        .iter()
        .zip(&names)
        .map(|(m, ns)| (m.name.to_string(), json!(ns)))
        .collect();
    namespaces.insert("switch".into(), json!(switch));
    view.lab_line(&json!({
        "fact": "start",
        "scenario": scenario.name(),
        "about": scenario.about(),
        "namespaces": namespaces,
        "bird_sockets": birds.iter().map(|b| b.socket().display().to_string()).collect::<Vec<_>>(),
        "mesh": MESH.iter().enumerate().map(|(i, m)| json!({
            "node": m.name, "addr": m.addr, "block": m.block, "pod": m.pod,
            "rejects": mesh::rejects(scenario, i),
        })).collect::<Vec<_>>(),
        "duration_ms": args.duration.as_millis() as u64,
        "bgp_encap": encap.name(),
        "ipip": ipip,
    }))?;

    let mut observer_args = Vec::new();
    if ipip == Some(IpipKind::Userspace) {
        observer_args.extend(["--tunnel-device".to_string(), "tunl0=ipip".to_string()]);
    }
    let specs: Vec<ObserverSpec> = MESH
        .iter()
        .zip(&names)
        .zip(&birds)
        .map(|((m, ns), bird)| ObserverSpec {
            node: m.name.to_string(),
            namespace: ns.clone(),
            args: [
                vec!["--bird-socket".into(), bird.socket().display().to_string()],
                observer_args.clone(),
            ]
            .concat(),
        })
        .collect();
    let backstop = args.duration * 4 + SETTLE * 3;
    let mut observers = Observers::spawn(&mut lab, &specs, backstop, Outputs::of(args))?;
    view.note("observers starting on n1..n4 (observer diagnose ... --bird-socket ... eth0)")?;
    observers.wait_ready(&mut view, args.attach_timeout)?;

    let pings = start_pings(&mut lab, &names, scenario)?;
    pump_for(&mut observers, &mut view, STEADY)?;
    let headline = match scenario {
        Scenario::NewNode => filtered(&mut observers, &mut view, args)?,
        Scenario::StaleRoute => left(&mut observers, &mut view, &birds, &names, args)?,
        _ => outage(&mut observers, &mut view, &birds, args)?,
    };
    pump_for(&mut observers, &mut view, STEADY)?;

    let counts = stop_pings(&mut lab, pings)?;
    observers.stop(&mut lab);
    observers.wait_end(&mut lab, &mut view, SETTLE)?;
    // Over IPIP, the decisive experiment on every node too (with the
    // observers stopped, so the counts stay the pings'); direct routing
    // has no tunnel to probe.
    let mut runs = Vec::new();
    // A node that left the mesh (stale-route) has no peer left to probe.
    let probed: Vec<usize> = (0..MESH.len())
        .filter(|&i| !(scenario == Scenario::StaleRoute && i == DOWN))
        .collect();
    if ipip.is_some() {
        view.note("observer probe on every node of the mesh at once")?;
        let namespaces: Vec<String> = probed.iter().map(|&i| names[i].clone()).collect();
        runs = probes::run(&mut lab, &namespaces, &observer_args, SETTLE * 3)?;
    }
    drop(birds);
    drop(lab);

    let facts = bgp_facts::facts(&observers.lines, &counts);
    let findings = bgp_facts::findings(&facts);
    for fact in &facts {
        view.lab_line(fact)?;
    }
    view.lab_line(&json!({
        "fact": "diagnosis",
        "scenario": scenario.name(),
        "findings": findings,
    }))?;
    view.text("")?;
    view.text(&headline)?;
    view.text(&render::bgp_write_up(&scenario.name(), &findings))?;
    for (i, member) in MESH.iter().enumerate() {
        view.text(&format!(
            "\n== {} {} — {}",
            member.name,
            member.addr,
            observers.command(i)
        ))?;
        view.text(
            render::node_writeup(&observers.lines[i])
                .unwrap_or("  (no diagnosis: the observer ended without one)")
                .trim_end(),
        )?;
    }
    for (&i, run) in probed.iter().zip(&runs) {
        let member = &MESH[i];
        view.text(&format!(
            "\n== probes from {} {} — {}",
            member.name, member.addr, run.command
        ))?;
        view.text(&render::probes_text(&run.lines))?;
        view.probe_lines(i, &run.lines)?;
    }
    Ok(())
}

/// `bgp-down`: n4's BIRD stops for `--duration` (and at least until every
/// other node's observer named the outage), starts again, and the run
/// goes on until every anomaly cleared. Returns the headline.
fn outage(
    observers: &mut Observers,
    view: &mut View,
    birds: &[Bird],
    args: &LabArgs,
) -> Result<String> {
    let down = &MESH[DOWN];
    view.note(&format!("stopping BIRD on {} (birdc down)", down.name))?;
    birds[DOWN].stop();
    let stopped = Instant::now();
    view.lab_line(&json!({"fact": "bird_stopped", "node": down.name}))?;
    let named = |lines: &[Vec<Value>]| {
        (0..MESH.len()).filter(|i| *i != DOWN).all(|i| {
            ["bgp_down", "route_missing"]
                .iter()
                .all(|kind| bgp_facts::has(&lines[i], kind, down.addr, "raised"))
        })
    };
    pump_until(observers, view, args.duration + SETTLE, |lines| {
        stopped.elapsed() >= args.duration && named(lines)
    })
    .with_context(|| {
        format!(
            "the other nodes did not all name the outage (bgp_down and route_missing for {}) within {:?}",
            down.addr,
            args.duration + SETTLE
        )
    })?;

    view.note(&format!("starting BIRD on {} again", down.name))?;
    birds[DOWN]
        .restart()
        .map_err(|e| anyhow::anyhow!("restarting BIRD on {}: {e}", down.name))?;
    let down_for = stopped.elapsed();
    view.lab_line(&json!({
        "fact": "bird_started",
        "node": down.name,
        "down_ms": down_for.as_millis() as u64,
    }))?;
    pump_until(observers, view, SETTLE, |lines| {
        lines
            .iter()
            .all(|node| bgp_facts::anomalies(node).iter().all(|a| a.cleared))
    })
    .context("the anomalies did not all clear once BIRD was back")?;
    Ok(format!(
        "BIRD on {} {} was down for {:.1} s (birdc down, then started again).",
        down.name,
        down.addr,
        down_for.as_secs_f64()
    ))
}

/// `stale-route`: n4 leaves (n1..n3 drop it from their BIRD configs, its
/// BIRD stops, its link goes down) but n1 keeps a route to its old block
/// (`proto bird`, as a BIRD that was killed leaves its routes behind);
/// runs `--duration` more, and at least until n1's observer named it.
/// Returns the headline.
fn left(
    observers: &mut Observers,
    view: &mut View,
    birds: &[Bird],
    names: &[String],
    args: &LabArgs,
) -> Result<String> {
    let (keeper, gone) = (&MESH[FILTERING], &MESH[DOWN]);
    view.note(&format!(
        "{} leaves: the others drop it from their BIRD configs, its BIRD stops, its link goes down",
        gone.name
    ))?;
    for (i, bird) in birds.iter().enumerate().filter(|(i, _)| *i != DOWN) {
        bird.reconfigure(&mesh::mesh_node(i, args.scenario, args.bgp_encap, &[DOWN]))
            .map_err(|e| anyhow::anyhow!("reconfiguring BIRD on {}: {e}", MESH[i].name))?;
    }
    birds[DOWN].stop();
    run_tool("ip", &["-n", &names[DOWN], "link", "set", UNDERLAY, "down"])?;
    // BIRD withdraws n4's block everywhere; then n1 gets its leftover.
    let block = gone.block.to_string();
    let deadline = Instant::now() + SETTLE;
    while !run_tool("ip", &["-n", &names[FILTERING], "route", "show", &block])?
        .trim()
        .is_empty()
    {
        if Instant::now() >= deadline {
            bail!(
                "{}'s BIRD did not withdraw {block} within {SETTLE:?}",
                keeper.name
            );
        }
        observers.pump(view)?;
    }
    let gateway = gone.addr.to_string();
    run_tool(
        "ip",
        &[
            "-n",
            &names[FILTERING],
            "route",
            "add",
            &block,
            "via",
            &gateway,
            "dev",
            UNDERLAY,
            "proto",
            "bird",
        ],
    )?;
    view.note(&format!(
        "{} keeps a route to {block} via {gateway} (proto bird)",
        keeper.name
    ))?;
    view.lab_line(&json!({"fact": "left", "node": gone.name, "kept_by": keeper.name, "route": format!("{block} via {gateway}")}))?;
    let start = Instant::now();
    pump_until(observers, view, args.duration + SETTLE, |lines| {
        start.elapsed() >= args.duration
            && bgp_facts::has(&lines[FILTERING], "stale_route", gone.addr, "raised")
    })
    .with_context(|| {
        format!(
            "{}'s observer did not name stale_route for {} within {:?}",
            keeper.name,
            gone.addr,
            args.duration + SETTLE
        )
    })?;
    Ok(format!(
        "{} {} left the cluster; {} kept a route to its block {block} via {gateway}.",
        gone.name, gone.addr, keeper.name
    ))
}

/// `new-node`: runs `--duration`, and at least until the filtering
/// node's observer named the block it never routes. Returns the headline.
fn filtered(observers: &mut Observers, view: &mut View, args: &LabArgs) -> Result<String> {
    let (filtering, newest) = (&MESH[FILTERING], &MESH[DOWN]);
    let start = Instant::now();
    pump_until(observers, view, args.duration + SETTLE, |lines| {
        start.elapsed() >= args.duration
            && bgp_facts::has(&lines[FILTERING], "route_missing", newest.addr, "raised")
    })
    .with_context(|| {
        format!(
            "{}'s observer did not name route_missing for {} within {:?}",
            filtering.name,
            newest.addr,
            args.duration + SETTLE
        )
    })?;
    Ok(format!(
        "{}'s BIRD import filter rejects {} ({} {}'s block); the other nodes route it.",
        filtering.name, newest.block, newest.name, newest.addr
    ))
}

/// A ping running in the lab: its child, and what it is.
struct RunningPing {
    child: usize,
    from: usize,
    to: usize,
}

/// Pings from every other node's pod to n4's, from n4's to n1's, and
/// n1's to n2's (a pair neither scenario touches). In `new-node` n1 has
/// no route to n4's pods at all (ping would refuse to start): n4's pings
/// to n1 show it, their replies have no way back.
fn start_pings(
    lab: &mut Cleanup,
    names: &[String],
    scenario: Scenario,
) -> Result<Vec<RunningPing>> {
    let mut pairs: Vec<(usize, usize)> = (0..MESH.len())
        .filter(|i| *i != DOWN)
        .filter(|i| !(scenario == Scenario::NewNode && *i == FILTERING))
        .map(|i| (i, DOWN))
        .collect();
    pairs.extend([(DOWN, 0), (0, 1)]);
    pairs
        .into_iter()
        .map(|(from, to)| {
            let ping = Ping {
                namespace: &names[from],
                src: MESH[from].pod,
                dst: MESH[to].pod,
                size: 56,
                count: PING_COUNT,
            };
            let what = format!("ping {} -> {}", MESH[from].name, MESH[to].name);
            Ok(RunningPing {
                child: ping.spawn(lab, &what)?,
                from,
                to,
            })
        })
        .collect()
}

/// Ends the pings (SIGINT: ping prints its summary) and reads them.
fn stop_pings(lab: &mut Cleanup, pings: Vec<RunningPing>) -> Result<Vec<PingCount>> {
    for ping in &pings {
        let pid = lab.child(ping.child).id();
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    pings
        .into_iter()
        .map(|ping| {
            let (from, to) = (&MESH[ping.from], &MESH[ping.to]);
            let what = format!("ping {} -> {}", from.name, to.name);
            let (transmitted, received) = traffic::ended(lab, ping.child, &what, deadline)?;
            Ok(PingCount {
                from: from.name,
                to: to.name,
                src: from.pod,
                dst: to.pod,
                transmitted,
                received,
            })
        })
        .collect()
}

/// Passes the observers' lines to the view for `span`.
fn pump_for(observers: &mut Observers, view: &mut View, span: Duration) -> Result<()> {
    let end = Instant::now() + span;
    while Instant::now() < end {
        observers.pump(view)?;
    }
    Ok(())
}

/// Passes the observers' lines to the view until `done(lines)`, at most
/// `timeout`.
fn pump_until(
    observers: &mut Observers,
    view: &mut View,
    timeout: Duration,
    done: impl Fn(&[Vec<Value>]) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done(&observers.lines) {
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?}");
        }
        observers.pump(view)?;
    }
    Ok(())
}
