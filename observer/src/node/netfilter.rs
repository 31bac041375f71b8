//! Reads the packet counters of Calico's allow-set drop rules (iptables
//! and nftables data planes), so the observer's own `calico_allow_set`
//! counts can be shown beside the kernel's and a disagreement flagged.
//! Rules are found by their comment, as chain names differ between
//! Calico's data planes, by a search made every few minutes; each read
//! lists only the chains found ([`RuleLocator`]). The tools' output is
//! read by `parse::netfilter`.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{
    model::crosscheck::RuleReading,
    model::facts::{Family, SetKind},
    node::tools::{self, ToolError},
    parse::netfilter::{RuleCounter, parse_iptables, parse_nft_chains, parse_nft_ruleset},
};

/// Calico's drop rules for sources outside the allow-sets: the comment it
/// writes, the set kind, and the address family of the sources it drops.
pub const CALICO_DROP_RULES: [(&str, SetKind, Family); 3] = [
    (
        "Drop IPv4 VXLAN packets from non-allowed hosts",
        SetKind::Vxlan,
        Family::V4,
    ),
    (
        "Drop IPv6 VXLAN packets from non-allowed hosts",
        SetKind::Vxlan,
        Family::V6,
    ),
    (
        "Drop IPIP packets from non-Calico hosts",
        SetKind::Ipip,
        Family::V4,
    ),
];

/// The rule sources read: each lists all its rules (to find Calico's) or
/// one chain (once found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Iptables,
    Ip6tables,
    Nftables,
}

impl Backend {
    const ALL: [Backend; 3] = [Backend::Iptables, Backend::Ip6tables, Backend::Nftables];

    fn name(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Ip6tables => "ip6tables",
            Backend::Nftables => "nftables",
        }
    }

    /// The command listing every rule of iptables' filter table with its
    /// counter (Calico's allow-set drop rules are in cali-INPUT: the other
    /// tables are never read); `None` for nftables, whose whole ruleset is
    /// never listed (see [`list_everywhere`]).
    fn save_command(self) -> Option<(&'static str, Vec<String>)> {
        let tool = match self {
            Backend::Iptables => "iptables-save",
            Backend::Ip6tables => "ip6tables-save",
            Backend::Nftables => return None,
        };
        Some((tool, ["-c", "-t", "filter"].map(String::from).to_vec()))
    }

    /// The command listing the rules of one `chain` with their counters.
    fn list_chain(self, chain: &[String]) -> (&'static str, Vec<String>) {
        let (tool, head): (&str, &[&str]) = match self {
            Backend::Iptables => ("iptables", &["-t", "filter", "-v", "-S"]),
            Backend::Ip6tables => ("ip6tables", &["-t", "filter", "-v", "-S"]),
            Backend::Nftables => ("nft", &["-j", "list", "chain"]),
        };
        let args = head
            .iter()
            .map(|a| a.to_string())
            .chain(chain.iter().cloned());
        (tool, args.collect())
    }

    /// The commented rules of one listing (either kind) of this backend.
    fn parse(self, text: &str) -> Result<Vec<RuleCounter>> {
        match self {
            Backend::Iptables | Backend::Ip6tables => Ok(parse_iptables(text, self.name())),
            Backend::Nftables => parse_nft_ruleset(text),
        }
    }
}

/// How often each backend is searched again ([`list_everywhere`]) for
/// Calico's drop rules where they were not before (a backend without them,
/// a rule Calico added to another chain; a rule that moved is caught at the
/// next read). Between two, only the chains found are read. A search costs
/// 0.7 s of CPU on a node with 50,000 iptables and 50,000 nftables rules
/// (`cargo xtask bench`, `monitor_calico_50k`): every 5 minutes that is
/// 0.2 % of a core, every minute it would be 1.1 %.
pub const RESCAN: Duration = Duration::from_secs(300);

/// Where Calico's drop rules were last found, per backend, so that a read
/// lists only those chains (a few rules) instead of the node's whole rule
/// set (Calico writes tens of thousands): the cost of a read no longer
/// grows with the node's rules. They are searched for again every
/// [`RESCAN`], and at once when the located chains no longer hold the rules
/// found in them (Calico rewrote or moved them).
#[derive(Debug, Clone, Default)]
pub struct RuleLocator {
    located: [Located; 3],
}

/// One backend's part of a [`RuleLocator`].
#[derive(Debug, Clone, Default)]
struct Located {
    /// Chains holding Calico's drop rules, as found by the last search.
    chains: Vec<Vec<String>>,
    /// How many of Calico's drop rules were in them.
    rules: usize,
    /// When the backend was last searched.
    listed_all: Option<Instant>,
}

/// Counters of Calico's drop rules, each with the rule it is, and the
/// problems met reading them. Missing tools are a problem, not an error.
pub fn read_calico_drop_rules(locator: &mut RuleLocator) -> (Vec<RuleReading>, Vec<String>) {
    read_with(locator, Instant::now(), &mut |tool, args| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tools::output(tool, &args, "its rule counters")
    })
}

/// Runs one command line for [`read_with`]: the tool and its arguments.
type Runner<'a> = dyn FnMut(&str, &[String]) -> Result<String, ToolError> + 'a;

/// [`read_calico_drop_rules`] with the tools run by `run`, at `now`.
fn read_with(
    locator: &mut RuleLocator,
    now: Instant,
    run: &mut Runner<'_>,
) -> (Vec<RuleReading>, Vec<String>) {
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    for (backend, located) in Backend::ALL.into_iter().zip(&mut locator.located) {
        match read_backend(backend, located, now, run) {
            Ok(found) => rules.extend(found),
            Err(problem) => problems.push(problem),
        }
    }
    let calico = rules
        .into_iter()
        .filter_map(|rule| {
            let &(_, kind, family) = calico_rule(&rule)?;
            Some(RuleReading {
                backend: rule.backend,
                kind,
                family,
                packets: rule.packets,
                comment: rule.comment,
            })
        })
        .collect();
    (calico, problems)
}

/// The entry of [`CALICO_DROP_RULES`] that `rule` is, if any.
fn calico_rule(rule: &RuleCounter) -> Option<&'static (&'static str, SetKind, Family)> {
    CALICO_DROP_RULES
        .iter()
        .find(|(comment, _, _)| *comment == rule.comment)
}

/// Why a listing gave no rules.
enum ListError {
    /// The tool is missing, hung or failed.
    Tool(ToolError),
    /// Its output is not what it should be.
    Parse(String),
}

impl std::fmt::Display for ListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListError::Tool(e) => e.fmt(f),
            ListError::Parse(message) => f.write_str(message),
        }
    }
}

/// One backend's Calico drop rules: from the located chains while they
/// hold the rules found in them and the last full search is recent, else
/// from a full search ([`list_everywhere`]).
fn read_backend(
    backend: Backend,
    located: &mut Located,
    now: Instant,
    run: &mut Runner<'_>,
) -> Result<Vec<RuleCounter>, String> {
    let fresh = located
        .listed_all
        .is_some_and(|at| now.saturating_duration_since(at) < RESCAN);
    if fresh {
        let mut found = Vec::new();
        for chain in &located.chains {
            match list(backend, run, backend.list_chain(chain)) {
                Ok(rules) => found.extend(rules),
                // Listing everything would not answer either.
                Err(ListError::Tool(
                    e @ (ToolError::TimedOut { .. } | ToolError::NotInstalled { .. }),
                )) => return Err(e.to_string()),
                // The chain is gone or unreadable: look everywhere again.
                Err(_) => {
                    found.clear();
                    break;
                }
            }
        }
        if found.len() == located.rules {
            return Ok(found);
        }
    }
    *located = Located {
        listed_all: Some(now),
        ..Located::default()
    };
    let found = list_everywhere(backend, run).map_err(|e| e.to_string())?;
    for rule in &found {
        if !located.chains.contains(&rule.chain) {
            located.chains.push(rule.chain.clone());
        }
    }
    located.rules = found.len();
    Ok(found)
}

/// Most nftables chains listed by one search.
pub const MAX_NFT_SEARCHED_CHAINS: usize = 32;

/// Calico's drop rules wherever this backend holds them. iptables: its
/// filter table, saved whole (0.4 s for 50,000 rules). nftables: the
/// chains whose name holds `INPUT` (where Calico writes them: `cali-INPUT`,
/// `filter-cali-INPUT` in its nftables table), at most
/// [`MAX_NFT_SEARCHED_CHAINS`], each listed on its own: `nft list ruleset`
/// of a node with Calico's rules at scale takes longer than the tools'
/// timeout (17 s and 1.1 GB for 50,000 iptables-nft and 50,000 native
/// rules), while `nft list chains` takes milliseconds.
fn list_everywhere(backend: Backend, run: &mut Runner<'_>) -> Result<Vec<RuleCounter>, ListError> {
    if let Some(save) = backend.save_command() {
        return list(backend, run, save);
    }
    let args = ["-j", "list", "chains"].map(String::from);
    let json = run("nft", &args).map_err(ListError::Tool)?;
    let chains = parse_nft_chains(&json)
        .map_err(|e| ListError::Parse(format!("cannot parse `nft {}`: {e}", args.join(" "))))?;
    let mut found = Vec::new();
    for chain in chains
        .iter()
        .filter(|c| c[2].contains("INPUT"))
        .take(MAX_NFT_SEARCHED_CHAINS)
    {
        found.extend(list(backend, run, backend.list_chain(chain))?);
    }
    Ok(found)
}

/// Calico's drop rules in the output of one command.
fn list(
    backend: Backend,
    run: &mut Runner<'_>,
    (tool, args): (&str, Vec<String>),
) -> Result<Vec<RuleCounter>, ListError> {
    let text = run(tool, &args).map_err(ListError::Tool)?;
    let rules = backend
        .parse(&text)
        .map_err(|e| ListError::Parse(format!("cannot parse `{tool} {}`: {e}", args.join(" "))))?;
    Ok(rules
        .into_iter()
        .filter(|r| calico_rule(r).is_some())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VXLAN_DROP: &str = "Drop IPv4 VXLAN packets from non-allowed hosts";

    /// A node's tools as the locator sees them: iptables' filter table as
    /// `(chain, comment, packets)` rules, no ip6tables, no nft; every
    /// command line run is recorded.
    struct FakeNode {
        rules: Vec<(&'static str, &'static str, u64)>,
        runs: Vec<String>,
        hang: bool,
    }

    impl FakeNode {
        fn new(rules: Vec<(&'static str, &'static str, u64)>) -> FakeNode {
            FakeNode {
                rules,
                runs: Vec::new(),
                hang: false,
            }
        }

        fn run(&mut self, tool: &str, args: &[String]) -> Result<String, ToolError> {
            let command = format!("{tool} {}", args.join(" "));
            self.runs.push(command.clone());
            let rule = |(chain, comment, packets): &(&str, &str, u64)| {
                format!("-A {chain} -m comment --comment \"{comment}\" -c {packets} 0 -j DROP\n")
            };
            match tool {
                "iptables" if self.hang => Err(ToolError::TimedOut {
                    command,
                    timeout: tools::TIMEOUT,
                    what: "its rule counters".into(),
                }),
                "iptables-save" => Ok(self
                    .rules
                    .iter()
                    .map(|r| {
                        format!(
                            "[{}:0] {}",
                            r.2,
                            rule(r).replace(&format!(" -c {} 0", r.2), "")
                        )
                    })
                    .collect()),
                "iptables" => {
                    let chain = args.last().unwrap();
                    let listed: String = self
                        .rules
                        .iter()
                        .filter(|r| r.0 == chain)
                        .map(rule)
                        .collect();
                    if listed.is_empty() {
                        return Err(ToolError::Failed {
                            command,
                            stderr: "No chain/target/match by that name.".into(),
                        });
                    }
                    Ok(listed)
                }
                tool => Err(ToolError::NotInstalled {
                    tool: tool.into(),
                    what: "its rule counters".into(),
                }),
            }
        }

        fn read(&mut self, locator: &mut RuleLocator, at: Instant) -> Vec<(String, u64)> {
            let (readings, _) = read_with(locator, at, &mut |tool, args| self.run(tool, args));
            readings
                .into_iter()
                .map(|r| (r.comment, r.packets))
                .collect()
        }

        /// The iptables commands run since the last call.
        fn iptables_runs(&mut self) -> Vec<String> {
            std::mem::take(&mut self.runs)
                .into_iter()
                .filter(|r| r.starts_with("iptables"))
                .collect()
        }
    }

    #[test]
    fn rules_are_found_once_then_read_in_their_chain() {
        let mut node = FakeNode::new(vec![
            ("cali-INPUT", VXLAN_DROP, 5),
            ("cali-fw-abc", "cali:policy", 1),
        ]);
        let mut locator = RuleLocator::default();
        let t0 = Instant::now();
        assert_eq!(node.read(&mut locator, t0), [(VXLAN_DROP.into(), 5)]);
        assert_eq!(node.iptables_runs(), ["iptables-save -c -t filter"]);
        node.rules[0].2 = 8;
        assert_eq!(node.read(&mut locator, t0), [(VXLAN_DROP.into(), 8)]);
        assert_eq!(
            node.iptables_runs(),
            ["iptables -t filter -v -S cali-INPUT"]
        );

        // Calico moved the rule: its old chain is gone, everything is
        // listed again at once and the new chain read from then on.
        node.rules[0].0 = "cali-INPUT-2";
        assert_eq!(node.read(&mut locator, t0), [(VXLAN_DROP.into(), 8)]);
        assert_eq!(
            node.iptables_runs(),
            [
                "iptables -t filter -v -S cali-INPUT",
                "iptables-save -c -t filter"
            ]
        );
        node.read(&mut locator, t0);
        assert_eq!(
            node.iptables_runs(),
            ["iptables -t filter -v -S cali-INPUT-2"]
        );

        // A hung tool is reported, not answered by listing everything.
        node.hang = true;
        let (readings, problems) =
            read_with(&mut locator, t0, &mut |tool, args| node.run(tool, args));
        assert!(readings.is_empty());
        assert!(
            problems.iter().any(|p| p.contains("did not answer")),
            "{problems:?}"
        );
        assert_eq!(
            node.iptables_runs(),
            ["iptables -t filter -v -S cali-INPUT-2"]
        );
    }

    #[test]
    fn a_rule_gone_from_its_chain_makes_a_full_list() {
        let mut node = FakeNode::new(vec![
            ("cali-INPUT", VXLAN_DROP, 5),
            ("cali-INPUT", "Drop IPIP packets from non-Calico hosts", 2),
        ]);
        let mut locator = RuleLocator::default();
        let t0 = Instant::now();
        node.read(&mut locator, t0);
        node.rules[1].0 = "cali-OTHER";
        assert_eq!(node.read(&mut locator, t0).len(), 2);
        assert_eq!(
            node.iptables_runs(),
            [
                "iptables-save -c -t filter",
                "iptables -t filter -v -S cali-INPUT",
                "iptables-save -c -t filter"
            ]
        );
    }

    #[test]
    fn nftables_is_searched_in_its_input_chains_never_listed_whole() {
        let chains = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "ip", "name": "calico", "handle": 1}}, {"chain": {"family": "ip", "table": "calico", "name": "filter-INPUT", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}, {"chain": {"family": "ip", "table": "calico", "name": "filter-cali-INPUT", "handle": 2}}, {"chain": {"family": "ip", "table": "calico", "name": "filter-cali-pi-0001", "handle": 3}}]}"#;
        let cali_input = r#"{"nftables": [{"rule": {"family": "ip", "table": "calico", "chain": "filter-cali-INPUT", "handle": 9, "comment": "Drop IPv4 VXLAN packets from non-allowed hosts", "expr": [{"counter": {"packets": 12, "bytes": 600}}, {"drop": null}]}}]}"#;
        let empty = r#"{"nftables": []}"#;
        let mut runs = Vec::new();
        let mut locator = RuleLocator::default();
        let t0 = Instant::now();
        for round in 0..2 {
            let (readings, problems) = read_with(&mut locator, t0, &mut |tool, args| {
                let command = format!("{tool} {}", args.join(" "));
                runs.push(command.clone());
                match command.as_str() {
                    "nft -j list chains" => Ok(chains.to_string()),
                    "nft -j list chain ip calico filter-cali-INPUT" => Ok(cali_input.to_string()),
                    "nft -j list chain ip calico filter-INPUT" => Ok(empty.to_string()),
                    _ => Err(ToolError::NotInstalled {
                        tool: tool.into(),
                        what: "its rule counters".into(),
                    }),
                }
            });
            // iptables and ip6tables are missing: said at their search, not
            // again until the next.
            let missing = if round == 0 { 2 } else { 0 };
            assert_eq!(problems.len(), missing, "{problems:?}");
            assert_eq!(readings.len(), 1);
            assert_eq!((readings[0].backend, readings[0].packets), ("nftables", 12));
        }
        let nft: Vec<&String> = runs.iter().filter(|r| r.starts_with("nft")).collect();
        assert_eq!(
            nft,
            [
                "nft -j list chains",
                "nft -j list chain ip calico filter-INPUT",
                "nft -j list chain ip calico filter-cali-INPUT",
                "nft -j list chain ip calico filter-cali-INPUT",
            ]
        );
        assert!(parse_nft_chains("[").is_err());
    }

    #[test]
    fn everything_is_listed_again_only_every_rescan() {
        let mut node = FakeNode::new(vec![("cali-fw-abc", "cali:policy", 1)]);
        let mut locator = RuleLocator::default();
        let t0 = Instant::now();
        for offset in [0, 1, 30, 59] {
            assert!(
                node.read(&mut locator, t0 + Duration::from_secs(offset))
                    .is_empty()
            );
        }
        assert_eq!(node.iptables_runs(), ["iptables-save -c -t filter"]);
        node.rules.push(("cali-INPUT", VXLAN_DROP, 3));
        assert_eq!(
            node.read(&mut locator, t0 + RESCAN),
            [(VXLAN_DROP.into(), 3)]
        );
        assert_eq!(node.iptables_runs(), ["iptables-save -c -t filter"]);
        node.read(&mut locator, t0 + RESCAN + Duration::from_secs(1));
        assert_eq!(
            node.iptables_runs(),
            ["iptables -t filter -v -S cali-INPUT"]
        );
        node.read(&mut locator, t0 + RESCAN * 2);
        assert_eq!(node.iptables_runs(), ["iptables-save -c -t filter"]);
    }
}
