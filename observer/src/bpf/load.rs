//! Loading: probes the kernel, picks the program variants its features
//! call for, loads (verifies) them, and explains a refusal in terms a
//! person can act on.

use std::{
    io,
    os::fd::{AsFd, BorrowedFd},
    path::Path,
};

use aya::{
    BtfError, Ebpf, EbpfError, EbpfLoader,
    maps::{MapData, MapError, ProgramArray},
    pin::PinError,
    programs::{BtfTracePoint, ProgramError},
};
use observer_common::{
    BGP_PROG_MAP, FLOWS_MAP, SKB_LAYOUT_GLOBAL, SkbLayout, UDP_PORT_TAGS_GLOBAL, XDP_BGP_PROG_MAP,
    XDP_CHECKS_PROG_MAP,
};

use super::{
    DropHook, EBPF_OBJECT, Hook, LoadConfig, Observer,
    btf::KernelBtf,
    error_chain,
    features::{self, Features, Plan},
    maps::MapsError,
};
use crate::{
    model::{ports::PortArray, rows::KernelReasons},
    node::preflight,
};

/// Why the programs, or one of them, did not load. `{:#}` of the `anyhow`
/// error made of it prints the causes after the message.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The UDP port assignment makes no port table.
    #[error("{0}")]
    Ports(String),
    /// `--max-flows 0`.
    #[error("--max-flows must be at least 1")]
    NoFlows,
    /// The kernel refused for lack of privileges: nothing else will load
    /// either. `program`: the program whose load failed before it reached
    /// the verifier, named in front of the message.
    #[error("{}{}", loading(*.program), denied(release, *.capabilities_granted))]
    PermissionDenied {
        release: String,
        program: Option<&'static str>,
        /// Whether the process holds the capabilities: then a seccomp
        /// profile or an LSM refused bpf(), not the kernel's capability
        /// check.
        capabilities_granted: bool,
        #[source]
        source: Box<AyaError>,
    },
    /// The object (its maps, BTF, relocations) did not load; or, with
    /// `program`, that program failed before it reached the verifier.
    #[error("{}loading the eBPF object on kernel {release}", loading(*.program))]
    Object {
        release: String,
        program: Option<&'static str>,
        #[source]
        source: Box<AyaError>,
    },
    /// The verifier rejected `program`: on a supported kernel, an observer
    /// bug. `log` is the verifier's log (also logged at debug level, never
    /// printed in the message); `processed`, the instructions it got through.
    #[error(
        "the verifier of kernel {release} rejected {program}{} ({error}). \
         This kernel is supported (5.10+ with BTF), so this is an observer bug: \
         please report it with the output of `OBSERVER_LOG=debug observer check`",
        after(*.processed)
    )]
    Verifier {
        program: &'static str,
        release: String,
        processed: Option<u32>,
        error: io::Error,
        log: String,
    },
    /// `program` is too large for this kernel's verifier (E2BIG).
    #[error(
        "kernel {release} refused {program} as too large for its verifier ({error}); \
         the observer supports 5.10 and newer"
    )]
    TooLarge {
        program: &'static str,
        release: String,
        error: io::Error,
        log: String,
    },
    /// The kernel refused `program` before verifying it: it lacks a
    /// feature the program needs (a helper, a program or map type, BTF).
    #[error(
        "kernel {release} refused to load {program} before verifying it ({error}): \
         it lacks a feature the program needs. The observer needs Linux 5.10 or newer \
         with BTF; OBSERVER_LOG=debug shows the kernel's log"
    )]
    MissingFeature {
        program: &'static str,
        release: String,
        error: io::Error,
        log: String,
    },
    /// The kernel has no BTF: the kfree_skb program cannot load.
    #[error("this kernel has no BTF: kernel drops cannot be counted")]
    NoBtf,
    /// The kernel's BTF could not be read.
    #[error("reading kernel BTF")]
    KernelBtf(#[source] BtfError),
    /// No program counts one of the directions (tc egress, or both XDP and
    /// tc ingress, did not load): why each program failed, by hook.
    #[error(
        "{}. The observer needs Linux 5.10 or newer with BTF (CONFIG_DEBUG_INFO_BTF=y); \
         `observer check` shows what this kernel supports",
        reasons(.failures)
    )]
    CannotCount { failures: Vec<(Hook, String)> },
    /// A program or map is not in the object (an observer bug: build.rs
    /// builds the object from the same workspace); the text names it.
    #[error("{0}")]
    Missing(String),
    /// `program` did not load (`why`), or is not loaded yet.
    #[error("{program} is not loaded{}", because(.why))]
    NotLoaded {
        program: &'static str,
        why: Option<String>,
    },
    /// Writing the tail-called `program` into its program array failed.
    #[error("writing {program} into {map}")]
    MapWrite {
        program: &'static str,
        map: &'static str,
        #[source]
        source: MapError,
    },
    /// Starting the node facts generation (a map write) failed.
    #[error("starting the node facts generation")]
    FactsGeneration(#[source] MapsError),
    /// Another map failure (sizing the BGP map, a program array of the
    /// wrong type).
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// aya refused a program operation (wrong type, its fd, its info).
    #[error(transparent)]
    Program(#[from] ProgramError),
}

impl LoadError {
    pub(super) fn program_missing(name: &str) -> LoadError {
        LoadError::Missing(format!("program {name} missing"))
    }
}

/// What aya returned when the kernel refused: loading the object, or a
/// program.
#[derive(Debug, thiserror::Error)]
pub enum AyaError {
    #[error(transparent)]
    Object(#[from] EbpfError),
    #[error(transparent)]
    Program(#[from] ProgramError),
}

impl AyaError {
    /// The errno of the system call the kernel refused, where aya keeps one.
    fn errno(&self) -> Option<i32> {
        match self {
            AyaError::Object(e) => object_io_error(e),
            AyaError::Program(e) => program_io_error(e),
        }
        .and_then(io::Error::raw_os_error)
    }
}

/// The system call's error inside an object load error.
fn object_io_error(e: &EbpfError) -> Option<&io::Error> {
    match e {
        EbpfError::FileError { error, .. } => Some(error),
        EbpfError::BtfError(e) => btf_io_error(e),
        EbpfError::MapError(e) => map_io_error(e),
        EbpfError::ProgramError(e) => program_io_error(e),
        _ => None,
    }
}

/// The system call's error inside a program error.
fn program_io_error(e: &ProgramError) -> Option<&io::Error> {
    match e {
        ProgramError::LoadError { io_error, .. } => Some(io_error),
        ProgramError::SyscallError(e) => Some(&e.io_error),
        ProgramError::IOError(e) => Some(e),
        ProgramError::MapError(e) => map_io_error(e),
        ProgramError::Btf(e) => btf_io_error(e),
        _ => None,
    }
}

/// The system call's error inside a map error.
fn map_io_error(e: &MapError) -> Option<&io::Error> {
    match e {
        MapError::CreateError { io_error, .. } => Some(io_error),
        MapError::IoError(e) => Some(e),
        MapError::SyscallError(e) => Some(&e.io_error),
        MapError::PinError {
            error: PinError::SyscallError(e),
            ..
        } => Some(&e.io_error),
        _ => None,
    }
}

/// The system call's error inside a BTF error.
fn btf_io_error(e: &BtfError) -> Option<&io::Error> {
    match e {
        BtfError::LoadError { io_error, .. } => Some(io_error),
        BtfError::FileError { error, .. } => Some(error),
        _ => None,
    }
}

/// "loading NAME: ", in front of a refusal of that program outside the
/// verifier.
fn loading(program: Option<&str>) -> String {
    program
        .map(|name| format!("loading {name}: "))
        .unwrap_or_default()
}

/// " after N instructions", when the verifier's log says how many.
fn after(processed: Option<u32>) -> String {
    processed
        .map(|n| format!(" after {n} instructions"))
        .unwrap_or_default()
}

/// ": WHY", when there is a why.
fn because(why: &Option<String>) -> String {
    why.as_ref()
        .map(|why| format!(": {why}"))
        .unwrap_or_default()
}

/// The failures' texts, joined.
fn reasons(failures: &[(Hook, String)]) -> String {
    let reasons: Vec<&str> = failures.iter().map(|(_, why)| why.as_str()).collect();
    reasons.join("; ")
}

impl Observer {
    /// Probes the kernel, then loads and verifies the programs variants it
    /// supports, with the port table written in. Fails when the programs cannot
    /// count in either direction: tc egress, and XDP or tc ingress.
    pub fn load(config: &LoadConfig) -> Result<Observer, LoadError> {
        let observer = Observer::load_programs(config);
        release_loader_memory();
        observer
    }

    /// [`Observer::load`] without returning the loader's memory.
    fn load_programs(config: &LoadConfig) -> Result<Observer, LoadError> {
        let ports = PortArray::new(&config.ports).map_err(LoadError::Ports)?;
        if config.max_flows == 0 {
            return Err(LoadError::NoFlows);
        }
        // The kernel's BTF, parsed once: features, sk_buff offsets and
        // drop reason names all come from it.
        let btf = KernelBtf::open(Path::new(preflight::KERNEL_BTF));
        let features = features::probe_with(&btf);
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
            .map_err(|e| explain_load_error(e.into(), &features.release, None))?;
        let mut load_failures = Vec::new();
        for hook in [Hook::Xdp, Hook::TcEgress] {
            let name = program_name(&plan, hook);
            let loaded = load_program(&mut ebpf, name, &features.release);
            note_failure(&mut load_failures, hook, name, loaded)?;
        }
        let bgp_unavailable = |hook: &str, e: &LoadError| {
            tracing::warn!(
                error = %error_chain(e),
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
        let xdp_checks = if xdp_failed {
            None
        } else {
            let name = plan.xdp.checks_program_name();
            load_tail_program(&mut ebpf, name, XDP_CHECKS_PROG_MAP, &features.release)
                .inspect_err(|e| {
                    tracing::warn!(
                        error = %error_chain(e),
                        "drop checks unavailable on XDP (frames XDP receives are counted, not checked for drop reasons)"
                    )
                })
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
            return Err(LoadError::CannotCount {
                failures: load_failures,
            });
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
            xdp_checks,
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
        super::maps::next_facts_generation(&mut observer).map_err(LoadError::FactsGeneration)?;
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
    pub fn load_drop_program(&mut self) -> Result<aya::programs::ProgramInfo, LoadError> {
        let name = self.plan.drops.program_name().ok_or(LoadError::NoBtf)?;
        let release = self.features.release.clone();
        let program: &mut BtfTracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| LoadError::Missing(format!("{name} missing")))?
            .try_into()?;
        if program.fd().is_err() {
            let btf = aya::Btf::from_sys_fs().map_err(LoadError::KernelBtf)?;
            let loaded = program.load("kfree_skb", &btf);
            drop(btf);
            release_loader_memory();
            loaded.map_err(|e| explain_program_error(e, name, &release))?;
        }
        Ok(program.info()?)
    }

    /// The loaded program of `hook`.
    fn loaded_program(&self, hook: Hook) -> Result<&aya::programs::Program, LoadError> {
        let name = self.loaded_name(hook)?;
        self.ebpf
            .program(name)
            .ok_or_else(|| LoadError::program_missing(name))
    }

    /// The name of `hook`'s program, or why it did not load.
    pub(super) fn loaded_name(&self, hook: Hook) -> Result<&'static str, LoadError> {
        let name = self.program_name(hook);
        match self.load_failure(hook) {
            Some(why) => Err(LoadError::NotLoaded {
                program: name,
                why: Some(why.to_string()),
            }),
            None => Ok(name),
        }
    }

    /// File descriptor of a loaded program (for BPF_PROG_TEST_RUN).
    pub fn program_fd(&self, hook: Hook) -> Result<BorrowedFd<'_>, LoadError> {
        Ok(self.loaded_program(hook)?.fd()?.as_fd())
    }

    /// Kernel info of the loaded program of `hook` (id, verified
    /// instruction count, run time when BPF stats are on).
    pub fn program_info(&self, hook: Hook) -> Result<aya::programs::ProgramInfo, LoadError> {
        Ok(self.loaded_program(hook)?.info()?)
    }

    /// Kernel info of tc ingress's checks program (tail-called; never
    /// attached).
    pub fn tc_checks_info(&self) -> Result<aya::programs::ProgramInfo, LoadError> {
        self.tail_program_info(TC_CHECKS_PROGRAM, self.tc_checks.is_some())
    }

    /// Kernel info of the tc hooks' BGP program (tail-called; never
    /// attached).
    pub fn tc_bgp_info(&self) -> Result<aya::programs::ProgramInfo, LoadError> {
        self.tail_program_info(TC_BGP_PROGRAM, self.tc_bgp.is_some())
    }

    /// Kernel info of XDP's BGP program (tail-called; never attached).
    pub fn xdp_bgp_info(&self) -> Result<aya::programs::ProgramInfo, LoadError> {
        self.tail_program_info(self.plan.xdp.bgp_program_name(), self.xdp_bgp.is_some())
    }

    /// Kernel info of XDP's checks program (tail-called; never attached).
    pub fn xdp_checks_info(&self) -> Result<aya::programs::ProgramInfo, LoadError> {
        self.tail_program_info(
            self.plan.xdp.checks_program_name(),
            self.xdp_checks.is_some(),
        )
    }

    fn tail_program_info(
        &self,
        name: &'static str,
        loaded: bool,
    ) -> Result<aya::programs::ProgramInfo, LoadError> {
        if !loaded {
            return Err(LoadError::NotLoaded {
                program: name,
                why: None,
            });
        }
        let program = self
            .ebpf
            .program(name)
            .ok_or_else(|| LoadError::Missing(format!("{name} missing")))?;
        Ok(program.info()?)
    }

    /// Kernel program ids of the packet programs, in the order xdp, tc
    /// ingress, tc egress; `None` for one not loaded (tc ingress until an
    /// interface needs it).
    pub fn program_ids(&self) -> Result<Vec<Option<u32>>, LoadError> {
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
fn load_program(ebpf: &mut Ebpf, name: &'static str, release: &str) -> Result<(), LoadError> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| LoadError::Missing(format!("program {name} missing from the object")))?;
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
    loaded: Result<(), LoadError>,
) -> Result<(), LoadError> {
    match loaded {
        Ok(()) => Ok(()),
        Err(e @ LoadError::PermissionDenied { .. }) => Err(e),
        Err(e) => {
            let why = error_chain(&e);
            tracing::warn!(program = name, error = %why, "program not loaded");
            failures.push((hook, why));
            Ok(())
        }
    }
}

/// Entries of the BGP map: its keys plus the free entries the kernel's
/// common LRU may hold on each CPU (see `observer_common::BGP_MAP`).
fn bgp_map_entries() -> Result<u32, MapsError> {
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
) -> Result<Option<ProgramArray<MapData>>, LoadError> {
    load_program(ebpf, program_name_tc_ingress(), release)?;
    Ok(load_tc_checks(ebpf, release)
        .inspect_err(|e| {
            tracing::warn!(
                error = %error_chain(e),
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
fn load_tc_checks(ebpf: &mut Ebpf, release: &str) -> Result<ProgramArray<MapData>, LoadError> {
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
    map: &'static str,
    release: &str,
) -> Result<ProgramArray<MapData>, LoadError> {
    load_program(ebpf, name, release)?;
    let mut array: ProgramArray<MapData> = ProgramArray::try_from(
        ebpf.take_map(map)
            .ok_or_else(|| LoadError::Missing(format!("{map} map missing")))?,
    )
    .map_err(MapsError::Map)?;
    let program = ebpf
        .program(name)
        .ok_or_else(|| LoadError::Missing(format!("{name} missing")))?;
    array
        .set(0, program.fd()?, 0)
        .map_err(|source| LoadError::MapWrite {
            program: name,
            map,
            source,
        })?;
    Ok(array)
}

/// Turns a program load error into one a person can act on: the program,
/// the kernel, what went wrong. The verifier's log goes to the debug log
/// (OBSERVER_LOG=debug), never into the message.
fn explain_program_error(e: ProgramError, name: &'static str, release: &str) -> LoadError {
    if let ProgramError::LoadError { verifier_log, .. } = &e {
        tracing::debug!(
            program = name,
            kernel = release,
            "verifier log:\n{verifier_log}"
        );
    }
    let (error, log) = match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } if io_error.raw_os_error() != Some(libc::EPERM) => (io_error, verifier_log.to_string()),
        ProgramError::LoadError { .. } => return explain_load_error(e.into(), release, None),
        _ => return explain_load_error(e.into(), release, Some(name)),
    };
    let (program, release) = (name, release.to_string());
    match (
        error.raw_os_error().unwrap_or(0),
        super::verifier_stats::processed(&log),
    ) {
        (libc::EACCES, processed) | (libc::EINVAL, processed @ Some(_)) => LoadError::Verifier {
            program,
            release,
            processed,
            error,
            log,
        },
        (libc::E2BIG, _) => LoadError::TooLarge {
            program,
            release,
            error,
            log,
        },
        _ => LoadError::MissingFeature {
            program,
            release,
            error,
            log,
        },
    }
}

/// What a refused load needs: the capabilities, or, when they are held,
/// a seccomp profile or LSM policy that lets bpf() through.
fn denied(release: &str, capabilities_granted: bool) -> String {
    if capabilities_granted {
        format!(
            "permission denied loading eBPF programs although CAP_BPF, CAP_NET_ADMIN and \
             CAP_PERFMON are held: a seccomp profile or an LSM (AppArmor, SELinux) refuses \
             bpf(). The default seccomp profiles of older container runtimes (Debian 12's \
             podman, containerd before 1.7) allow bpf() and perf_event_open() only with \
             CAP_SYS_ADMIN: run with a profile that allows them (Kubernetes: a Localhost \
             seccompProfile or Unconfined; podman: --security-opt seccomp=unconfined), or \
             use deploy/daemonset-privileged.yaml (this is {release})"
        )
    } else {
        format!(
            "permission denied loading eBPF programs: run as root, or grant CAP_BPF, \
             CAP_NET_ADMIN and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8; this is \
             {release})"
        )
    }
}

/// Turns permission errors into the capabilities to grant (or the
/// confinement to lift, when they are held); `program`: the program whose
/// load failed before the verifier, if it was one.
fn explain_load_error(e: AyaError, release: &str, program: Option<&'static str>) -> LoadError {
    let release = release.to_string();
    if e.errno() == Some(libc::EPERM) {
        return LoadError::PermissionDenied {
            release,
            program,
            capabilities_granted: preflight::missing_privileges().is_empty(),
            source: Box::new(e),
        };
    }
    LoadError::Object {
        release,
        program,
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_program_is_noted_and_a_permission_error_ends_the_load() {
        let mut failures = Vec::new();
        let refused = LoadError::Verifier {
            program: "observer_tc_in",
            release: "5.10.0-32-amd64".to_string(),
            processed: Some(12),
            error: io::Error::from_raw_os_error(libc::EACCES),
            log: "processed 12 insns".to_string(),
        };
        note_failure(
            &mut failures,
            Hook::TcIngress,
            "observer_tc_in",
            Err(refused),
        )
        .unwrap();
        assert_eq!(failures.len(), 1);
        assert!(
            failures[0]
                .1
                .starts_with("the verifier of kernel 5.10.0-32-amd64 rejected observer_tc_in after 12 instructions (Permission denied"),
            "{}",
            failures[0].1
        );

        // Map creation refused: aya's error holds the errno two levels down.
        let eperm = explain_load_error(
            EbpfError::MapError(MapError::CreateError {
                name: "FLOWS".to_string(),
                io_error: io::Error::from_raw_os_error(libc::EPERM),
            })
            .into(),
            "5.10.0-32-amd64",
            None,
        );
        let ended = note_failure(&mut failures, Hook::Xdp, "observer_xdp", Err(eperm)).unwrap_err();
        assert_eq!(failures.len(), 1, "not noted: the whole load fails");
        let text = format!("{:#}", anyhow::Error::from(ended));
        assert!(
            text.starts_with("permission denied loading eBPF programs")
                && text.contains("this is 5.10.0-32-amd64")
                && text.ends_with(
                    "failed to create map `FLOWS`: Operation not permitted (os error 1)"
                ),
            "{text}"
        );
    }

    #[test]
    fn a_refusal_despite_the_capabilities_names_seccomp_and_the_ways_out() {
        let held = denied("6.18.0", true);
        assert!(held.contains("although CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON are held"));
        assert!(held.contains("seccomp=unconfined") && held.contains("daemonset-privileged.yaml"));
        assert!(denied("6.18.0", false).contains("run as root, or grant CAP_BPF"));
    }

    #[test]
    fn a_program_refused_outside_the_verifier_names_it_in_front() {
        let e = explain_program_error(ProgramError::UnexpectedProgramType, "observer_xdp", "6.1.0");
        assert!(matches!(e, LoadError::Object { .. }));
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "loading observer_xdp: loading the eBPF object on kernel 6.1.0: unexpected program type"
        );
    }

    /// The texts are the ones the `anyhow` messages printed before the
    /// errors were typed (tests and scripts compare them).
    #[test]
    fn messages_read_as_before() {
        let release = "6.1.0".to_string();
        let eacces = || io::Error::from_raw_os_error(libc::EACCES);
        let cases = [
            (
                LoadError::Verifier {
                    program: "observer_xdp",
                    release: release.clone(),
                    processed: None,
                    error: eacces(),
                    log: String::new(),
                },
                format!(
                    "the verifier of kernel 6.1.0 rejected observer_xdp ({}). \
                     This kernel is supported (5.10+ with BTF), so this is an observer bug: \
                     please report it with the output of `OBSERVER_LOG=debug observer check`",
                    eacces()
                ),
            ),
            (
                LoadError::TooLarge {
                    program: "observer_xdp",
                    release: release.clone(),
                    error: eacces(),
                    log: String::new(),
                },
                format!(
                    "kernel 6.1.0 refused observer_xdp as too large for its verifier ({}); \
                     the observer supports 5.10 and newer",
                    eacces()
                ),
            ),
            (
                LoadError::MissingFeature {
                    program: "observer_xdp",
                    release: release.clone(),
                    error: eacces(),
                    log: String::new(),
                },
                format!(
                    "kernel 6.1.0 refused to load observer_xdp before verifying it ({}): \
                     it lacks a feature the program needs. The observer needs Linux 5.10 or newer \
                     with BTF; OBSERVER_LOG=debug shows the kernel's log",
                    eacces()
                ),
            ),
            (
                LoadError::CannotCount {
                    failures: vec![
                        (Hook::Xdp, "a".to_string()),
                        (Hook::TcIngress, "b".to_string()),
                    ],
                },
                "a; b. The observer needs Linux 5.10 or newer with BTF (CONFIG_DEBUG_INFO_BTF=y); \
                 `observer check` shows what this kernel supports"
                    .to_string(),
            ),
            (
                LoadError::NotLoaded {
                    program: "observer_tc_in",
                    why: Some("not loaded yet: no interface needed it".to_string()),
                },
                "observer_tc_in is not loaded: not loaded yet: no interface needed it".to_string(),
            ),
            (
                LoadError::NotLoaded {
                    program: "observer_tc_chk",
                    why: None,
                },
                "observer_tc_chk is not loaded".to_string(),
            ),
            (
                LoadError::FactsGeneration(MapsError::Poisoned),
                "starting the node facts generation: the slot reads' lock was poisoned".to_string(),
            ),
        ];
        for (error, text) in cases {
            assert_eq!(format!("{:#}", anyhow::Error::from(error)), text);
        }
    }
}
