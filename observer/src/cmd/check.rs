//! `observer check`: what this kernel supports for the observer, before a
//! rollout. Probes the kernel's features, loads (verifies) every program
//! variant `attach` would use without attaching anything, and reads which
//! tunnel device kinds the kernel has. Exit status 0: `attach` works fully;
//! 1: it works with fallbacks (named, with what they cost); 2: it cannot run.

use std::{
    io::{self, Write},
    path::Path,
};

use anyhow::Context;
use serde::Serialize;

use crate::{
    bpf::features::{Fallback, Features},
    bpf::verifier_stats,
    bpf::{Hook, LoadConfig, LoadError, Observer},
    node::preflight,
    node::tunnel_kinds::{Availability, KernelBuild},
    report::Format,
};
use aya::programs::ProgramInfo;

/// Verdict of a check, as exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Everything `attach` uses is available.
    Ok,
    /// `attach` works with fallbacks.
    Degraded,
    /// `attach` cannot run here.
    CannotRun,
}

impl Verdict {
    /// Exit status: 0, 1, 2.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Degraded => 1,
            Verdict::CannotRun => 2,
        }
    }
}

/// One program `attach` would load.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramCheck {
    /// `xdp`, `tc_ingress`, `tc_checks`, `tc_bgp`, `xdp_bgp`, `tc_egress`, `kernel_drops`.
    pub hook: &'static str,
    /// Program name.
    pub program: &'static str,
    /// The verifier accepted it.
    pub loaded: bool,
    /// Instructions the verifier processed (its limit is 1,000,000): from
    /// the kernel's program info (5.16+), else from its statistics log on
    /// a second load.
    pub verified_insns: Option<u32>,
    /// Why it did not load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Everything `observer check` found: `{"type":"check",...}`, the one
/// object `check --output json` prints (outside the line schema of
/// `report::Line`: it is no stream).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename = "check")]
pub struct Report {
    /// `uname -r`.
    pub kernel: String,
    /// The verdict (also the exit status).
    pub verdict: Verdict,
    /// Capabilities missing for loading programs (empty when none).
    pub missing_privileges: Vec<&'static str>,
    /// Why BTF cannot be used (absent when it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub btf_problem: Option<String>,
    /// Probed features.
    pub features: Option<Features>,
    /// Each program `attach` would load.
    pub programs: Vec<ProgramCheck>,
    /// How tc programs attach: `tcx` or `clsact`.
    pub tc_attach: &'static str,
    /// Drop reasons named from BTF (0 when the kernel reports none).
    pub drop_reason_names: usize,
    /// Fallbacks `attach` would use.
    pub fallbacks: Vec<Fallback>,
    /// Tunnel device kinds and their availability.
    pub tunnel_kinds: Vec<TunnelKind>,
}

/// A tunnel device kind and whether the kernel has it.
#[derive(Debug, Clone, Serialize)]
pub struct TunnelKind {
    /// `ip link` kind.
    pub kind: &'static str,
    /// Availability.
    pub availability: Availability,
}

/// Runs the check and prints it; returns the verdict.
pub fn run(format: Option<Format>) -> anyhow::Result<Verdict> {
    let report = check();
    let format = Format::or_default(format);
    let mut out = io::stdout().lock();
    let written = match format {
        Format::Json => serde_json::to_writer(&mut out, &report)
            .map_err(io::Error::other)
            .and_then(|()| out.write_all(b"\n")),
        Format::Table => write_text(&mut out, &report),
    };
    // A closed pipe is main's to end quietly, like every command's.
    written.context("writing output")?;
    Ok(report.verdict)
}

/// Probes and loads; prints nothing.
pub fn check() -> Report {
    let kernel = crate::bpf::features::kernel_release();
    let missing_privileges = preflight::missing_privileges();
    let btf_problem = preflight::check_btf(Path::new(preflight::KERNEL_BTF))
        .err()
        .map(|e| e.to_string());
    let tunnel_kinds = KernelBuild::read(&kernel)
        .tunnel_kinds()
        .into_iter()
        .map(|(kind, availability)| TunnelKind { kind, availability })
        .collect();
    let mut report = Report {
        kernel,
        verdict: Verdict::CannotRun,
        missing_privileges,
        btf_problem,
        features: None,
        programs: Vec::new(),
        tc_attach: "unknown",
        drop_reason_names: 0,
        fallbacks: Vec::new(),
        tunnel_kinds,
    };
    if !report.missing_privileges.is_empty() {
        return report;
    }
    let mut observer = match Observer::load(&LoadConfig::default()) {
        Ok(observer) => observer,
        Err(e) => {
            let features = Features::probe();
            report.fallbacks = features.plan().fallbacks;
            report.features = Some(features);
            report.programs.push(ProgramCheck {
                hook: "all",
                program: "observer",
                loaded: false,
                verified_insns: None,
                error: Some(format!("{:#}", anyhow::Error::from(e))),
            });
            return report;
        }
    };
    let mut loaded: Vec<(&'static str, &'static str, Result<ProgramInfo, LoadError>)> = [
        (Hook::Xdp, "xdp"),
        (Hook::TcIngress, "tc_ingress"),
        (Hook::TcEgress, "tc_egress"),
    ]
    .into_iter()
    .map(|(hook, label)| {
        (
            label,
            observer.program_name(hook),
            observer.program_info(hook),
        )
    })
    .collect();
    loaded.push((
        "tc_checks",
        crate::bpf::TC_CHECKS_PROGRAM,
        observer.tc_checks_info(),
    ));
    loaded.push(("tc_bgp", crate::bpf::TC_BGP_PROGRAM, observer.tc_bgp_info()));
    loaded.push((
        "xdp_bgp",
        observer.plan().xdp.bgp_program_name(),
        observer.xdp_bgp_info(),
    ));
    if let Some(program) = observer.plan().drops.program_name() {
        loaded.push(("kernel_drops", program, observer.load_drop_program()));
    }
    // Kernels before 5.16 do not report the count: a statistics reload does.
    let infos: Vec<&ProgramInfo> = loaded
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .collect();
    let maps = verifier_stats::LoadedMaps::of_programs(&infos);
    for (hook, program, info) in loaded {
        report.programs.push(match info {
            Ok(info) => ProgramCheck {
                hook,
                program,
                loaded: true,
                verified_insns: info.verified_instruction_count().or_else(|| {
                    let maps = maps.as_ref().ok()?;
                    verifier_stats::processed_instructions(program, maps)
                        .inspect_err(|e| tracing::warn!(program, "{e:#}"))
                        .ok()
                }),
                error: None,
            },
            Err(e) => ProgramCheck {
                hook,
                program,
                loaded: false,
                verified_insns: None,
                error: Some(format!("{:#}", anyhow::Error::from(e))),
            },
        });
    }
    let features = observer.features().clone();
    report.tc_attach = if features.tcx == Some(false) {
        "clsact"
    } else {
        "tcx"
    };
    report.drop_reason_names = observer.drop_reason_count();
    report.fallbacks = observer.plan().fallbacks.clone();
    report.features = Some(features);
    let all_loaded = report.programs.iter().all(|p| p.loaded);
    report.verdict = if all_loaded && report.fallbacks.is_empty() {
        Verdict::Ok
    } else {
        Verdict::Degraded
    };
    report
}

/// The report for a person.
fn write_text(out: &mut impl Write, report: &Report) -> io::Result<()> {
    writeln!(out, "observer check: kernel {}\n", report.kernel)?;
    let privileges = if report.missing_privileges.is_empty() {
        "ok".to_string()
    } else {
        format!(
            "missing {}: run as root, or grant them",
            report.missing_privileges.join(", ")
        )
    };
    writeln!(out, "  {:<14} {privileges}", "privileges")?;
    let btf = match &report.btf_problem {
        None => format!("ok ({})", preflight::KERNEL_BTF),
        Some(problem) => problem.clone(),
    };
    writeln!(out, "  {:<14} {btf}", "BTF")?;
    for p in &report.programs {
        let state = if p.loaded { "ok" } else { "FAILED" };
        let insns = match (p.loaded, p.verified_insns) {
            (true, Some(n)) => format!("verifier: {n} of 1000000 instructions"),
            (true, None) => "verifier: instruction count unavailable".to_string(),
            (false, _) => p.error.clone().unwrap_or_default(),
        };
        writeln!(
            out,
            "  {:<14} {state:<7} {:<17} {insns}",
            p.hook.replace('_', " "),
            p.program
        )?;
    }
    if report.missing_privileges.is_empty() {
        writeln!(out, "  {:<14} {}", "tc attach", report.tc_attach)?;
        let reasons = if report.drop_reason_names > 0 {
            format!("{} names from BTF", report.drop_reason_names)
        } else {
            "not reported by this kernel (Linux 5.17+)".to_string()
        };
        writeln!(out, "  {:<14} {reasons}", "drop reasons")?;
    }
    let kinds: Vec<String> = report
        .tunnel_kinds
        .iter()
        .map(|k| format!("{} ({})", k.kind, k.availability))
        .collect();
    writeln!(out, "  {:<14} {}", "tunnel kinds", kinds.join(", "))?;
    if !report.fallbacks.is_empty() {
        writeln!(out, "\nfallbacks:")?;
        for fallback in &report.fallbacks {
            writeln!(out, "  - {fallback}")?;
        }
    }
    let verdict = match report.verdict {
        Verdict::Ok => "ok: attach uses every hook as designed (exit 0)",
        Verdict::Degraded => "degraded: attach works with the fallbacks above (exit 1)",
        Verdict::CannotRun => "cannot run: attach would fail here (exit 2)",
    };
    writeln!(out, "\nverdict: {verdict}")
}
