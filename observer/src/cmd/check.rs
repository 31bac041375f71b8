//! `observer check`: what this kernel supports for the observer, before a
//! rollout. Probes the kernel's features, loads (verifies) every program
//! variant `attach` would use without attaching anything, and reads which
//! tunnel device kinds the kernel has (`report::check` prints it). Exit status 0: `attach` works fully;
//! 1: it works with fallbacks (named, with what they cost); 2: it cannot run.

use std::{io, path::Path};

use anyhow::Context;

use crate::{
    bpf::features,
    bpf::verifier_stats,
    bpf::{Hook, LoadConfig, LoadError, Observer},
    node::preflight,
    node::tunnel_kinds::KernelBuild,
    report::{
        self, Format,
        check::{ProgramCheck, Report, TunnelKind, Verdict},
    },
};
use aya::programs::ProgramInfo;

/// Runs the check and prints it; returns the verdict.
pub fn run(format: Option<Format>) -> anyhow::Result<Verdict> {
    let report = check();
    // A closed pipe is main's to end quietly, like every command's.
    report::check::write(
        &mut io::stdout().lock(),
        Format::or_default(format),
        &report,
    )
    .context("writing output")?;
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
            let features = features::probe();
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
    report.programs = program_checks(&mut observer);
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

/// Loads (verifies) every program `attach` would use on this kernel, and
/// says how many instructions the verifier processed for each.
fn program_checks(observer: &mut Observer) -> Vec<ProgramCheck> {
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
    loaded.push((
        "xdp_checks",
        observer.plan().xdp.checks_program_name(),
        observer.xdp_checks_info(),
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
    loaded
        .into_iter()
        .map(|(hook, program, info)| match info {
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
        })
        .collect()
}
