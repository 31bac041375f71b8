//! How each interface is observed: the hooks attached to it, as plain data
//! that `bpf` fills and `report` prints.

use std::fmt;

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
