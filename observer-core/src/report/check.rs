//! What `observer check` prints: the `{"type":"check",...}` object (its
//! view model, [`Report`]) as JSON or as a table for a person.

use std::io::{self, Write};

use serde::Serialize;

use crate::{
    model::kernel::{Availability, Fallback, Features, KERNEL_BTF},
    report::Format,
};

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

/// Writes `report` in `format`.
pub fn write(out: &mut impl Write, format: Format, report: &Report) -> io::Result<()> {
    match format {
        Format::Json => serde_json::to_writer(&mut *out, report)
            .map_err(io::Error::other)
            .and_then(|()| out.write_all(b"\n")),
        Format::Table => write_text(out, report),
    }
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
        None => format!("ok ({KERNEL_BTF})"),
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
            "  {:<14} {state:<7} {:<19} {insns}",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let features = Features {
            release: "5.10.0-32-amd64".to_string(),
            btf_problem: None,
            xdp_frags: false,
            tcx: Some(false),
            drop_reasons: Some(false),
        };
        Report {
            kernel: features.release.clone(),
            verdict: Verdict::Degraded,
            missing_privileges: Vec::new(),
            btf_problem: None,
            programs: vec![
                ProgramCheck {
                    hook: "tc_ingress",
                    program: "observer_tc_in",
                    loaded: true,
                    verified_insns: Some(190_975),
                    error: None,
                },
                ProgramCheck {
                    hook: "kernel_drops",
                    program: "observer_kfree2",
                    loaded: false,
                    verified_insns: None,
                    error: Some("invalid argument".to_string()),
                },
            ],
            tc_attach: "clsact",
            drop_reason_names: 0,
            fallbacks: features.plan().fallbacks[..1].to_vec(),
            features: Some(features),
            tunnel_kinds: vec![TunnelKind {
                kind: "vxlan",
                availability: Availability::Module,
            }],
        }
    }

    #[test]
    fn the_table_names_each_program_the_fallbacks_and_the_verdict() {
        let mut out = Vec::new();
        write(&mut out, Format::Table, &report()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            format!(
                "observer check: kernel 5.10.0-32-amd64\n\n\
                 \x20 privileges     ok\n\
                 \x20 BTF            ok (/sys/kernel/btf/vmlinux)\n\
                 \x20 tc ingress     ok      observer_tc_in      verifier: 190975 of 1000000 instructions\n\
                 \x20 kernel drops   FAILED  observer_kfree2     invalid argument\n\
                 \x20 tc attach      clsact\n\
                 \x20 drop reasons   not reported by this kernel (Linux 5.17+)\n\
                 \x20 tunnel kinds   vxlan (module)\n\
                 \nfallbacks:\n  - {}\n\
                 \nverdict: degraded: attach works with the fallbacks above (exit 1)\n",
                report().fallbacks[0]
            )
        );
    }

    #[test]
    fn json_is_one_check_object() {
        let mut out = Vec::new();
        write(&mut out, Format::Json, &report()).unwrap();
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["type"], "check");
        assert_eq!(json["verdict"], "degraded");
        assert_eq!(json["fallbacks"][0]["hook"], "xdp");
        assert_eq!(json["tunnel_kinds"][0]["availability"], "module");
        assert_eq!(json["programs"][1]["error"], "invalid argument");
    }
}
