//! Attaching: XDP (native, generic), tcx or clsact for tc, tp_btf for
//! kfree_skb, with the fallbacks; following interfaces that are deleted and
//! re-created.

use std::ffi::CString;

use crate::node::localnet;

use aya::programs::{
    BtfTracePoint, LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp,
    XdpMode as AyaXdpMode,
    tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcError},
};

use super::{
    AttachedWith, Attachment, DropHook, Hook, InterfaceEvent, Links, Observer, RxLink, XdpMode,
    error_chain,
    load::{LoadError, load_tc_ingress, release_loader_memory},
    maps::MapsError,
};

/// Why attaching to an interface failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No interface of that name in the current network namespace.
    #[error(
        "interface {iface} not found (list interfaces with `ip link`; use --netns NAME for one inside a network namespace)"
    )]
    InterfaceNotFound { iface: String },
    /// The name cannot be an interface's.
    #[error("interface name {iface:?} contains a NUL byte")]
    InvalidName { iface: String },
    /// XDP refused in every mode tried (`--xdp-mode native` or `generic`);
    /// `reason`: the last mode's refusal.
    #[error(
        "cannot attach XDP to {iface}: {reason}. The driver may lack this XDP mode, or another XDP program owns the interface; try --xdp-mode auto or --xdp-mode off"
    )]
    XdpRefused { iface: String, reason: String },
    /// tc: no tcx link (`tcx`: why), and no clsact qdisc could be added
    /// for a filter (`error`).
    #[error(
        "cannot attach tc {direction:?} to {iface}: tcx failed ({tcx}) and adding a clsact qdisc failed ({error})"
    )]
    ClsactQdisc {
        iface: String,
        direction: TcAttachType,
        tcx: String,
        error: String,
    },
    /// tc: neither a tcx link (`tcx`: why) nor a clsact filter (`error`).
    #[error(
        "cannot attach tc {direction:?} to {iface}: tcx failed ({tcx}), clsact failed ({error})"
    )]
    TcRefused {
        iface: String,
        direction: TcAttachType,
        tcx: String,
        error: String,
    },
    /// The kfree_skb program is not attached (its counters were asked for).
    #[error("the kfree_skb program is not attached")]
    DropHookNotAttached,
    /// The program to attach did not load, or is not in the object.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Registering the interface in the programs' maps failed.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// aya refused (a program of the wrong type, its info).
    #[error(transparent)]
    Program(#[from] ProgramError),
}

impl Observer {
    /// How kernel drops are counted.
    pub fn drop_hook(&self) -> &DropHook {
        &self.drop_hook
    }

    /// Kernel info (run time and count when BPF stats are on) of the
    /// attached kfree_skb program.
    pub fn drop_hook_info(&self) -> Result<aya::programs::ProgramInfo, AttachError> {
        let DropHook::Attached(name) = self.drop_hook else {
            return Err(AttachError::DropHookNotAttached);
        };
        let program = self
            .ebpf
            .program(name)
            .ok_or_else(|| LoadError::Missing(format!("{name} missing")))?;
        Ok(program.info()?)
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
                .ok_or_else(|| LoadError::Missing(format!("{name} missing")))?
                .try_into()?;
            program.attach()?;
            Ok(())
        });
        self.drop_hook = match attached {
            Ok(()) => DropHook::Attached(name),
            Err(e) => {
                let why = format!("skb:kfree_skb ({name}): {}", error_chain(&e));
                tracing::warn!(%why, "kernel drops will not be counted");
                DropHook::Unavailable(why)
            }
        };
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
    pub fn attach(&mut self, iface: &Interface, mode: XdpMode) -> Result<&Attachment, AttachError> {
        let (attachment, links) = self.attach_links(&iface.name, iface.ifindex, mode)?;
        self.attachments.push(attachment);
        self.links.push(links);
        Ok(self.attachments.last().expect("just pushed"))
    }

    fn attach_links(
        &mut self,
        iface: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(Attachment, Links), AttachError> {
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
                    match self.attach_links(&name, index, mode) {
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
                                error: error_chain(&e),
                            });
                        }
                    }
                }
            }
        }
        events
    }

    /// Whether re-attaching may still load a program: tc ingress was
    /// deferred, and an interface in `--xdp-mode auto` falls back to it
    /// when it comes back and XDP is refused there.
    pub fn may_load_on_reattach(&self) -> bool {
        !self.tc_ingress_loaded && self.links.iter().any(|l| l.mode == XdpMode::Auto)
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

    fn attach_rx(
        &mut self,
        iface: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(AttachedWith, Option<String>, RxLink), AttachError> {
        if mode == XdpMode::Auto
            && let Some(why) = self.tc_is_cheaper(iface)
        {
            match self.attach_tc(iface, TcAttachType::Ingress, Hook::TcIngress) {
                Ok((rx, id)) => return Ok((rx, Some(why), RxLink::Tc(id))),
                Err(e) => tracing::warn!(
                    iface,
                    error = %error_chain(&e),
                    "tc ingress attach failed; trying XDP"
                ),
            }
        }
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
            (_, reason) => Err(AttachError::XdpRefused {
                iface: iface.to_string(),
                reason: reason.unwrap_or_default(),
            }),
        }
    }

    /// Why `--xdp-mode auto` counts `iface`'s received packets with tc
    /// instead of XDP, or `None` to use XDP.
    ///
    /// On a veth, native XDP switches the pair to veth's NAPI receive path,
    /// which copies every frame lacking XDP headroom into a page (about
    /// 0.5 µs a packet on the bench's veth, more than the observer's whole
    /// work); tc ingress sees the same packets with none of that. Only with
    /// tcx (6.6+), whose bpf link goes away with the process: a clsact
    /// filter would outlive a killed observer, so older kernels keep XDP.
    fn tc_is_cheaper(&self, iface: &str) -> Option<String> {
        if self.features.tcx != Some(true) {
            return None;
        }
        let driver = localnet::driver(iface).ok()?;
        (driver == "veth").then(|| {
            "auto: veth, where native XDP would move the pair to its copy path; tc counts the same packets for less".to_string()
        })
    }

    /// Loads tc ingress now if it was deferred.
    fn ensure_tc_ingress(&mut self) -> Result<(), LoadError> {
        if self.tc_ingress_loaded {
            return Ok(());
        }
        self.tc_ingress_loaded = true;
        let loaded = load_tc_ingress(&mut self.ebpf, &self.features.release);
        release_loader_memory();
        match loaded {
            Ok(checks) => {
                self.tc_checks = checks;
                Ok(())
            }
            Err(e) => {
                self.load_failures.push((Hook::TcIngress, error_chain(&e)));
                Err(e)
            }
        }
    }

    fn attach_tc(
        &mut self,
        iface: &str,
        attach_type: TcAttachType,
        hook: Hook,
    ) -> Result<(AttachedWith, SchedClassifierLinkId), AttachError> {
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
        match tc::qdisc_add_clsact(iface) {
            Ok(()) => {}
            // Another tool (or an earlier run) added it: filters share it.
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                return Err(AttachError::ClsactQdisc {
                    iface: iface.to_string(),
                    direction: attach_type,
                    tcx: tcx_error,
                    error: error_chain(&e),
                });
            }
        }
        let id = classifier
            .attach_with_options(
                iface,
                attach_type,
                TcAttachOptions::Netlink(NlOptions::default()),
            )
            .map_err(|e| AttachError::TcRefused {
                iface: iface.to_string(),
                direction: attach_type,
                tcx: tcx_error.clone(),
                error: error_chain(&e),
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

    fn program(&mut self, hook: Hook) -> Result<&mut aya::programs::Program, LoadError> {
        let name = self.loaded_name(hook)?;
        self.ebpf
            .program_mut(name)
            .ok_or_else(|| LoadError::program_missing(name))
    }
}

/// An interface to attach to: its name, and its index in the current
/// network namespace when it was looked up (once, before loading).
#[derive(Clone, Debug)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
}

impl Interface {
    /// `name` and its index now; fails, naming the fix, if there is none.
    pub fn resolve(name: &str) -> Result<Interface, AttachError> {
        Ok(Interface {
            name: name.to_string(),
            ifindex: ifindex(name)?,
        })
    }
}

/// Interface index of `iface` in the current network namespace.
fn ifindex(iface: &str) -> Result<u32, AttachError> {
    let name = CString::new(iface).map_err(|_| AttachError::InvalidName {
        iface: iface.to_string(),
    })?;
    // SAFETY: valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(AttachError::InterfaceNotFound {
            iface: iface.to_string(),
        });
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_interface_names_the_fix() {
        let e = Interface::resolve("nosuch0").unwrap_err();
        assert!(matches!(e, AttachError::InterfaceNotFound { .. }));
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "interface nosuch0 not found (list interfaces with `ip link`; use --netns NAME for one inside a network namespace)"
        );
        assert!(matches!(
            Interface::resolve("a\0b"),
            Err(AttachError::InvalidName { .. })
        ));
    }
}
