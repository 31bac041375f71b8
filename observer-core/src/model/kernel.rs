//! What a kernel offers the observer, as plain data: the probed features
//! (`bpf::features` probes them), the program variants and fallbacks they
//! call for, and how each tunnel device kind is available. `observer check`
//! and the `attach` line print them.

use serde::Serialize;

/// The hook name of the fallback `replay --kernel` takes where XDP test
/// runs rewrite the XDP dispatcher.
pub const REPLAY_KERNEL: &str = "replay --kernel";

/// The kernel's BTF, needed for CO-RE programs (kernel drop reasons).
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel features the observer's hooks depend on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Features {
    /// `uname -r`.
    pub release: String,
    /// Why the kernel's BTF cannot be used, when it cannot (no
    /// /sys/kernel/btf/vmlinux, or it does not parse).
    pub btf_problem: Option<String>,
    /// Multi-buffer XDP (`BPF_F_XDP_HAS_FRAGS` and `bpf_xdp_get_buff_len`,
    /// 5.18): the XDP program can attach to jumbo-MTU devices.
    pub xdp_frags: bool,
    /// tcx bpf links for tc programs (6.6). `None` when unknown (no BTF):
    /// attaching tries tcx first and falls back to clsact.
    pub tcx: Option<bool>,
    /// `skb:kfree_skb` carries a drop reason (5.17). `None` when unknown
    /// (no BTF; kernel drops are then not counted at all).
    pub drop_reasons: Option<bool>,
}

impl Features {
    /// The program variants and attach mechanisms these features call for,
    /// with what each fallback costs.
    pub fn plan(&self) -> Plan {
        let mut fallbacks = Vec::new();
        let xdp = if self.xdp_frags {
            XdpProgram::MultiBuffer
        } else {
            fallbacks.push(Fallback {
                hook: "xdp",
                missing: "multi-buffer XDP (BPF_F_XDP_HAS_FRAGS, bpf_xdp_get_buff_len; Linux 5.18)",
                instead: "the single-buffer XDP program",
                effect: "every frame is still counted; a driver refuses native XDP on an interface whose MTU exceeds its single-buffer limit (jumbo frames), and --xdp-mode auto then counts with generic XDP there",
            });
            XdpProgram::SingleBuffer
        };
        match self.tcx {
            Some(true) => {}
            Some(false) => fallbacks.push(Fallback {
                hook: "tc",
                missing: "tcx bpf links (Linux 6.6)",
                instead: "clsact qdisc filters",
                effect: "a clean exit removes the filters, but a killed observer (kill -9) leaves them attached: they pass every packet but cost CPU until removed (`tc filter show dev IFACE ingress` lists observer_tc_in with its pref; `tc filter del dev IFACE ingress pref N` removes it; the same for egress and observer_tc_out)",
            }),
            None => {}
        }
        let drops = match self.drop_reasons {
            Some(true) => DropProgram::WithReason,
            Some(false) => {
                fallbacks.push(Fallback {
                    hook: "kernel drops",
                    missing: "the drop reason argument of skb:kfree_skb (Linux 5.17)",
                    instead: "the two-argument skb:kfree_skb program",
                    effect: "kernel drops on watched interfaces are counted with reason NOT_REPORTED instead of the kernel's reason",
                });
                DropProgram::WithoutReason
            }
            None => {
                fallbacks.push(Fallback {
                    hook: "kernel drops",
                    missing: "kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y)",
                    instead: "nothing",
                    effect: "kernel drops are not counted; packet counters and classifier drops work",
                });
                DropProgram::None
            }
        };
        if xdp_test_run_rewrites_dispatcher(&self.release) {
            fallbacks.push(Fallback {
                hook: REPLAY_KERNEL,
                missing: "XDP test runs that leave the XDP dispatcher alone (Linux 5.16; the dispatcher update waits for its users from 6.2 and 6.1.103)",
                instead: "the tc ingress program (the same parser and checks) for received frames",
                effect: "replay --kernel counts the same; a stream of XDP test runs would rewrite the dispatcher under XDP programs handling traffic and can lock a CPU up, so it is never run; attaching and detaching rewrite it once each",
            });
        }
        Plan {
            xdp,
            drops,
            fallbacks,
        }
    }
}

/// Which XDP program variant to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XdpProgram {
    /// `observer_xdp`, with `frags`.
    MultiBuffer,
    /// `observer_xdp_sb`, without.
    SingleBuffer,
}

impl XdpProgram {
    /// Program name in the object.
    pub fn program_name(self) -> &'static str {
        match self {
            XdpProgram::MultiBuffer => "observer_xdp",
            XdpProgram::SingleBuffer => "observer_xdp_sb",
        }
    }

    /// Name of its BGP program (tail-called; the same variant, since the
    /// kernel refuses a tail call between the two).
    pub fn bgp_program_name(self) -> &'static str {
        match self {
            XdpProgram::MultiBuffer => "observer_xdp_bgp",
            XdpProgram::SingleBuffer => "observer_xdp_bgp_sb",
        }
    }

    /// Name of its checks program (tail-called; the same variant).
    pub fn checks_program_name(self) -> &'static str {
        match self {
            XdpProgram::MultiBuffer => "observer_xdp_chk",
            XdpProgram::SingleBuffer => "observer_xdp_chk_sb",
        }
    }
}

/// Which kfree_skb program variant to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropProgram {
    /// `observer_kfree`: skb, location, reason.
    WithReason,
    /// `observer_kfree2`: skb, location.
    WithoutReason,
    /// No BTF: no kernel drop program.
    None,
}

impl DropProgram {
    /// Program name in the object, if any.
    pub fn program_name(self) -> Option<&'static str> {
        match self {
            DropProgram::WithReason => Some("observer_kfree"),
            DropProgram::WithoutReason => Some("observer_kfree2"),
            DropProgram::None => None,
        }
    }
}

/// A feature this kernel lacks, what the observer uses instead, and what
/// that changes for the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    /// The hook concerned: `xdp`, `tc`, `kernel drops`.
    pub hook: &'static str,
    /// The missing kernel feature (and the release that brought it).
    pub missing: &'static str,
    /// What is used instead.
    pub instead: &'static str,
    /// What the user sees differently.
    pub effect: &'static str,
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: this kernel lacks {}; using {}: {}",
            self.hook, self.missing, self.instead, self.effect
        )
    }
}

/// Program variants chosen for this kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The XDP program.
    pub xdp: XdpProgram,
    /// The kernel drop program.
    pub drops: DropProgram,
    /// Every fallback in use, in hook order.
    pub fallbacks: Vec<Fallback>,
}

/// Whether a BPF_PROG_TEST_RUN of an XDP program rewrites the kernel's
/// XDP dispatcher on the kernel `release` (`uname -r`).
///
/// Before 5.16 every XDP test run adds its program to the dispatcher and
/// removes it again: two rewrites of the dispatcher's image per run
/// (upstream de21d8bf7772 stopped it for a single repeat). Before 6.2
/// (4121d4481b72; in 6.1.103, never backported to 5.10 or 5.15) a rewrite
/// does not wait for CPUs still running the old image, so a stream of test
/// runs while XDP programs handle traffic on other CPUs can rewrite the
/// code under them: 5.10 in qemu locked up in `bpf_dispatcher_xdp_func`
/// under `bpf_prog_test_run_xdp` while a ping ran through an attached XDP
/// program. No BTF type or symbol tells whether the fix is there, so the
/// release decides; an unreadable one counts as affected.
pub fn xdp_test_run_rewrites_dispatcher(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) < (5, 16),
        _ => true,
    }
}

/// How a kind is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    /// Compiled into the kernel.
    BuiltIn,
    /// Its module is loaded.
    Loaded,
    /// Its module exists and loads when such a device is first created.
    Module,
    /// Not in this kernel.
    Absent,
    /// Neither the kernel config nor module lists could be read.
    Unknown,
}

impl std::fmt::Display for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Availability::BuiltIn => "built in",
            Availability::Loaded => "module loaded",
            Availability::Module => "module",
            Availability::Absent => "absent",
            Availability::Unknown => "unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_test_runs_rewrite_the_dispatcher_before_5_16() {
        for affected in [
            "5.10.0-32-amd64",
            "5.15.0-100-generic",
            "4.19.0",
            "unknown",
            "",
        ] {
            assert!(xdp_test_run_rewrites_dispatcher(affected), "{affected}");
        }
        for fixed in ["5.16.0", "6.1.0-50-amd64", "6.12.117+deb13-amd64", "6.18.0"] {
            assert!(!xdp_test_run_rewrites_dispatcher(fixed), "{fixed}");
        }
    }

    fn features(xdp_frags: bool, tcx: Option<bool>, drop_reasons: Option<bool>) -> Features {
        Features {
            release: "6.18.0".to_string(),
            btf_problem: None,
            xdp_frags,
            tcx,
            drop_reasons,
        }
    }

    #[test]
    fn a_current_kernel_needs_no_fallback() {
        let plan = features(true, Some(true), Some(true)).plan();
        assert_eq!(plan.xdp, XdpProgram::MultiBuffer);
        assert_eq!(plan.drops, DropProgram::WithReason);
        assert!(plan.fallbacks.is_empty());
    }

    #[test]
    fn a_5_10_kernel_gets_every_fallback_named() {
        let plan = Features {
            release: "5.10.0-32-amd64".to_string(),
            ..features(false, Some(false), Some(false))
        }
        .plan();
        assert_eq!(plan.xdp, XdpProgram::SingleBuffer);
        assert_eq!(plan.drops, DropProgram::WithoutReason);
        let hooks: Vec<&str> = plan.fallbacks.iter().map(|f| f.hook).collect();
        assert_eq!(hooks, ["xdp", "tc", "kernel drops", "replay --kernel"]);
        let replay = plan.fallbacks[3].to_string();
        assert!(
            replay.contains("5.16") && replay.contains("tc ingress"),
            "{replay}"
        );
        let text = plan.fallbacks[2].to_string();
        assert!(
            text.contains("5.17") && text.contains("NOT_REPORTED"),
            "{text}"
        );
    }

    #[test]
    fn without_btf_kernel_drops_are_off() {
        let plan = features(true, None, None).plan();
        assert_eq!(plan.drops, DropProgram::None);
        assert_eq!(plan.drops.program_name(), None);
        assert_eq!(plan.fallbacks.len(), 1);
    }
}
