//! The only code that touches the eBPF object: [`Observer`] loads it
//! (`load`), attaches it to interfaces with bpf links (`attach`), and reads
//! and writes its maps (`maps`, which `slots` tells which slots of the
//! per-CPU slot arrays to read); `btf`, `features` and `verifier_stats`
//! read the running kernel, `testrun` runs programs on frames, `evidence`
//! opens the evidence rings. Dropping the
//! [`Observer`] detaches everything.
//!
//! Errors are typed where a caller tells failures apart: [`LoadError`]
//! (`load`), [`AttachError`] (`attach`), [`MapsError`] (`maps`); the
//! commands take them into `anyhow` with `?`, and `{:#}` of the `anyhow`
//! error prints their chain of causes as it always did.

use std::sync::Mutex;

use aya::{
    Ebpf,
    maps::{MapData, ProgramArray},
    programs::{tc::SchedClassifierLinkId, xdp::XdpLinkId},
};

pub mod attach;
mod batch;
pub mod btf;
pub mod evidence;
pub mod features;
pub mod load;
pub mod maps;
mod slots;
pub mod testrun;
pub mod verifier_stats;

pub use crate::model::hooks::{AttachedWith, Attachment};
pub use attach::{AttachError, Interface};
pub use load::{AyaError, LoadError, TC_BGP_PROGRAM, TC_CHECKS_PROGRAM};
pub use maps::MapsError;

use crate::{
    bpf::{
        features::{Features, Plan},
        slots::SlotTrackers,
    },
    model::{ports::PortConfig, rows::KernelReasons},
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

/// The link of the program counting received packets.
pub(crate) enum RxLink {
    Xdp(XdpLinkId),
    Tc(SchedClassifierLinkId),
}

/// The links of one attachment, to release them when the interface is
/// re-created.
pub(crate) struct Links {
    pub(crate) rx: Option<RxLink>,
    pub(crate) tx: Option<SchedClassifierLinkId>,
    pub(crate) mode: XdpMode,
    /// The interface exists and the links are live.
    pub(crate) present: bool,
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
    /// The BGP_PROG program array with the tc hooks' BGP program, held
    /// open likewise; `None` when it did not load.
    tc_bgp: Option<ProgramArray<MapData>>,
    /// The XDP_BGP_PROG program array with XDP's BGP program, likewise.
    xdp_bgp: Option<ProgramArray<MapData>>,
    /// XDP's checks program array, when that program loaded.
    xdp_checks: Option<ProgramArray<MapData>>,
    attachments: Vec<Attachment>,
    /// Links of each attachment, same order.
    links: Vec<Links>,
    /// The running kernel's drop reason names.
    kernel_reasons: KernelReasons,
    /// Why kernel drops cannot be counted, when the BTF facts are missing.
    btf_problem: Option<String>,
    drop_hook: DropHook,
    /// Which slots of the flow cache and the plain counters the next read
    /// reads (`slots`); behind a lock because rows are read through `&self`.
    slot_reads: Mutex<SlotTrackers>,
}

impl Observer {
    /// The running kernel's drop reason names.
    pub fn kernel_reasons(&self) -> &KernelReasons {
        &self.kernel_reasons
    }
}

/// An error and its causes, joined by ": " as `anyhow` prints them with
/// `{:#}` (a typed error prints only its own message with `{:#}`).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
