//! Loads the eBPF object, configures it, attaches it to interfaces with bpf
//! links, and reads its maps. Dropping the [`Observer`] detaches everything.

use std::{
    collections::HashMap,
    ffi::CString,
    fmt, io,
    os::fd::{AsFd, BorrowedFd},
    path::Path,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, ProgramArray},
    programs::{
        BtfTracePoint, LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp,
        XdpMode as AyaXdpMode,
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions},
        xdp::XdpLinkId,
    },
};
use observer_common::{
    FLOWS_MAP, FlowKey, FlowValue, IFACE_MTU_MAP, REASON_NOT_REPORTED, SKB_LAYOUT_GLOBAL,
    STATS_MAP, SkbLayout, Stat, UDP_PORTS_MAP, WATCHED_MAP, WatchedIface,
};

pub mod btf;
pub mod features;
pub mod mirror;
pub mod testrun;
pub mod verifier_stats;

use crate::{
    bpf::btf::KernelBtf,
    bpf::features::{Features, Plan},
    model::flows::{FlowCounters, FlowId},
    model::ports::PortConfig,
    node::localnet,
    node::preflight,
};

/// The eBPF object built by build.rs from `observer-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// The three packet programs of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// XDP on ingress (the variant [`Features::plan`] picked).
    Xdp,
    /// tc on ingress (when XDP cannot be used).
    TcIngress,
    /// tc on egress.
    TcEgress,
}

impl Hook {
    /// Every packet hook.
    pub const ALL: [Hook; 3] = [Hook::Xdp, Hook::TcIngress, Hook::TcEgress];
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
    /// Load tc ingress (and its checks program) only when an interface
    /// needs it (XDP refused, or `--xdp-mode off`), as `attach` does: with
    /// XDP counting they would be verified for nothing. Tests, `check` and
    /// replay load everything at once.
    pub defer_tc_ingress: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            max_flows: observer_common::DEFAULT_MAX_FLOWS,
            ports: PortConfig::default(),
            defer_tc_ingress: false,
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

/// The link of the program counting received packets.
enum RxLink {
    Xdp(XdpLinkId),
    Tc(SchedClassifierLinkId),
}

/// The links of one attachment, to release them when the interface is
/// re-created.
struct Links {
    rx: Option<RxLink>,
    tx: Option<SchedClassifierLinkId>,
    mode: XdpMode,
    /// The interface exists and the links are live.
    present: bool,
}

/// A change [`Observer::follow_interfaces`] noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceEvent {
    /// The interface was deleted (its links went with it).
    Gone {
        /// Name.
        iface: String,
        /// The index it had.
        ifindex: u32,
    },
    /// An interface of that name exists again and the programs are attached.
    Reattached {
        /// Name.
        iface: String,
        /// Its new index.
        ifindex: u32,
    },
    /// It exists again but attaching failed (retried at the next check).
    Failed {
        /// Name.
        iface: String,
        /// Why.
        error: String,
    },
}

/// Which hook counts kernel drops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropHook {
    /// Not attached yet (no interface attached).
    Pending,
    /// skb:kfree_skb through tp_btf, by the named program.
    Attached(&'static str),
    /// Could not be attached: kernel drops are not counted.
    Unavailable(String),
}

/// The loaded programs and their maps.
pub struct Observer {
    ebpf: Ebpf,
    /// What the kernel offers, and the program variants picked for it.
    features: Features,
    plan: Plan,
    /// Why a packet program did not load, by hook (the others still run).
    load_failures: Vec<(Hook, String)>,
    /// tc ingress was loaded (or tried): it is deferred with
    /// [`LoadConfig::defer_tc_ingress`] until an interface needs it.
    tc_ingress_loaded: bool,
    /// The CHECKS program array with tc ingress's checks program, held
    /// open (see `load_tc_checks`); `None` when it did not load.
    tc_checks: Option<ProgramArray<MapData>>,
    attachments: Vec<Attachment>,
    /// Links of each attachment, same order.
    links: Vec<Links>,
    /// `enum skb_drop_reason` of the running kernel, value -> name.
    drop_reasons: HashMap<u32, String>,
    /// `enum skb_drop_reason_subsys`, for reasons of other subsystems.
    drop_subsystems: HashMap<u32, String>,
    /// Why kernel drops cannot be counted, when the BTF facts are missing.
    btf_problem: Option<String>,
    drop_hook: DropHook,
}

impl Observer {
    /// Probes the kernel, then loads and verifies the programs variants it
    /// supports, and writes the port table. Fails when the programs cannot
    /// count in either direction: tc egress, and XDP or tc ingress.
    pub fn load(config: &LoadConfig) -> Result<Observer> {
        let entries = config.ports.entries().map_err(|e| anyhow!(e))?;
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
            .override_global(SKB_LAYOUT_GLOBAL, &layout, true)
            .load(EBPF_OBJECT)
            .map_err(|e| explain_load_error(anyhow::Error::new(e), &features.release))?;
        let mut load_failures = Vec::new();
        for hook in [Hook::Xdp, Hook::TcEgress] {
            let name = program_name(&plan, hook);
            let loaded = load_program(&mut ebpf, name, &features.release);
            note_failure(&mut load_failures, hook, name, loaded)?;
        }
        // tc ingress now unless deferred; and always when XDP cannot count.
        let xdp_failed = load_failures.iter().any(|(h, _)| *h == Hook::Xdp);
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
            features,
            plan,
            load_failures,
            tc_ingress_loaded,
            tc_checks,
            attachments: Vec::new(),
            links: Vec::new(),
            drop_reasons,
            drop_subsystems,
            btf_problem,
            drop_hook: DropHook::Pending,
        })
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

    /// The kernel's name of drop reason `value` (`NETFILTER_DROP`, ...).
    /// Reasons of other subsystems (upper 16 bits set) are named
    /// `SUBSYSTEM:n`, e.g. `OPENVSWITCH:3`.
    pub fn drop_reason_name(&self, value: u32) -> String {
        if value == REASON_NOT_REPORTED {
            return "NOT_REPORTED".to_string();
        }
        let subsystem = value >> 16;
        if subsystem != 0 {
            let name = self
                .drop_subsystems
                .get(&subsystem)
                .cloned()
                .unwrap_or_else(|| format!("subsystem_{subsystem}"));
            return format!("{name}:{}", value & 0xffff);
        }
        self.drop_reasons
            .get(&value)
            .cloned()
            .unwrap_or_else(|| format!("reason_{value}"))
    }

    /// How kernel drops are counted.
    pub fn drop_hook(&self) -> &DropHook {
        &self.drop_hook
    }

    /// Kernel info (run time and count when BPF stats are on) of the
    /// attached kfree_skb program.
    pub fn drop_hook_info(&self) -> Result<aya::programs::ProgramInfo> {
        let DropHook::Attached(name) = self.drop_hook else {
            bail!("the kfree_skb program is not attached");
        };
        let program = self
            .ebpf
            .program(name)
            .with_context(|| format!("{name} missing"))?;
        Ok(program.info()?)
    }

    /// The loaded object, for modules that keep its maps in sync.
    pub(crate) fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// The loaded object, for modules that read its maps.
    pub(crate) fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    /// Attaches the skb:kfree_skb program variant of the plan once.
    /// Failure is reported, not fatal: packet counters work without it.
    fn attach_drop_hook(&mut self) {
        if self.drop_hook != DropHook::Pending {
            return;
        }
        if let Some(problem) = &self.btf_problem {
            self.drop_hook = DropHook::Unavailable(problem.clone());
            return;
        }
        let Some(name) = self.plan.drops.program_name() else {
            self.drop_hook = DropHook::Unavailable("this kernel has no BTF".to_string());
            return;
        };
        let attached = self.load_drop_program().and_then(|_| {
            let program: &mut BtfTracePoint = self
                .ebpf
                .program_mut(name)
                .with_context(|| format!("{name} missing"))?
                .try_into()?;
            program.attach()?;
            Ok(())
        });
        self.drop_hook = match attached {
            Ok(()) => DropHook::Attached(name),
            Err(e) => {
                let why = format!("skb:kfree_skb ({name}): {e:#}");
                tracing::warn!(%why, "kernel drops will not be counted");
                DropHook::Unavailable(why)
            }
        };
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
            program
                .load("kfree_skb", &btf)
                .map_err(|e| explain_program_error(e, name, &release))?;
        }
        Ok(program.info()?)
    }

    /// How many kernel drop reasons this kernel names (0 before 5.17).
    pub fn drop_reason_count(&self) -> usize {
        self.drop_reasons.len()
    }

    /// Tells the programs the MTU of interface `ifindex`: received tunnel
    /// packets above it count as `over_mtu`.
    pub fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> Result<()> {
        let mut mtus: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(IFACE_MTU_MAP)
                .context("IFACE_MTU map missing")?,
        )?;
        mtus.insert(ifindex, mtu, 0)?;
        Ok(())
    }

    /// Registers `ifindex` of the current namespace for the kernel drop
    /// filter and the MTU check.
    fn watch(&mut self, iface: &str, ifindex: u32) -> Result<()> {
        let netns = localnet::netns_inode()?;
        let mut watched: BpfHashMap<_, WatchedIface, u8> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(WATCHED_MAP)
                .context("WATCHED map missing")?,
        )?;
        watched.insert(WatchedIface { netns, ifindex }, 1, 0)?;
        match localnet::mtu(iface) {
            Ok(mtu) => self.set_mtu(ifindex, mtu)?,
            Err(e) => {
                tracing::warn!(iface, error = %format!("{e:#}"), "MTU unknown: over_mtu not checked")
            }
        }
        Ok(())
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
        if self.tc_checks.is_none() {
            bail!("{TC_CHECKS_PROGRAM} is not loaded");
        }
        let program = self
            .ebpf
            .program(TC_CHECKS_PROGRAM)
            .with_context(|| format!("{TC_CHECKS_PROGRAM} missing"))?;
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

    /// Interfaces attached so far.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    /// Programs attached now: two per interface present (rx and tx), plus
    /// the kfree_skb program.
    pub fn programs_attached(&self) -> usize {
        let interfaces = self.links.iter().filter(|l| l.present).count();
        2 * interfaces + usize::from(matches!(self.drop_hook, DropHook::Attached(_)))
    }

    /// Attaches the ingress (XDP or tc) and egress (tc) programs to `iface`.
    pub fn attach(&mut self, iface: &str, mode: XdpMode) -> Result<&Attachment> {
        let (attachment, links) = self.attach_links(iface, mode)?;
        self.attachments.push(attachment);
        self.links.push(links);
        Ok(self.attachments.last().expect("just pushed"))
    }

    fn attach_links(&mut self, iface: &str, mode: XdpMode) -> Result<(Attachment, Links)> {
        let ifindex = ifindex(iface)?;
        let (rx, xdp_fallback_reason, rx_link) = self.attach_rx(iface, ifindex, mode)?;
        let (tx, tx_link) = self.attach_tc(iface, TcAttachType::Egress, Hook::TcEgress)?;
        self.watch(iface, ifindex)?;
        self.attach_drop_hook();
        let attachment = Attachment {
            iface: iface.to_string(),
            ifindex,
            rx,
            tx,
            xdp_fallback_reason,
        };
        let links = Links {
            rx: Some(rx_link),
            tx: Some(tx_link),
            mode,
            present: true,
        };
        Ok((attachment, links))
    }

    /// Follows interfaces that were deleted or re-created since the last
    /// call: a deleted interface takes its bpf links with it; when one of
    /// that name exists again (a new ifindex), the programs are attached to
    /// it. Returns what changed. Rows of the old ifindex keep their totals.
    pub fn follow_interfaces(&mut self) -> Vec<InterfaceEvent> {
        let mut events = Vec::new();
        for i in 0..self.attachments.len() {
            let name = self.attachments[i].iface.clone();
            let now = ifindex(&name).ok();
            let old = self.attachments[i].ifindex;
            match now {
                Some(index) if index == old && self.links[i].present => {}
                None if self.links[i].present => {
                    self.links[i].present = false;
                    self.unwatch(old);
                    events.push(InterfaceEvent::Gone {
                        iface: name,
                        ifindex: old,
                    });
                }
                None => {}
                Some(index) => {
                    self.detach_links(i);
                    let mode = self.links[i].mode;
                    match self.attach_links(&name, mode) {
                        Ok((attachment, links)) => {
                            self.unwatch(old);
                            self.attachments[i] = attachment;
                            self.links[i] = links;
                            events.push(InterfaceEvent::Reattached {
                                iface: name,
                                ifindex: index,
                            });
                        }
                        Err(e) => {
                            self.links[i].present = false;
                            events.push(InterfaceEvent::Failed {
                                iface: name,
                                error: format!("{e:#}"),
                            });
                        }
                    }
                }
            }
        }
        events
    }

    /// Releases the (already defunct) links of attachment `i`.
    fn detach_links(&mut self, i: usize) {
        let links = &mut self.links[i];
        let (rx, tx) = (links.rx.take(), links.tx.take());
        if let Some(rx) = rx {
            let _ = match rx {
                RxLink::Xdp(id) => self
                    .program(Hook::Xdp)
                    .and_then(|p| Ok(<&mut Xdp>::try_from(p)?.detach(id)?)),
                RxLink::Tc(id) => self
                    .program(Hook::TcIngress)
                    .and_then(|p| Ok(<&mut SchedClassifier>::try_from(p)?.detach(id)?)),
            };
        }
        if let Some(tx) = tx {
            let _ = self
                .program(Hook::TcEgress)
                .and_then(|p| Ok(<&mut SchedClassifier>::try_from(p)?.detach(tx)?));
        }
    }

    fn unwatch(&mut self, ifindex: u32) {
        let Ok(netns) = localnet::netns_inode() else {
            return;
        };
        if let Some(map) = self.ebpf.map_mut(WATCHED_MAP)
            && let Ok(mut watched) = BpfHashMap::<_, WatchedIface, u8>::try_from(map)
        {
            let _ = watched.remove(&WatchedIface { netns, ifindex });
        }
        if let Some(map) = self.ebpf.map_mut(IFACE_MTU_MAP)
            && let Ok(mut mtus) = BpfHashMap::<_, u32, u32>::try_from(map)
        {
            let _ = mtus.remove(&ifindex);
        }
    }

    fn attach_rx(
        &mut self,
        iface: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(AttachedWith, Option<String>, RxLink)> {
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
                Ok(id) => return Ok((*attached, None, RxLink::Xdp(id))),
                Err(e) => last_error = Some(format!("{attached}: {}", error_chain(&e))),
            }
        }
        match (mode, last_error) {
            (XdpMode::Off, _) => {
                let (rx, id) = self.attach_tc(iface, TcAttachType::Ingress, Hook::TcIngress)?;
                Ok((rx, Some("--xdp-mode off".to_string()), RxLink::Tc(id)))
            }
            (XdpMode::Auto, Some(reason)) => {
                tracing::warn!(
                    iface,
                    %reason,
                    "XDP attach failed (another XDP program on the interface?); counting rx with tc ingress instead"
                );
                let (rx, id) = self.attach_tc(iface, TcAttachType::Ingress, Hook::TcIngress)?;
                Ok((rx, Some(reason), RxLink::Tc(id)))
            }
            (_, reason) => bail!(
                "cannot attach XDP to {iface}: {}. The driver may lack this XDP mode, or another XDP program owns the interface; try --xdp-mode auto or --xdp-mode off",
                reason.unwrap_or_default()
            ),
        }
    }

    /// Loads tc ingress now if it was deferred.
    fn ensure_tc_ingress(&mut self) -> Result<()> {
        if self.tc_ingress_loaded {
            return Ok(());
        }
        self.tc_ingress_loaded = true;
        match load_tc_ingress(&mut self.ebpf, &self.features.release) {
            Ok(checks) => {
                self.tc_checks = checks;
                Ok(())
            }
            Err(e) => {
                let text = format!("{e:#}");
                self.load_failures.push((Hook::TcIngress, text.clone()));
                bail!("{text}")
            }
        }
    }

    fn attach_tc(
        &mut self,
        iface: &str,
        attach_type: TcAttachType,
        hook: Hook,
    ) -> Result<(AttachedWith, SchedClassifierLinkId)> {
        if hook == Hook::TcIngress {
            self.ensure_tc_ingress()?;
        }
        let tcx_known_absent = self.features.tcx == Some(false);
        let classifier: &mut SchedClassifier = self.program(hook)?.try_into()?;
        let tcx_error = if tcx_known_absent {
            "this kernel has no tcx links".to_string()
        } else {
            match classifier.attach_with_options(
                iface,
                attach_type,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            ) {
                Ok(id) => return Ok((AttachedWith::Tcx, id)),
                Err(e) => error_chain(&e),
            }
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
        let id = classifier
            .attach_with_options(iface, attach_type, TcAttachOptions::Netlink(NlOptions::default()))
            .map_err(|e| {
                anyhow!(
                    "cannot attach tc {attach_type:?} to {iface}: tcx failed ({tcx_error}), clsact failed ({})",
                    error_chain(&e)
                )
            })?;
        if !tcx_known_absent {
            tracing::warn!(
                iface,
                %tcx_error,
                "tcx attach failed; attached with clsact, which a killed observer leaves behind"
            );
        }
        Ok((AttachedWith::Clsact, id))
    }

    fn program(&mut self, hook: Hook) -> Result<&mut aya::programs::Program> {
        let name = self.program_name(hook);
        if let Some(why) = self.load_failure(hook) {
            bail!("{name} is not loaded: {why}");
        }
        self.ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing"))
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
        // A key evicted while the walk stands on it makes the kernel restart
        // the walk from the first bucket: keys already listed come again.
        let mut seen = std::collections::HashSet::new();
        for item in map.iter() {
            match item {
                Ok((key, values)) => {
                    let id = FlowId::from_key(&key);
                    if seen.insert(id) {
                        rows.push((id, FlowCounters::sum(values.iter())));
                    }
                }
                // The LRU may evict a key between listing and reading it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(e).context("reading the FLOWS map"),
            }
        }
        Ok(rows)
    }

    /// Reads the kernel self counters (walks the flow map to count its
    /// entries; a caller that just read the rows uses [`Observer::stats_for`]).
    pub fn read_stats(&self) -> Result<KernelStats> {
        let flow_entries = self.flow_map()?.keys().filter(|k| k.is_ok()).count() as u64;
        self.stats_for(flow_entries)
    }

    /// The kernel self counters, given the number of flow-map entries (the
    /// length of a [`Observer::read_flows`] just made), so the map is walked
    /// once per interval, not twice.
    pub fn stats_for(&self, flow_entries: u64) -> Result<KernelStats> {
        let stats: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(STATS_MAP).context("STATS map missing")?)?;
        let read = |stat: Stat| -> Result<u64> { Ok(stats.get(&(stat as u32), 0)?.iter().sum()) };
        let flow_inserts = read(Stat::FlowInserts)?;
        Ok(KernelStats {
            flow_entries,
            flow_inserts,
            flow_evictions: flow_inserts.saturating_sub(flow_entries),
            flow_insert_failures: read(Stat::FlowInsertFailures)?,
        })
    }
}

/// tc ingress's drop checks, reached by a tail call.
pub const TC_CHECKS_PROGRAM: &str = "observer_tc_chk";

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

/// Loads tc ingress and its checks program; returns the CHECKS array
/// (`None` when only the checks program failed: tc ingress then counts
/// without drop checks, which is logged).
fn load_tc_ingress(ebpf: &mut Ebpf, release: &str) -> Result<Option<ProgramArray<MapData>>> {
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

/// Loads tc ingress's checks program and puts it into the CHECKS program
/// array, where tc ingress tail-calls it. The caller keeps the array: the
/// kernel empties a program array when userspace closes its last fd.
fn load_tc_checks(ebpf: &mut Ebpf, release: &str) -> Result<ProgramArray<MapData>> {
    load_program(ebpf, TC_CHECKS_PROGRAM, release)?;
    let mut checks: ProgramArray<MapData> = ProgramArray::try_from(
        ebpf.take_map(observer_common::CHECKS_MAP)
            .context("CHECKS map missing")?,
    )?;
    let program = ebpf
        .program(TC_CHECKS_PROGRAM)
        .with_context(|| format!("{TC_CHECKS_PROGRAM} missing"))?;
    checks
        .set(0, program.fd()?, 0)
        .context("writing the checks program into CHECKS")?;
    Ok(checks)
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
fn explain_load_error(e: anyhow::Error, release: &str) -> anyhow::Error {
    let permission = e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
            || cause.to_string().contains("Operation not permitted")
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
