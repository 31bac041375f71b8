//! The probe engine (`observer probe`, `attach --probe-interval`,
//! `diagnose --probe`): from the data plane, works out the (peer,
//! encapsulation) pairs, sends their probes paced at the run's rate,
//! matches the answers the listener sees, and climbs each answered pair's
//! size ladder.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};
use observer_common::Proto;

use crate::{
    model::{
        dataplane::DataPlane,
        ports::{PortArray, PortConfig},
        probe::{
            self, Arrival, BASE_INNER, Encap, Ladder, LocalEnd, MAX_ARRIVALS, Outcome, ProbeId,
            Run, Seen, Target,
        },
    },
    node::{self, allowsets::AllowSetConfig, probe::Listener, probe::Sender},
};

/// How often and how much to probe.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Peers named (empty: every node of the view).
    pub peers: Vec<Ipv4Addr>,
    /// Encapsulations to add to the routes' own.
    pub encaps: Vec<Encap>,
    /// Reachability probes per pair.
    pub count: u32,
    /// Probes per second for the whole run.
    pub rate: u32,
    /// Wait for answers after a round's last probe.
    pub timeout: Duration,
    /// Whether to climb the size ladder.
    pub ladder: bool,
}

impl Default for Settings {
    /// Every node of the view, the routes' encapsulations, probe's default
    /// bounds, with the ladder (`attach --probe-interval`, `diagnose
    /// --probe`).
    fn default() -> Settings {
        Settings {
            peers: Vec::new(),
            encaps: Vec::new(),
            count: probe::DEFAULT_COUNT,
            rate: probe::DEFAULT_RATE,
            timeout: probe::DEFAULT_TIMEOUT,
            ladder: true,
        }
    }
}

/// The address and MAC of each tunnel device of `view`, by index (only
/// those: a node may have hundreds of other links).
fn local_ends(view: &DataPlane) -> HashMap<u32, LocalEnd> {
    view.devices
        .iter()
        .map(|device| {
            let addr = view.addresses.iter().find_map(|a| match a.addr {
                IpAddr::V4(v4) if a.ifindex == device.ifindex => Some(v4),
                _ => None,
            });
            let mac = node::probe::mac_of(&device.name);
            (device.ifindex, LocalEnd { addr, mac })
        })
        .collect()
}

/// Probes what `settings` and `view` say, once.
pub fn probe_once(view: &DataPlane, settings: &Settings) -> Result<Run> {
    let at = SystemTime::now();
    let ends = local_ends(view);
    let plan = probe::plan(
        view,
        |ifindex| {
            ends.get(&ifindex).copied().unwrap_or(LocalEnd {
                addr: None,
                mac: None,
            })
        },
        &settings.peers,
        &settings.encaps,
    );
    if plan.targets.is_empty() && plan.skipped.is_empty() {
        bail!(
            "nothing to probe: no tunnel route of this node leads to a peer node; name a peer \
             (observer probe 10.0.0.2 --encap ipip)"
        );
    }
    let mut ports = PortConfig::default();
    for target in &plan.targets {
        match target.encap {
            Encap::Vxlan { port } => ports.vxlan.push(port),
            Encap::Geneve { port } => ports.geneve.push(port),
            // Answered with ICMP, which the listener takes anyway.
            Encap::Ipip | Encap::Udp { .. } => {}
        }
    }
    let table = PortArray::new(&ports).map_err(anyhow::Error::msg)?;
    let udp_ports: Vec<u16> = ports.vxlan.iter().chain(&ports.geneve).copied().collect();
    let sender = Sender::open()?;
    let listener = Listener::open(&udp_ports)?;
    let mut sources = Vec::with_capacity(plan.targets.len());
    for target in &plan.targets {
        sources.push(node::probe::source_toward(target.peer)?);
    }
    // What arrives on a tunnel device was decapsulated already (its
    // encapsulated copy came in on the underlay first): not read twice.
    let tunnel_devices: BTreeSet<u32> = view.devices.iter().map(|d| d.ifindex).collect();
    let nodes: BTreeSet<IpAddr> = view.expected_peers().into_keys().collect();

    let mut prober = Prober {
        view,
        sender,
        listener,
        ports: table,
        tunnel_devices,
        // Any identifier is as good; the process id keeps two concurrent
        // runs on one node apart.
        id: std::process::id() as u16,
        next_seq: 0,
        pending: HashMap::new(),
        pace: Duration::from_secs(1) / settings.rate,
        next_send: Instant::now(),
        answers: Vec::new(),
        arrivals: BTreeMap::new(),
        arrivals_overflow: 0,
        sent: 0,
    };

    // Reachability: `count` rounds over every pair, paced.
    let mut outcomes: Vec<Outcome> = plan
        .targets
        .iter()
        .map(|target| Outcome {
            target: target.clone(),
            sent: 0,
            answered: 0,
            rtts: Vec::new(),
            sources: BTreeMap::new(),
            max_size: None,
            ladder_sent: 0,
            peer_arrivals: 0,
            refused: BTreeMap::new(),
        })
        .collect();
    // Listen first, for as long as an answer may take: the peers' own
    // tunnel packets (probes of a peer probing at the same time included)
    // are then seen from the start.
    prober.listen_until(Instant::now() + settings.timeout)?;
    for _ in 0..settings.count {
        for (index, target) in plan.targets.iter().enumerate() {
            if prober.send(target, sources[index], index, BASE_INNER)? {
                outcomes[index].sent += 1;
            }
        }
    }
    prober.settle(settings.timeout)?;
    for answer in prober.answers.drain(..) {
        let outcome = &mut outcomes[answer.target];
        outcome.answered += 1;
        outcome.rtts.push(answer.rtt);
        *outcome
            .sources
            .entry((answer.from, answer.proto))
            .or_default() += 1;
    }

    // The size ladder: one probe per answered pair and round, bisecting.
    if settings.ladder {
        let mut ladders: Vec<Option<Ladder>> = outcomes
            .iter()
            .map(|o| {
                (o.answered > 0 && o.target.encap.has_ladder())
                    .then(|| Ladder::new(BASE_INNER, o.target.max_inner()))
            })
            .collect();
        loop {
            let mut round = Vec::new();
            for (index, ladder) in ladders.iter().enumerate() {
                if let Some(size) = ladder.as_ref().and_then(Ladder::next) {
                    let sent = prober.send(&plan.targets[index], sources[index], index, size)?;
                    outcomes[index].ladder_sent += u32::from(sent);
                    round.push((index, size));
                }
            }
            if round.is_empty() {
                break;
            }
            prober.settle(settings.timeout)?;
            let answered: BTreeSet<usize> = prober.answers.drain(..).map(|a| a.target).collect();
            for (index, size) in round {
                if let Some(ladder) = &mut ladders[index] {
                    ladder.record(size, answered.contains(&index));
                }
            }
        }
        for (outcome, ladder) in outcomes.iter_mut().zip(&ladders) {
            if let Some(ladder) = ladder {
                outcome.max_size = Some(ladder.largest());
            }
        }
    }

    // What this node's firewall does to what arrived: Calico's allow-sets,
    // read once the run is over (packets from a refused source reached
    // the wire and died here).
    let allow = node::allowsets::read(&AllowSetConfig::default());
    for outcome in &mut outcomes {
        let peer = IpAddr::V4(outcome.target.peer);
        let proto = outcome.target.encap.proto();
        outcome.peer_arrivals = prober
            .arrivals
            .iter()
            .filter(|(a, _)| a.node == peer && a.proto == proto)
            .map(|(_, packets)| packets)
            .sum();
        outcome.refused = outcome
            .sources
            .keys()
            .filter_map(|&(from, proto)| Some((from, probe::refusing_set(&allow, proto, from)?)))
            .collect();
    }
    let refused = prober
        .arrivals
        .keys()
        .filter_map(|a| {
            let sets = probe::refusing_set(&allow, a.proto, a.arrived_from)?;
            Some(((a.proto, a.arrived_from), sets))
        })
        .collect();
    Ok(Run {
        at,
        outcomes,
        skipped: plan.skipped,
        arrivals: prober.arrivals,
        arrivals_overflow: prober.arrivals_overflow,
        nodes,
        refused,
        sent: prober.sent,
        listener_drops: prober.listener.drops(),
    })
}

/// An answer matched to its probe.
struct Answer {
    target: usize,
    rtt: Duration,
    from: IpAddr,
    proto: Proto,
}

/// The sending and receiving state of one run.
struct Prober<'a> {
    view: &'a DataPlane,
    sender: Sender,
    listener: Listener,
    ports: PortArray,
    tunnel_devices: BTreeSet<u32>,
    id: u16,
    next_seq: u16,
    /// Probes sent and not yet answered: sequence -> (pair, sent at).
    pending: HashMap<u16, (usize, Instant)>,
    pace: Duration,
    next_send: Instant,
    answers: Vec<Answer>,
    arrivals: BTreeMap<Arrival, u64>,
    arrivals_overflow: u64,
    sent: u64,
}

impl Prober<'_> {
    /// Sends one probe of `size` to `target` (pair `index`) at the next
    /// paced instant, reading what arrives meanwhile. Returns false when
    /// the kernel refused it as larger than the interface's MTU.
    fn send(&mut self, target: &Target, src: Ipv4Addr, index: usize, size: u32) -> Result<bool> {
        self.listen_until(self.next_send)?;
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let packet = probe::packet(target, src, ProbeId { id: self.id, seq }, size);
        let now = Instant::now();
        let sent = self.sender.send(&packet, target.peer);
        // Paced from when the kernel took it, so that a send that took
        // long does not bring the next one closer on the wire.
        self.next_send = Instant::now() + self.pace;
        match sent {
            Ok(()) => {
                self.pending.insert(seq, (index, now));
                self.sent += 1;
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Ok(false),
            Err(e) => Err(e)
                .with_context(|| format!("sending a {} probe to {}", target.encap, target.peer)),
        }
    }

    /// Reads until every probe sent is answered or `timeout` has passed
    /// since the last one; the unanswered ones are forgotten.
    fn settle(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.pending.is_empty() && Instant::now() < deadline {
            self.listen_until(deadline.min(Instant::now() + Duration::from_millis(20)))?;
        }
        self.pending.clear();
        Ok(())
    }

    /// Reads frames until `until`.
    fn listen_until(&mut self, until: Instant) -> Result<()> {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Some(received) = self.listener.recv(left)? else {
                return Ok(());
            };
            let at = Instant::now();
            if self.tunnel_devices.contains(&received.ifindex) {
                continue;
            }
            match probe::read_frame(received.frame, &self.ports, self.id) {
                Some(Seen::Answer { seq, from, proto }) => {
                    if let Some((target, sent_at)) = self.pending.remove(&seq) {
                        self.answers.push(Answer {
                            target,
                            rtt: at - sent_at,
                            from,
                            proto,
                        });
                    }
                }
                Some(seen @ Seen::Tunnel { .. }) => {
                    if let Some(fact) = probe::arrival(self.view, &seen) {
                        // The outer source is the sender's to choose:
                        // bounded, the rest counted.
                        let room = self.arrivals.len() < MAX_ARRIVALS;
                        match self.arrivals.get_mut(&fact) {
                            Some(packets) => *packets += 1,
                            None if room => {
                                self.arrivals.insert(fact, 1);
                            }
                            None => self.arrivals_overflow += 1,
                        }
                    }
                }
                None => {}
            }
            if left.is_zero() {
                return Ok(());
            }
        }
    }
}
