//! What `observer probe` prints: a `probe` line per (peer, encapsulation),
//! `probe_skipped` and `probe_arrival` lines, and a `probe_summary` with
//! the conclusion in words; or the same as a table and a paragraph.

use std::{
    collections::BTreeMap,
    io::{self, Write},
    net::IpAddr,
};

use observer_common::Proto;

use crate::{
    model::probe::{Finding, Outcome, Rtt, Run},
    report::lines::{AnswerSource, ArrivalLine, Line, ProbeLine, SummaryLine, write_line},
    report::view::timestamp,
};

fn findings(run: &Run, outcome: &Outcome) -> Vec<Finding> {
    outcome.findings(|addr| run.nodes.contains(&addr))
}

fn verdict(findings: &[Finding]) -> &'static str {
    match findings.first() {
        None => "ok",
        Some(Finding::Unanswered) => "unanswered",
        Some(Finding::OneWay { .. }) => "one_way",
        Some(Finding::Loss { .. }) => "loss",
        Some(Finding::AnswerSource { .. }) => "answer_source",
        Some(Finding::NotEncapsulated) => "not_encapsulated",
        Some(Finding::DroppedHere { .. }) => "dropped_here",
        Some(Finding::DeviceMtuTooBig { .. }) => "device_mtu_too_big",
    }
}

/// Writes the run as JSON lines.
pub fn write_json(out: &mut impl Write, run: &Run) -> io::Result<()> {
    let ts = timestamp(run.at);
    for outcome in &run.outcomes {
        let findings = findings(run, outcome);
        write_line(
            out,
            &Line::Probe(ProbeLine {
                ts: &ts,
                peer: IpAddr::V4(outcome.target.peer),
                encap: outcome.target.encap,
                device: &outcome.target.device,
                sent: outcome.sent,
                answered: outcome.answered,
                rtt: Rtt::of(&outcome.rtts),
                answer_sources: outcome
                    .sources
                    .iter()
                    .map(|(&(from, proto), &answers)| AnswerSource {
                        from,
                        proto,
                        answers,
                    })
                    .collect(),
                max_size: outcome.max_size,
                device_mtu: outcome.target.device_mtu,
                ladder_sent: outcome.ladder_sent,
                verdict: verdict(&findings),
                findings,
            }),
        )?;
    }
    for skipped in &run.skipped {
        write_line(out, &Line::ProbeSkipped(skipped))?;
    }
    for (fact, &packets) in &run.arrivals {
        write_line(
            out,
            &Line::ProbeArrival(ArrivalLine {
                ts: &ts,
                fact,
                refused_by: run
                    .refused
                    .get(&(fact.proto, fact.arrived_from))
                    .map(String::as_str),
                rewritten: fact.rewritten(),
                from_a_node: run.nodes.contains(&fact.arrived_from),
                packets,
            }),
        )?;
    }
    let conclusion = conclusion(run);
    write_line(
        out,
        &Line::ProbeSummary(SummaryLine {
            ts: &ts,
            pairs: run.outcomes.len(),
            pairs_with_findings: run
                .outcomes
                .iter()
                .filter(|o| !findings(run, o).is_empty())
                .count(),
            skipped: run.skipped.len(),
            probes_sent: run.sent,
            listener_drops: run.listener_drops,
            arrivals_overflow: run.arrivals_overflow,
            healthy: run.healthy(),
            conclusion: &conclusion,
        }),
    )
}

/// Writes the run as a table and the conclusion.
pub fn write_table(out: &mut impl Write, run: &Run) -> io::Result<()> {
    writeln!(
        out,
        "{:<16} {:<11} {:>8} {:>22} {:<24} {:>11}  VERDICT",
        "PEER", "ENCAP", "ANSWERED", "RTT MIN/AVG/MAX ms", "ANSWER FROM", "SIZE/MTU"
    )?;
    for outcome in &run.outcomes {
        let findings = findings(run, outcome);
        let rtt = Rtt::of(&outcome.rtts).map_or("-".to_string(), |r| {
            format!("{:.2}/{:.2}/{:.2}", r.min_ms, r.avg_ms, r.max_ms)
        });
        let from = outcome
            .sources
            .keys()
            .map(|(from, proto)| match proto {
                Proto::Other => format!("{from} (plain)"),
                _ => from.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "{:<16} {:<11} {:>8} {:>22} {:<24} {:>11}  {}",
            outcome.target.peer.to_string(),
            outcome.target.encap.to_string(),
            format!("{}/{}", outcome.answered, outcome.sent),
            rtt,
            if from.is_empty() { "-".into() } else { from },
            format!(
                "{}/{}",
                outcome.max_size.map_or("-".into(), |s| s.to_string()),
                outcome.target.device_mtu
            ),
            verdict(&findings)
        )?;
    }
    for skipped in &run.skipped {
        writeln!(
            out,
            "{:<16} {:<11} not probed: {}",
            skipped.peer.to_string(),
            skipped.encap.to_string(),
            skipped.why
        )?;
    }
    writeln!(out)?;
    writeln!(out, "{}", conclusion(run))
}

/// How an encapsulation is named in prose.
fn prose(proto: Proto) -> &'static str {
    match proto {
        Proto::Vxlan => "VXLAN",
        Proto::Geneve => "Geneve",
        Proto::Ipip => "IPIP",
        other => other.name(),
    }
}

/// What `addr` is, for a sentence: "which is no node" or "which is node X".
fn who(run: &Run, addr: IpAddr) -> &'static str {
    if run.nodes.contains(&addr) {
        "which is another node"
    } else {
        "which is no node"
    }
}

/// The conclusion in the incident's terms: per peer what answered and
/// what not, from where and how big, then the rewritten sources.
pub fn conclusion(run: &Run) -> String {
    let mut sentences: Vec<String> = Vec::new();
    let mut by_peer: BTreeMap<IpAddr, Vec<&Outcome>> = BTreeMap::new();
    for outcome in &run.outcomes {
        by_peer
            .entry(IpAddr::V4(outcome.target.peer))
            .or_default()
            .push(outcome);
    }
    // Peers whose every pair is healthy are named together at the end.
    let mut fine: Vec<String> = Vec::new();
    let mut fine_measured = true;
    for (peer, outcomes) in &by_peer {
        let findings: Vec<Vec<Finding>> = outcomes.iter().map(|o| findings(run, o)).collect();
        if findings.iter().all(Vec::is_empty) {
            let encaps: Vec<String> = outcomes.iter().map(|o| o.target.encap.prose()).collect();
            fine.push(format!("{peer} ({})", encaps.join(", ")));
            fine_measured &= outcomes.iter().all(|o| o.max_size.is_some());
            continue;
        }
        let parts: Vec<String> = outcomes
            .iter()
            .zip(&findings)
            .map(|(outcome, findings)| pair(run, *peer, outcome, findings))
            .collect();
        sentences.push(parts.join("; "));
        sentences.extend(contrast(*peer, outcomes));
    }
    sentences.extend(rewritten_sources(run));
    for skipped in &run.skipped {
        sentences.push(format!(
            "{} to {} not probed: {}",
            skipped.encap, skipped.peer, skipped.why
        ));
    }
    if !fine.is_empty() {
        sentences.push(format!(
            "{} answered from the peer's own address{}: {}",
            if sentences.is_empty() {
                "Every pair"
            } else {
                "Every other pair"
            },
            if fine_measured {
                ", up to the device MTU"
            } else {
                ""
            },
            fine.join(", ")
        ));
    }
    if sentences.is_empty() {
        return "Nothing was probed.".into();
    }
    sentences.join(". ") + "."
}

/// What one pair with findings did: answered or not, then each finding.
fn pair(run: &Run, peer: IpAddr, outcome: &Outcome, findings: &[Finding]) -> String {
    let name = outcome.target.encap.prose();
    let mut part = if outcome.answered == 0 {
        format!("{name} to {peer} unanswered ({} probes)", outcome.sent)
    } else if outcome.answered < outcome.sent {
        format!(
            "{name} to {peer} answered {} of {}",
            outcome.answered, outcome.sent
        )
    } else {
        format!("{name} to {peer} answered")
    };
    for finding in findings {
        part.push_str(&clause(run, outcome, finding));
    }
    if outcome.answered > 0 && findings.is_empty() {
        part.push_str(" from the peer's own address");
        if outcome.max_size.is_some() {
            part.push_str(", up to the device MTU");
        }
    }
    part
}

/// The words a finding adds to its pair's part (none for those the
/// answered count already says).
fn clause(run: &Run, outcome: &Outcome, finding: &Finding) -> String {
    let name = outcome.target.encap.prose();
    match finding {
        Finding::AnswerSource { from, .. } if !outcome.target.encap.has_ladder() => format!(
            ", but the port-unreachable came from {from}, {}: something on the \
             way rejects it",
            who(run, *from)
        ),
        Finding::AnswerSource { from, .. } => format!(
            ", but from {from}, {}: the answers are source-NATed on the way",
            who(run, *from)
        ),
        Finding::NotEncapsulated => ", but without encapsulation: the peer routes this node's \
                                     tunnel address plainly"
            .to_string(),
        Finding::DeviceMtuTooBig {
            max_size,
            device_mtu,
        } => format!(
            "; the path carries at most {max_size}-byte packets but {}'s MTU is \
             {device_mtu}: packets of {}-{device_mtu} bytes are lost (set the MTU \
             to {max_size})",
            outcome.target.device,
            max_size + 1
        ),
        Finding::DroppedHere { from, sets } => format!(
            ", but this node's allow-set {sets} refuses {from}: Calico drops the \
             answers here"
        ),
        Finding::OneWay { arrived } => format!(
            ", though {arrived} of the peer's own {name} packets arrived here: \
             the way from this node to the peer loses it (one way)"
        ),
        Finding::Unanswered | Finding::Loss { .. } => String::new(),
    }
}

/// The incident's decisive contrast: one encapsulation answered, another
/// not, on the same path.
fn contrast(peer: IpAddr, outcomes: &[&Outcome]) -> Option<String> {
    let answered: Vec<String> = outcomes
        .iter()
        .filter(|o| o.answered > 0)
        .map(|o| o.target.encap.prose())
        .collect();
    let silent: Vec<String> = outcomes
        .iter()
        .filter(|o| o.answered == 0)
        .map(|o| o.target.encap.prose())
        .collect();
    (!answered.is_empty() && !silent.is_empty()).then(|| {
        format!(
            "The path to {peer} carries {} but not {}: something on it filters or rewrites {}",
            answered.join(" and "),
            silent.join(" and "),
            silent.join(" and ")
        )
    })
}

/// One sentence per peer tunnel packet that arrived from another address
/// than its node's.
fn rewritten_sources(run: &Run) -> Vec<String> {
    run.arrivals
        .iter()
        .filter(|(a, _)| a.rewritten())
        .map(|(fact, packets)| {
            let udp = matches!(
                fact.proto,
                Proto::Vxlan | Proto::Geneve | Proto::VxlanGpe | Proto::Wireguard
            );
            let dropped = run.refused.get(&(fact.proto, fact.arrived_from)).map_or(
                String::new(),
                |sets| {
                    format!(
                        "; this node's allow-set {sets} refuses that source, so Calico drops them here"
                    )
                },
            );
            format!(
                "{} from {} arrives from {}, {} ({packets} packets{dropped}): {} is source-NATed on \
                 the way",
                prose(fact.proto),
                fact.node,
                fact.arrived_from,
                who(run, fact.arrived_from),
                if udp { "UDP" } else { prose(fact.proto) }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        net::Ipv4Addr,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::model::probe::{Arrival, Encap, Target};

    const GPU: Ipv4Addr = Ipv4Addr::new(10, 10, 10, 62);
    const CP1: Ipv4Addr = Ipv4Addr::new(10, 10, 60, 127);

    fn outcome(encap: Encap, answered: u32, from: Ipv4Addr, max_size: u32) -> Outcome {
        Outcome {
            target: Target {
                peer: CP1,
                encap,
                device: match encap {
                    Encap::Ipip => "tunl0".into(),
                    _ => "vxlan.calico".into(),
                },
                device_mtu: encap.overhead() + 1430,
                vni: 4096,
                inner_src: Ipv4Addr::new(10, 244, 0, 0),
                inner_dst: CP1,
                macs: None,
                underlay_mtu: 1500,
            },
            sent: 5,
            answered,
            rtts: vec![Duration::from_millis(1); answered as usize],
            sources: if answered > 0 {
                BTreeMap::from([((IpAddr::V4(from), encap.proto()), answered)])
            } else {
                BTreeMap::new()
            },
            max_size: (answered > 0).then_some(max_size),
            ladder_sent: 11,
            peer_arrivals: 0,
            refused: BTreeMap::new(),
        }
    }

    fn run(outcomes: Vec<Outcome>, arrivals: BTreeMap<Arrival, u64>) -> Run {
        Run {
            at: SystemTime::UNIX_EPOCH,
            outcomes,
            skipped: Vec::new(),
            arrivals,
            arrivals_overflow: 0,
            nodes: BTreeSet::from([IpAddr::V4(GPU), IpAddr::V4(CP1)]),
            refused: BTreeMap::new(),
            sent: 42,
            listener_drops: 0,
        }
    }

    #[test]
    fn the_incident_reads_as_the_incident() {
        let snat: IpAddr = "10.10.10.244".parse().unwrap();
        let mut run = run(
            vec![
                outcome(Encap::Vxlan { port: 4789 }, 0, CP1, 0),
                outcome(Encap::Ipip, 5, CP1, 1450),
            ],
            BTreeMap::from([(
                Arrival {
                    node: IpAddr::V4(CP1),
                    proto: Proto::Vxlan,
                    arrived_from: snat,
                },
                5,
            )]),
        );
        run.refused
            .insert((Proto::Vxlan, snat), "cali40all-vxlan-net".into());
        assert!(!run.healthy());
        assert_eq!(
            conclusion(&run),
            "VXLAN to 10.10.60.127 unanswered (5 probes); IPIP to 10.10.60.127 answered from the \
             peer's own address, up to the device MTU. The path to 10.10.60.127 \
             carries IPIP but not VXLAN: something on it filters or rewrites VXLAN. VXLAN from \
             10.10.60.127 arrives from 10.10.10.244, which is no node (5 packets; this node's \
             allow-set cali40all-vxlan-net refuses that source, so Calico drops them here): UDP \
             is source-NATed on the way."
        );
        let mut json = Vec::new();
        write_json(&mut json, &run).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(json)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["probe", "probe", "probe_arrival", "probe_summary"]);
        assert_eq!(lines[0]["encap"], "vxlan");
        assert_eq!(lines[0]["verdict"], "unanswered");
        assert_eq!(lines[0]["rtt"], serde_json::Value::Null);
        assert_eq!(lines[1]["answer_sources"][0]["from"], "10.10.60.127");
        assert_eq!(lines[1]["max_size"], 1450);
        assert_eq!(lines[2]["arrived_from"], "10.10.10.244");
        assert_eq!(lines[2]["from_node"], "10.10.60.127");
        assert_eq!(lines[2]["proto"], "vxlan");
        assert_eq!(lines[2]["from_a_node"], false);
        assert_eq!(lines[2]["rewritten"], true);
        assert_eq!(lines[2]["refused_by"], "cali40all-vxlan-net");
        assert_eq!(lines[3]["pairs_with_findings"], 1);
        assert_eq!(lines[3]["healthy"], false);
    }

    #[test]
    fn a_healthy_run_says_so_and_a_small_path_names_the_mtu_to_set() {
        let healthy_run = run(
            vec![
                outcome(Encap::Vxlan { port: 4789 }, 5, CP1, 1480),
                outcome(Encap::Ipip, 5, CP1, 1450),
            ],
            BTreeMap::new(),
        );
        assert!(healthy_run.healthy());
        assert_eq!(
            conclusion(&healthy_run),
            "Every pair answered from the peer's own address, up to the device MTU: \
             10.10.60.127 (VXLAN, IPIP)."
        );
        let small = run(
            vec![outcome(Encap::Vxlan { port: 4789 }, 5, GPU, 1350)],
            BTreeMap::new(),
        );
        let text = conclusion(&small);
        assert!(
            text.contains("but from 10.10.10.62, which is another node"),
            "{text}"
        );
        assert!(
            text.contains(
                "the path carries at most 1350-byte packets but vxlan.calico's MTU is 1480: \
                 packets of 1351-1480 bytes are lost (set the MTU to 1350)"
            ),
            "{text}"
        );
        let mut table = Vec::new();
        write_table(&mut table, &small).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("5/5"), "{table}");
        assert!(table.contains("1350/1480"), "{table}");
        assert!(table.contains("answer_source"), "{table}");
    }
}
