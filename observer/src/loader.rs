//! Loads the eBPF object, configures it, attaches it to interfaces with bpf
//! links, and reads its maps. Dropping the [`Observer`] detaches everything.

use std::{
    ffi::CString,
    fmt, io,
    os::fd::{AsFd, BorrowedFd},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, PerCpuHashMap},
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode as AyaXdpMode,
        tc::{self, NlOptions, TcAttachOptions},
    },
};
use observer_common::{FLOWS_MAP, FlowKey, FlowValue, STATS_MAP, Stat, UDP_PORTS_MAP};

use crate::{
    flows::{FlowCounters, FlowId},
    ports::PortConfig,
};

/// The eBPF object built by build.rs from `observer-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// The three programs of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// XDP on ingress.
    Xdp,
    /// tc on ingress (when XDP cannot be used).
    TcIngress,
    /// tc on egress.
    TcEgress,
}

impl Hook {
    /// Program name in the object (and in `bpftool prog`).
    pub fn program_name(self) -> &'static str {
        match self {
            Hook::Xdp => "observer_xdp",
            Hook::TcIngress => "observer_tc_in",
            Hook::TcEgress => "observer_tc_out",
        }
    }
}

/// How to count received packets (`--xdp-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum XdpMode {
    /// Native XDP, else generic XDP, else tc ingress (when another program
    /// already owns the interface's XDP hook).
    #[default]
    Auto,
    /// Native (driver) XDP only; fail if the driver lacks it.
    Native,
    /// Generic (skb) XDP only.
    Generic,
    /// No XDP: count received packets with tc ingress.
    Off,
}

/// Which mechanism a program was attached with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachedWith {
    /// Native XDP through a bpf link.
    XdpNative,
    /// Generic XDP through a bpf link.
    XdpGeneric,
    /// tcx bpf link (kernel >= 6.6).
    Tcx,
    /// Classic clsact qdisc + cls_bpf filter (older kernels). Not a bpf
    /// link: a killed observer leaves this filter behind.
    Clsact,
}

impl fmt::Display for AttachedWith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachedWith::XdpNative => "xdp-native",
            AttachedWith::XdpGeneric => "xdp-generic",
            AttachedWith::Tcx => "tcx",
            AttachedWith::Clsact => "clsact",
        })
    }
}

/// One interface the observer is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Interface name.
    pub iface: String,
    /// Interface index.
    pub ifindex: u32,
    /// How received packets are counted.
    pub rx: AttachedWith,
    /// How sent packets are counted.
    pub tx: AttachedWith,
    /// Why XDP was not used, when `rx` fell back to tc.
    pub xdp_fallback_reason: Option<String>,
}

/// Settings fixed at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadConfig {
    /// Capacity of the flow map (entries shared by all CPUs).
    pub max_flows: u32,
    /// UDP port assignment.
    pub ports: PortConfig,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            max_flows: observer_common::DEFAULT_MAX_FLOWS,
            ports: PortConfig::default(),
        }
    }
}

/// Kernel-side self counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Keys in the flow map now.
    pub flow_entries: u64,
    /// Keys ever inserted.
    pub flow_inserts: u64,
    /// Keys evicted by the LRU (inserts minus live entries: nothing else deletes).
    pub flow_evictions: u64,
    /// Packets not counted because their key could not be inserted.
    pub flow_insert_failures: u64,
}

/// The loaded programs and their maps.
pub struct Observer {
    ebpf: Ebpf,
    attachments: Vec<Attachment>,
}

impl Observer {
    /// Loads and verifies all programs, and writes the port table.
    pub fn load(config: &LoadConfig) -> Result<Observer> {
        let entries = config.ports.entries().map_err(|e| anyhow!(e))?;
        if config.max_flows == 0 {
            bail!("--max-flows must be at least 1");
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(FLOWS_MAP, config.max_flows)
            .load(EBPF_OBJECT)
            .map_err(|e| explain_load_error(anyhow::Error::new(e)))?;
        for hook in [Hook::Xdp, Hook::TcIngress, Hook::TcEgress] {
            let program = ebpf.program_mut(hook.program_name()).with_context(|| {
                format!("program {} missing from the object", hook.program_name())
            })?;
            let loaded = match program {
                aya::programs::Program::Xdp(p) => p.load(),
                aya::programs::Program::SchedClassifier(p) => p.load(),
                _ => Err(ProgramError::UnexpectedProgramType),
            };
            loaded
                .map_err(|e| explain_load_error(anyhow::Error::new(e)))
                .with_context(|| format!("loading {}", hook.program_name()))?;
        }
        let mut ports: Array<_, u8> = Array::try_from(
            ebpf.map_mut(UDP_PORTS_MAP)
                .context("UDP_PORTS map missing")?,
        )?;
        for (port, value) in entries {
            ports
                .set(port as u32, value, 0)
                .with_context(|| format!("writing UDP port {port} into the port table"))?;
        }
        Ok(Observer {
            ebpf,
            attachments: Vec::new(),
        })
    }

    /// File descriptor of a loaded program (for BPF_PROG_TEST_RUN).
    pub fn program_fd(&self, hook: Hook) -> Result<BorrowedFd<'_>> {
        let program = self
            .ebpf
            .program(hook.program_name())
            .with_context(|| format!("program {} missing", hook.program_name()))?;
        Ok(program.fd()?.as_fd())
    }

    /// Kernel program ids, in the order xdp, tc ingress, tc egress.
    pub fn program_ids(&self) -> Result<Vec<u32>> {
        [Hook::Xdp, Hook::TcIngress, Hook::TcEgress]
            .iter()
            .map(|hook| {
                let program = self
                    .ebpf
                    .program(hook.program_name())
                    .with_context(|| format!("program {} missing", hook.program_name()))?;
                Ok(program.info()?.id())
            })
            .collect()
    }

    /// Interfaces attached so far.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    /// Attaches the ingress (XDP or tc) and egress (tc) programs to `iface`.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<&Attachment> {
        let ifindex = ifindex(iface)?;
        let (rx, xdp_fallback_reason) = self.attach_rx(iface, ifindex, mode)?;
        let tx = self.attach_tc(iface, TcAttachType::Egress, Hook::TcEgress)?;
        self.attachments.push(Attachment {
            iface: iface.to_string(),
            ifindex,
            rx,
            tx,
            xdp_fallback_reason,
        });
        Ok(self.attachments.last().expect("just pushed"))
    }

    fn attach_rx(
        &mut self,
        iface: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(AttachedWith, Option<String>)> {
        let tries: &[(AyaXdpMode, AttachedWith)] = match mode {
            XdpMode::Auto => &[
                (AyaXdpMode::Driver, AttachedWith::XdpNative),
                (AyaXdpMode::Skb, AttachedWith::XdpGeneric),
            ],
            XdpMode::Native => &[(AyaXdpMode::Driver, AttachedWith::XdpNative)],
            XdpMode::Generic => &[(AyaXdpMode::Skb, AttachedWith::XdpGeneric)],
            XdpMode::Off => &[],
        };
        let mut last_error = None;
        for (aya_mode, attached) in tries {
            let xdp: &mut Xdp = self.program(Hook::Xdp)?.try_into()?;
            match xdp.attach_to_if_index(ifindex, *aya_mode) {
                Ok(_) => return Ok((*attached, None)),
                Err(e) => last_error = Some(format!("{attached}: {}", error_chain(&e))),
            }
        }
        match (mode, last_error) {
            (XdpMode::Off, _) => {
                let rx = self.attach_tc(iface, TcAttachType::Ingress, Hook::TcIngress)?;
                Ok((rx, Some("--xdp-mode off".to_string())))
            }
            (XdpMode::Auto, Some(reason)) => {
                tracing::warn!(
                    iface,
                    %reason,
                    "XDP attach failed (another XDP program on the interface?); counting rx with tc ingress instead"
                );
                let rx = self.attach_tc(iface, TcAttachType::Ingress, Hook::TcIngress)?;
                Ok((rx, Some(reason)))
            }
            (_, reason) => bail!(
                "cannot attach XDP to {iface}: {}. The driver may lack this XDP mode, or another XDP program owns the interface; try --xdp-mode auto or --xdp-mode off",
                reason.unwrap_or_default()
            ),
        }
    }

    fn attach_tc(
        &mut self,
        iface: &str,
        attach_type: TcAttachType,
        hook: Hook,
    ) -> Result<AttachedWith> {
        let classifier: &mut SchedClassifier = self.program(hook)?.try_into()?;
        let tcx = classifier.attach_with_options(
            iface,
            attach_type,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        );
        let tcx_error = match tcx {
            Ok(_) => return Ok(AttachedWith::Tcx),
            Err(e) => error_chain(&e),
        };
        // Kernels before 6.6 have no tcx: fall back to a clsact filter.
        if let Err(e) = tc::qdisc_add_clsact(iface) {
            let text = error_chain(&e);
            if !text.contains("exists") {
                bail!(
                    "cannot attach tc {attach_type:?} to {iface}: tcx failed ({tcx_error}) and adding a clsact qdisc failed ({text})"
                );
            }
        }
        classifier
            .attach_with_options(iface, attach_type, TcAttachOptions::Netlink(NlOptions::default()))
            .map_err(|e| {
                anyhow!(
                    "cannot attach tc {attach_type:?} to {iface}: tcx failed ({tcx_error}), clsact failed ({})",
                    error_chain(&e)
                )
            })?;
        tracing::warn!(
            iface,
            "tcx unavailable; attached with clsact, which a killed observer leaves behind"
        );
        Ok(AttachedWith::Clsact)
    }

    fn program(&mut self, hook: Hook) -> Result<&mut aya::programs::Program> {
        self.ebpf
            .program_mut(hook.program_name())
            .with_context(|| format!("program {} missing", hook.program_name()))
    }

    fn flow_map(&self) -> Result<PerCpuHashMap<&MapData, FlowKey, FlowValue>> {
        Ok(PerCpuHashMap::try_from(
            self.ebpf.map(FLOWS_MAP).context("FLOWS map missing")?,
        )?)
    }

    /// Reads every row of the flow map, summed over CPUs.
    pub fn read_flows(&self) -> Result<Vec<(FlowId, FlowCounters)>> {
        let map = self.flow_map()?;
        let mut rows = Vec::new();
        for item in map.iter() {
            match item {
                Ok((key, values)) => {
                    rows.push((FlowId::from_key(&key), FlowCounters::sum(values.iter())))
                }
                // The LRU may evict a key between listing and reading it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(e).context("reading the FLOWS map"),
            }
        }
        Ok(rows)
    }

    /// Reads the kernel self counters.
    pub fn read_stats(&self) -> Result<KernelStats> {
        let stats: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(STATS_MAP).context("STATS map missing")?)?;
        let read = |stat: Stat| -> Result<u64> { Ok(stats.get(&(stat as u32), 0)?.iter().sum()) };
        let flow_entries = self.flow_map()?.keys().filter(|k| k.is_ok()).count() as u64;
        let flow_inserts = read(Stat::FlowInserts)?;
        Ok(KernelStats {
            flow_entries,
            flow_inserts,
            flow_evictions: flow_inserts.saturating_sub(flow_entries),
            flow_insert_failures: read(Stat::FlowInsertFailures)?,
        })
    }
}

/// Interface index of `iface` in the current network namespace.
pub fn ifindex(iface: &str) -> Result<u32> {
    let name =
        CString::new(iface).map_err(|_| anyhow!("interface name {iface:?} contains a NUL byte"))?;
    // SAFETY: valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!(
            "interface {iface} not found (list interfaces with `ip link`; use --netns NAME for one inside a network namespace)"
        );
    }
    Ok(index)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Turns permission errors into the capabilities to grant.
fn explain_load_error(e: anyhow::Error) -> anyhow::Error {
    let permission = e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
            || cause.to_string().contains("Operation not permitted")
    });
    if permission {
        return e.context(
            "permission denied loading eBPF programs: run as root, or grant CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON",
        );
    }
    e
}
