//! Loading: probes the kernel, picks the program variants its features
//! call for, loads (verifies) them, and explains a refusal in terms a
//! person can act on.

use std::{
    fmt, io,
    os::fd::{AsFd, BorrowedFd},
    path::Path,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, ProgramArray},
    programs::{BtfTracePoint, ProgramError},
};
use observer_common::{
    BGP_PROG_MAP, FLOWS_MAP, SKB_LAYOUT_GLOBAL, SkbLayout, UDP_PORT_TAGS_GLOBAL, XDP_BGP_PROG_MAP,
};

use super::{
    DropHook, EBPF_OBJECT, Hook, LoadConfig, Observer,
    btf::KernelBtf,
    features::{Features, Plan},
};
use crate::{
    model::{ports::PortArray, rows::KernelReasons},
    node::preflight,
};

impl Observer {
    /// Probes the kernel, then loads and verifies the programs variants it
    /// supports, with the port table written in. Fails when the programs cannot
    /// count in either direction: tc egress, and XDP or tc ingress.
    pub fn load(config: &LoadConfig) -> Result<Observer> {
        let observer = Observer::load_programs(config);
        release_loader_memory();
        observer
    }

    /// [`Observer::load`] without returning the loader's memory.
    fn load_programs(config: &LoadConfig) -> Result<Observer> {
        let ports = PortArray::new(&config.ports).map_err(|e| anyhow!(e))?;
        if config.max_flows == 0 {
            bail!("--max-flows must be at least 1");
        }
        // The kernel's BTF, parsed once: features, sk_buff offsets and
        // drop reason names all come from it.
        let btf = KernelBtf::open(Path::new(preflight::KERNEL_BTF));
        let features = Features::probe_with(&btf);
        let plan = features.plan();
        for fallback in &plan.fallbacks {
            tracing::warn!(kernel = %features.release, "{fallback}");
        }
        // A kernel without the offsets still gets every counter but
        // kernel drops.
        let (layout, btf_problem) = match btf.as_ref().map(KernelBtf::skb_layout) {
            Ok(Ok(layout)) => (layout, None),
            Ok(Err(e)) => (SkbLayout::default(), Some(format!("{e:#}"))),
            Err(e) => (SkbLayout::default(), Some(format!("{e:#}"))),
        };
        let (drop_reasons, drop_subsystems) = btf
            .as_ref()
            .ok()
            .and_then(|btf| Some((btf.drop_reasons().ok()?, btf.drop_reason_subsystems())))
            .unwrap_or_default();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(FLOWS_MAP, config.max_flows)
            .map_max_entries(observer_common::DROPS_MAP, config.max_flows)
            .map_max_entries(observer_common::BGP_MAP, bgp_map_entries()?)
            .override_global(SKB_LAYOUT_GLOBAL, &layout, true)
            .override_global(UDP_PORT_TAGS_GLOBAL, &ports.tags()[..], true)
            .load(EBPF_OBJECT)
            .map_err(|e| explain_load_error(anyhow::Error::new(e), &features.release))?;
        let mut load_failures = Vec::new();
        for hook in [Hook::Xdp, Hook::TcEgress] {
            let name = program_name(&plan, hook);
            let loaded = load_program(&mut ebpf, name, &features.release);
            note_failure(&mut load_failures, hook, name, loaded)?;
        }
        let bgp_unavailable = |hook: &str, e: &anyhow::Error| {
            tracing::warn!(
                error = %format!("{e:#}"),
                "BGP at the wire unavailable on {hook} (TCP/179 is not counted there)"
            )
        };
        let tc_bgp = load_tail_program(&mut ebpf, TC_BGP_PROGRAM, BGP_PROG_MAP, &features.release)
            .inspect_err(|e| bgp_unavailable("tc", e))
            .ok();
        let xdp_failed = load_failures.iter().any(|(h, _)| *h == Hook::Xdp);
        let xdp_bgp = if xdp_failed {
            None
        } else {
            let name = plan.xdp.bgp_program_name();
            load_tail_program(&mut ebpf, name, XDP_BGP_PROG_MAP, &features.release)
                .inspect_err(|e| bgp_unavailable("XDP", e))
                .ok()
        };
        // tc ingress now unless deferred; and always when XDP cannot count.
        let tc_ingress_loaded = !config.defer_tc_ingress || xdp_failed;
        let mut tc_checks = None;
        if tc_ingress_loaded {
            match load_tc_ingress(&mut ebpf, &features.release) {
                Ok(checks) => tc_checks = checks,
                Err(e) => note_failure(
                    &mut load_failures,
                    Hook::TcIngress,
                    program_name_tc_ingress(),
                    Err(e),
                )?,
            }
        }
        let failed = |hook: Hook| load_failures.iter().any(|(h, _)| *h == hook);
        if failed(Hook::TcEgress) || (failed(Hook::Xdp) && failed(Hook::TcIngress)) {
            let reasons: Vec<String> = load_failures.iter().map(|(_, why)| why.clone()).collect();
            bail!(
                "{}. The observer needs Linux 5.10 or newer with BTF (CONFIG_DEBUG_INFO_BTF=y); \
                 `observer check` shows what this kernel supports",
                reasons.join("; ")
            );
        }
        let mut observer = Observer {
            ebpf,
            features,
            plan,
            load_failures,
            tc_ingress_loaded,
            tc_checks,
            tc_bgp,
            xdp_bgp,
            attachments: Vec::new(),
            links: Vec::new(),
            kernel_reasons: KernelReasons {
                reasons: drop_reasons,
                subsystems: drop_subsystems,
            },
            btf_problem,
            drop_hook: DropHook::Pending,
            slot_reads: Default::default(),
        };
        super::maps::next_facts_generation(&mut observer)
            .context("starting the node facts generation")?;
        Ok(observer)
    }

    /// What the kernel offers.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// The program variants in use and the fallbacks they imply.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Name of the program loaded for `hook`.
    pub fn program_name(&self, hook: Hook) -> &'static str {
        program_name(&self.plan, hook)
    }

    /// Why the program of `hook` did not load, if it did not (a deferred
    /// tc ingress not loaded yet reads as not loaded).
    pub fn load_failure(&self, hook: Hook) -> Option<&str> {
        if hook == Hook::TcIngress && !self.tc_ingress_loaded {
            return Some("not loaded yet: no interface needed it");
        }
        self.load_failures
            .iter()
            .find(|(h, _)| *h == hook)
            .map(|(_, why)| why.as_str())
    }

    /// Loads (verifies) the kfree_skb program variant of the plan, once,
    /// without attaching it; returns its kernel info.
    pub fn load_drop_program(&mut self) -> Result<aya::programs::ProgramInfo> {
        let name = self
            .plan
            .drops
            .program_name()
            .context("this kernel has no BTF: kernel drops cannot be counted")?;
        let release = self.features.release.clone();
        let program: &mut BtfTracePoint = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("{name} missing"))?
            .try_into()?;
        if program.fd().is_err() {
            let btf = aya::Btf::from_sys_fs().context("reading kernel BTF")?;
            let loaded = program.load("kfree_skb", &btf);
            drop(btf);
            release_loader_memory();
            loaded.map_err(|e| explain_program_error(e, name, &release))?;
        }
        Ok(program.info()?)
    }

    /// The loaded program of `hook`.
    fn loaded_program(&self, hook: Hook) -> Result<&aya::programs::Program> {
        let name = self.program_name(hook);
        if let Some(why) = self.load_failure(hook) {
            bail!("{name} is not loaded: {why}");
        }
        self.ebpf
            .program(name)
            .with_context(|| format!("program {name} missing"))
    }

    /// File descriptor of a loaded program (for BPF_PROG_TEST_RUN).
    pub fn program_fd(&self, hook: Hook) -> Result<BorrowedFd<'_>> {
        Ok(self.loaded_program(hook)?.fd()?.as_fd())
    }

    /// Kernel info of the loaded program of `hook` (id, verified
    /// instruction count, run time when BPF stats are on).
    pub fn program_info(&self, hook: Hook) -> Result<aya::programs::ProgramInfo> {
        Ok(self.loaded_program(hook)?.info()?)
    }

    /// Kernel info of tc ingress's checks program (tail-called; never
    /// attached).
    pub fn tc_checks_info(&self) -> Result<aya::programs::ProgramInfo> {
        self.tail_program_info(TC_CHECKS_PROGRAM, self.tc_checks.is_some())
    }

    /// Kernel info of the tc hooks' BGP program (tail-called; never
    /// attached).
    pub fn tc_bgp_info(&self) -> Result<aya::programs::ProgramInfo> {
        self.tail_program_info(TC_BGP_PROGRAM, self.tc_bgp.is_some())
    }

    /// Kernel info of XDP's BGP program (tail-called; never attached).
    pub fn xdp_bgp_info(&self) -> Result<aya::programs::ProgramInfo> {
        self.tail_program_info(self.plan.xdp.bgp_program_name(), self.xdp_bgp.is_some())
    }

    fn tail_program_info(&self, name: &str, loaded: bool) -> Result<aya::programs::ProgramInfo> {
        if !loaded {
            bail!("{name} is not loaded");
        }
        let program = self
            .ebpf
            .program(name)
            .with_context(|| format!("{name} missing"))?;
        Ok(program.info()?)
    }

    /// Kernel program ids of the packet programs, in the order xdp, tc
    /// ingress, tc egress; `None` for one not loaded (tc ingress until an
    /// interface needs it).
    pub fn program_ids(&self) -> Result<Vec<Option<u32>>> {
        Hook::ALL
            .iter()
            .map(|hook| {
                if self.load_failure(*hook).is_some() {
                    return Ok(None);
                }
                Ok(Some(self.program_info(*hook)?.id()))
            })
            .collect()
    }

    /// How many kernel drop reasons this kernel names (0 before 5.17).
    pub fn drop_reason_count(&self) -> usize {
        self.kernel_reasons.reasons.len()
    }
}

/// tc ingress's drop checks, reached by a tail call.
pub const TC_CHECKS_PROGRAM: &str = "observer_tc_chk";

/// Both tc hooks' BGP counting, reached by a tail call.
pub const TC_BGP_PROGRAM: &str = "observer_tc_bgp";

/// Name of the program of `hook` under `plan`.
fn program_name(plan: &Plan, hook: Hook) -> &'static str {
    match hook {
        Hook::Xdp => plan.xdp.program_name(),
        Hook::TcIngress => program_name_tc_ingress(),
        Hook::TcEgress => "observer_tc_out",
    }
}

/// Loads (verifies) the XDP or tc program `name`.
fn load_program(ebpf: &mut Ebpf, name: &'static str, release: &str) -> Result<()> {
    let program = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))?;
    let loaded = match program {
        aya::programs::Program::Xdp(p) => p.load(),
        aya::programs::Program::SchedClassifier(p) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    };
    loaded.map_err(|e| explain_program_error(e, name, release))
}

/// Records a packet program that did not load (the others still count);
/// a permission error ends the load instead, since nothing else will load.
fn note_failure(
    failures: &mut Vec<(Hook, String)>,
    hook: Hook,
    name: &str,
    loaded: Result<()>,
) -> Result<()> {
    if let Err(e) = loaded {
        // anyhow finds a context by its type.
        if e.downcast_ref::<PermissionDenied>().is_some() {
            return Err(e);
        }
        tracing::warn!(program = name, error = %format!("{e:#}"), "program not loaded");
        failures.push((hook, format!("{e:#}")));
    }
    Ok(())
}

/// Entries of the BGP map: its keys plus the free entries the kernel's
/// common LRU may hold on each CPU (see `observer_common::BGP_MAP`).
fn bgp_map_entries() -> Result<u32> {
    let cpus = super::maps::possible_cpus()?;
    Ok(observer_common::BGP_MAX_KEYS + observer_common::LRU_LOCAL_FREE * cpus as u32)
}

/// Hands the memory the loader freed back to the system. Loading parses
/// the kernel's BTF and reads verifier logs: about 26 MiB that glibc would
/// otherwise keep for the life of a monitor that runs for months
/// (`rss_1000_peers` in `cargo xtask bench` went from 31 to 7 MiB).
pub(super) fn release_loader_memory() {
    // SAFETY: malloc_trim only returns free heap pages to the system.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Loads tc ingress and its checks program; returns the CHECKS array
/// (`None` when only the checks program failed: tc ingress then counts
/// without drop checks, which is logged).
pub(super) fn load_tc_ingress(
    ebpf: &mut Ebpf,
    release: &str,
) -> Result<Option<ProgramArray<MapData>>> {
    load_program(ebpf, program_name_tc_ingress(), release)?;
    Ok(load_tc_checks(ebpf, release)
        .inspect_err(|e| {
            tracing::warn!(
                error = %format!("{e:#}"),
                "tc ingress drop checks (classifier reasons, path_mtu) unavailable"
            )
        })
        .ok())
}

/// Name of tc ingress's program.
const fn program_name_tc_ingress() -> &'static str {
    "observer_tc_in"
}

/// Loads tc ingress's checks program into the CHECKS program array.
fn load_tc_checks(ebpf: &mut Ebpf, release: &str) -> Result<ProgramArray<MapData>> {
    load_tail_program(
        ebpf,
        TC_CHECKS_PROGRAM,
        observer_common::CHECKS_MAP,
        release,
    )
}

/// Loads the tail-call target `name` and puts it into slot 0 of the
/// program array `map`, where a hook tail-calls it. The caller keeps the
/// array: the kernel empties a program array when userspace closes its
/// last fd.
fn load_tail_program(
    ebpf: &mut Ebpf,
    name: &'static str,
    map: &str,
    release: &str,
) -> Result<ProgramArray<MapData>> {
    load_program(ebpf, name, release)?;
    let mut array: ProgramArray<MapData> = ProgramArray::try_from(
        ebpf.take_map(map)
            .with_context(|| format!("{map} map missing"))?,
    )?;
    let program = ebpf
        .program(name)
        .with_context(|| format!("{name} missing"))?;
    array
        .set(0, program.fd()?, 0)
        .with_context(|| format!("writing {name} into {map}"))?;
    Ok(array)
}

/// Turns a program load error into one a person can act on: the program,
/// the kernel, what went wrong. The verifier's log goes to the debug log
/// (OBSERVER_LOG=debug), never into the message.
fn explain_program_error(e: ProgramError, name: &str, release: &str) -> anyhow::Error {
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &e
    else {
        return explain_load_error(anyhow::Error::new(e), release)
            .context(format!("loading {name}"));
    };
    let log = verifier_log.to_string();
    tracing::debug!(program = name, kernel = release, "verifier log:\n{log}");
    let errno = io_error.raw_os_error().unwrap_or(0);
    if errno == libc::EPERM {
        return explain_load_error(anyhow::Error::new(e), release);
    }
    let processed =
        crate::bpf::verifier_stats::processed(&log).map(|n| format!(" after {n} instructions"));
    match (errno, processed) {
        (libc::EACCES, processed) | (libc::EINVAL, processed @ Some(_)) => anyhow!(
            "the verifier of kernel {release} rejected {name}{} ({io_error}). \
             This kernel is supported (5.10+ with BTF), so this is an observer bug: \
             please report it with the output of `OBSERVER_LOG=debug observer check`",
            processed.unwrap_or_default()
        ),
        (libc::E2BIG, _) => anyhow!(
            "kernel {release} refused {name} as too large for its verifier ({io_error}); \
             the observer supports 5.10 and newer"
        ),
        _ => anyhow!(
            "kernel {release} refused to load {name} before verifying it ({io_error}): \
             it lacks a feature the program needs. The observer needs Linux 5.10 or newer \
             with BTF; OBSERVER_LOG=debug shows the kernel's log"
        ),
    }
}

/// Turns permission errors into the capabilities to grant.
fn explain_load_error(e: anyhow::Error, release: &str) -> anyhow::Error {
    let permission = e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
    });
    if permission {
        return e.context(PermissionDenied(release.to_string()));
    }
    e.context(format!("loading the eBPF object on kernel {release}"))
}

/// The kernel refused to load programs for lack of privileges (kernel
/// release inside): nothing else will load either.
#[derive(Debug)]
struct PermissionDenied(String);

impl fmt::Display for PermissionDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "permission denied loading eBPF programs: run as root, or grant CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8; this is {})",
            self.0
        )
    }
}

impl std::error::Error for PermissionDenied {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_program_is_noted_and_a_permission_error_ends_the_load() {
        let mut failures = Vec::new();
        let refused = anyhow!("the verifier of kernel 5.10 rejected observer_tc_in");
        note_failure(
            &mut failures,
            Hook::TcIngress,
            "observer_tc_in",
            Err(refused),
        )
        .unwrap();
        assert_eq!(failures.len(), 1);
        assert!(failures[0].1.contains("rejected observer_tc_in"));

        let eperm = explain_load_error(
            anyhow::Error::new(io::Error::from_raw_os_error(libc::EPERM)),
            "5.10.0-32-amd64",
        );
        let ended = note_failure(&mut failures, Hook::Xdp, "observer_xdp", Err(eperm)).unwrap_err();
        assert_eq!(failures.len(), 1, "not noted: the whole load fails");
        let text = format!("{ended:#}");
        assert!(
            text.starts_with("permission denied loading eBPF programs")
                && text.contains("this is 5.10.0-32-amd64"),
            "{text}"
        );
    }
}
