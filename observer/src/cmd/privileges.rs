//! Least privilege once attached. Loading and attaching take CAP_BPF,
//! CAP_PERFMON and CAP_NET_ADMIN (CAP_SYS_ADMIN too for `--netns`, and
//! root holds every capability); what a run does afterwards needs far less
//! (the README's "Privileges and requirements" says which and why).
//! [`drop_to_steady_state`] keeps only that, for this process and for the
//! node tools it runs, and sets `no_new_privs`, so that nothing it executes
//! gains more (no setuid program, no file capabilities).
//!
//! Capabilities and `no_new_privs` belong to each thread: the drop runs
//! while the process has a single thread, and every thread started later
//! inherits the reduced sets.

use std::fmt;

use anyhow::{Result, anyhow, bail};
use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities a run keeps after attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteadyState {
    /// This process's permitted and effective sets.
    pub process: CapsHashSet,
    /// What the node tools it runs (ipset, nft, iptables-save, iptables)
    /// get: the inheritable set, the ambient set for a non-root process
    /// and, where the process may change it, the bounding set.
    pub tools: CapsHashSet,
}

impl SteadyState {
    /// What to keep of `held`, the effective set the programs were loaded
    /// and attached with; `may_load` when a program may still have to be
    /// loaded (tc ingress, deferred, for an interface that comes back).
    pub fn of(held: &CapsHashSet, may_load: bool) -> SteadyState {
        // ipset, nft and iptables-nft speak nfnetlink, which answers only
        // CAP_NET_ADMIN; iptables-legacy reads its counters through a raw
        // socket (CAP_NET_RAW), kept when it was granted. Re-attaching to
        // a re-created interface needs CAP_NET_ADMIN as well.
        let tools: CapsHashSet = [Capability::CAP_NET_ADMIN, Capability::CAP_NET_RAW]
            .into_iter()
            .filter(|cap| held.contains(cap))
            .collect();
        let mut process = tools.clone();
        // bpf() on the maps and programs already held: kernels before 5.19
        // refuse every bpf command without CAP_BPF when
        // kernel.unprivileged_bpf_disabled is set (the default of most
        // distributions), and re-attaching to a re-created interface
        // creates bpf links. CAP_SYS_ADMIN stands in where the process had
        // no CAP_BPF (a runtime that does not know it), as in the preflight.
        if let Some(bpf) = [Capability::CAP_BPF, Capability::CAP_SYS_ADMIN]
            .into_iter()
            .find(|cap| held.contains(cap))
        {
            process.insert(bpf);
        }
        // The verifier rejects the programs of a loader without
        // CAP_PERFMON (measured on 6.18: every one, within a few
        // instructions). CAP_SYS_ADMIN, when kept above, covers it.
        if may_load && held.contains(&Capability::CAP_PERFMON) {
            process.insert(Capability::CAP_PERFMON);
        }
        SteadyState { process, tools }
    }
}

/// Drops every capability the steady state does not need (see
/// [`SteadyState::of`], `may_load` as there) and sets `no_new_privs`;
/// logs what was kept. Call once, after the last attach and before any
/// thread starts.
///
/// Fails, naming the step, when the kernel refuses a step (a seccomp
/// profile or security module that forbids capset or prctl) or when other
/// threads already run. The failure is fatal to the run: the README and
/// the DaemonSet promise these sets while the observer reads text others
/// control, and a refused drop at start is seen at once, before counting.
pub fn drop_to_steady_state(may_load: bool) -> Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(|e| {
            anyhow!("dropping capabilities: cannot count the threads in /proc/self/task: {e}")
        })?
        .count();
    if threads != 1 {
        bail!(
            "dropping capabilities: {threads} threads run, and capabilities belong to each thread; the drop must come before any thread starts (an observer bug: please report it)"
        );
    }
    let held = read(CapSet::Effective)?;
    let keep = SteadyState::of(&held, may_load);
    // The bounding set limits what a program executed by root gets; only
    // a holder of CAP_SETPCAP may shrink it (root, not a container that
    // dropped it: there the runtime set it already).
    if held.contains(&Capability::CAP_SETPCAP) {
        for cap in read(CapSet::Bounding)?.difference(&keep.tools) {
            caps::drop(None, CapSet::Bounding, *cap).map_err(|e| {
                anyhow!("dropping capabilities: dropping {cap} from the bounding set: {e}")
            })?;
        }
    }
    // Effective first: the kernel refuses a permitted set that does not
    // hold the effective one.
    set(CapSet::Effective, &keep.process)?;
    set(CapSet::Permitted, &keep.process)?;
    set(CapSet::Inheritable, &keep.tools)?;
    // A root process's tools get the bounding and inheritable sets; a
    // non-root one's get only the ambient set.
    // SAFETY: geteuid has no preconditions.
    let ambient = if unsafe { libc::geteuid() } == 0 {
        CapsHashSet::new()
    } else {
        keep.tools.clone()
    };
    set(CapSet::Ambient, &ambient)?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!(
            "dropping capabilities: prctl(PR_SET_NO_NEW_PRIVS): {}",
            std::io::Error::last_os_error()
        );
    }
    // Read back, so that the line says what the kernel holds.
    tracing::info!(
        kept = %Names(&read(CapSet::Effective)?),
        tools = %Names(&keep.tools),
        bounding = %Names(&read(CapSet::Bounding)?),
        no_new_privs = true,
        "attached; capabilities dropped to what the run needs from now on"
    );
    Ok(())
}

fn read(set: CapSet) -> Result<CapsHashSet> {
    caps::read(None, set)
        .map_err(|e| anyhow!("dropping capabilities: reading the {set:?} set: {e}"))
}

fn set(set: CapSet, value: &CapsHashSet) -> Result<()> {
    caps::set(None, set, value).map_err(|e| {
        anyhow!(
            "dropping capabilities: setting the {set:?} set to {}: {e} (a seccomp profile or security module that forbids capset/prctl must allow them)",
            Names(value)
        )
    })
}

/// Capability names, sorted, comma-separated (`none` for the empty set).
struct Names<'a>(&'a CapsHashSet);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<String> = self.0.iter().map(Capability::to_string).collect();
        names.sort();
        if names.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(caps: &[Capability]) -> CapsHashSet {
        caps.iter().copied().collect()
    }

    #[test]
    fn root_keeps_bpf_net_admin_and_net_raw() {
        let keep = SteadyState::of(&caps::all(), false);
        assert_eq!(
            keep.process,
            set_of(&[
                Capability::CAP_BPF,
                Capability::CAP_NET_ADMIN,
                Capability::CAP_NET_RAW
            ])
        );
        assert_eq!(
            keep.tools,
            set_of(&[Capability::CAP_NET_ADMIN, Capability::CAP_NET_RAW])
        );
    }

    #[test]
    fn perfmon_and_sys_admin_go_net_raw_only_when_granted() {
        let held = set_of(&[
            Capability::CAP_BPF,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_PERFMON,
            Capability::CAP_SYS_ADMIN,
        ]);
        let keep = SteadyState::of(&held, false);
        assert_eq!(
            keep.process,
            set_of(&[Capability::CAP_BPF, Capability::CAP_NET_ADMIN])
        );
        assert_eq!(keep.tools, set_of(&[Capability::CAP_NET_ADMIN]));
    }

    #[test]
    fn perfmon_stays_while_tc_ingress_may_be_loaded() {
        let held = set_of(&[
            Capability::CAP_BPF,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_PERFMON,
        ]);
        let keep = SteadyState::of(&held, true);
        assert_eq!(keep.process, held);
        assert_eq!(keep.tools, set_of(&[Capability::CAP_NET_ADMIN]));
    }

    #[test]
    fn sys_admin_stands_in_for_a_missing_cap_bpf() {
        let held = set_of(&[Capability::CAP_SYS_ADMIN, Capability::CAP_NET_ADMIN]);
        assert_eq!(
            SteadyState::of(&held, true).process,
            set_of(&[Capability::CAP_SYS_ADMIN, Capability::CAP_NET_ADMIN])
        );
    }

    #[test]
    fn names_are_sorted() {
        let held = set_of(&[Capability::CAP_NET_RAW, Capability::CAP_BPF]);
        assert_eq!(Names(&held).to_string(), "CAP_BPF,CAP_NET_RAW");
        assert_eq!(Names(&CapsHashSet::new()).to_string(), "none");
    }
}
