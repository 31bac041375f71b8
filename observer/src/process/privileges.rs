//! Least privilege once attached. Loading and attaching take CAP_BPF,
//! CAP_PERFMON and CAP_NET_ADMIN (CAP_SYS_ADMIN too for `--netns`, and
//! root holds every capability); what a run does afterwards needs far less
//! (docs/privileges.md says which and why).
//! [`drop_to_steady_state`] keeps only that, for this process and for the
//! node tools it runs, and sets `no_new_privs`, so that nothing it executes
//! gains more (no setuid program, no file capabilities).
//!
//! Capabilities and `no_new_privs` belong to each thread: the drop runs
//! while the process has a single thread, and every thread started later
//! inherits the reduced sets.

use std::{fmt, os::unix::fs::MetadataExt, path::Path};

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

/// What the rest of a run may still do that needs more than the usual
/// steady state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// A program may still have to be loaded (tc ingress, deferred, for an
    /// interface that comes back).
    pub may_load: bool,
    /// The textfile or the evidence directory grants this user no write
    /// access by its mode (see [`needs_dac_override`]).
    pub foreign_output_dir: bool,
    /// The tools run chrooted into the host's root (`--host-root`).
    pub host_root: bool,
}

/// Whether writing into `dir` rests on CAP_DAC_OVERRIDE: its mode gives
/// this process's user and group no write access, as for a directory
/// owned by node_exporter's user (Debian's `/var/lib/prometheus/node-exporter`,
/// owned by `prometheus`, mode 0755). False when `dir` cannot be looked at
/// (missing: made later, it is made by its owner's rules).
pub fn needs_dac_override(dir: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else {
        return false;
    };
    let mode = meta.mode();
    // SAFETY: geteuid and getegid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let writable = (meta.uid() == euid && mode & 0o200 != 0)
        || (meta.gid() == egid && mode & 0o020 != 0)
        || mode & 0o002 != 0;
    !writable
}

impl SteadyState {
    /// What to keep of `held`, the effective set the programs were loaded
    /// and attached with, for a run that still `needs` what it says.
    pub fn of(held: &CapsHashSet, needs: Needs) -> SteadyState {
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
        if needs.may_load && held.contains(&Capability::CAP_PERFMON) {
            process.insert(Capability::CAP_PERFMON);
        }
        // Root writing the textfile or evidence into a directory another
        // user owns (files are created there while it runs); never for the
        // tools.
        if needs.foreign_output_dir && held.contains(&Capability::CAP_DAC_OVERRIDE) {
            process.insert(Capability::CAP_DAC_OVERRIDE);
        }
        // chroot(2) into the host's root happens in the forked child
        // before exec, with the process's effective set; the tool itself
        // does not get it.
        if needs.host_root && held.contains(&Capability::CAP_SYS_CHROOT) {
            process.insert(Capability::CAP_SYS_CHROOT);
        }
        SteadyState { process, tools }
    }
}

/// Drops every capability the steady state does not need (see
/// [`SteadyState::of`], `needs` as there) and sets `no_new_privs`;
/// logs what was kept. Call once, after the last attach and before any
/// thread starts.
///
/// Fails, naming the step, when the kernel refuses a step (a seccomp
/// profile or security module that forbids capset or prctl) or when other
/// threads already run. The failure is fatal to the run: docs/privileges.md
/// and the DaemonSet promise these sets while the observer reads text others
/// control, and a refused drop at start is seen at once, before counting.
pub fn drop_to_steady_state(needs: Needs) -> Result<()> {
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
    let keep = SteadyState::of(&held, needs);
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

    const LOADING: Needs = Needs {
        may_load: true,
        foreign_output_dir: false,
        host_root: false,
    };

    fn set_of(caps: &[Capability]) -> CapsHashSet {
        caps.iter().copied().collect()
    }

    #[test]
    fn root_keeps_bpf_net_admin_and_net_raw() {
        let keep = SteadyState::of(&caps::all(), Needs::default());
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
        let keep = SteadyState::of(&held, Needs::default());
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
        let keep = SteadyState::of(&held, LOADING);
        assert_eq!(keep.process, held);
        assert_eq!(keep.tools, set_of(&[Capability::CAP_NET_ADMIN]));
    }

    #[test]
    fn sys_admin_stands_in_for_a_missing_cap_bpf() {
        let held = set_of(&[Capability::CAP_SYS_ADMIN, Capability::CAP_NET_ADMIN]);
        assert_eq!(
            SteadyState::of(&held, LOADING).process,
            set_of(&[Capability::CAP_SYS_ADMIN, Capability::CAP_NET_ADMIN])
        );
    }

    #[test]
    fn dac_override_stays_only_for_a_textfile_dir_of_another_user() {
        let needs = Needs {
            foreign_output_dir: true,
            ..Needs::default()
        };
        let keep = SteadyState::of(&caps::all(), needs);
        assert!(keep.process.contains(&Capability::CAP_DAC_OVERRIDE));
        assert!(!keep.tools.contains(&Capability::CAP_DAC_OVERRIDE));
        let root = SteadyState::of(&caps::all(), Needs::default());
        assert!(!root.process.contains(&Capability::CAP_DAC_OVERRIDE));
    }

    #[test]
    fn sys_chroot_stays_only_with_a_host_root_and_never_for_the_tools() {
        let needs = Needs {
            host_root: true,
            ..Needs::default()
        };
        let keep = SteadyState::of(&caps::all(), needs);
        assert!(keep.process.contains(&Capability::CAP_SYS_CHROOT));
        assert!(!keep.tools.contains(&Capability::CAP_SYS_CHROOT));
        let plain = SteadyState::of(&caps::all(), Needs::default());
        assert!(!plain.process.contains(&Capability::CAP_SYS_CHROOT));
    }

    #[test]
    fn a_directory_of_another_user_needs_dac_override() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = std::env::temp_dir().join(format!("observer-dac-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!needs_dac_override(&dir), "root's own directory");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        assert!(needs_dac_override(&dir), "nobody's, mode 0755");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(!needs_dac_override(&dir), "anyone may write");
        assert!(!needs_dac_override(&dir.join("missing")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_are_sorted() {
        let held = set_of(&[Capability::CAP_NET_RAW, Capability::CAP_BPF]);
        assert_eq!(Names(&held).to_string(), "CAP_BPF,CAP_NET_RAW");
        assert_eq!(Names(&CapsHashSet::new()).to_string(), "none");
    }
}
