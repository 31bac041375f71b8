//! Checks made before loading anything, so that a missing privilege or
//! kernel feature is reported as such instead of as a failed syscall.

use std::path::Path;

use anyhow::{Result, bail};

/// Linux capability numbers (include/uapi/linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub use crate::model::kernel::KERNEL_BTF;

/// Capabilities the observer needs, with their names.
const NEEDED: [(u32, &str); 3] = [
    (CAP_BPF, "CAP_BPF"),
    (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
    (CAP_PERFMON, "CAP_PERFMON"),
];

/// The needed capabilities the process lacks (empty when none).
pub fn missing_privileges() -> Vec<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    missing_capabilities(parse_cap_eff(&status).unwrap_or(0))
}

/// Whether the process may read and change the network configuration
/// (CAP_NET_ADMIN: what ipset and nft need to list sets).
pub fn has_net_admin() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    parse_cap_eff(&status).is_some_and(|caps| caps & (1u64 << CAP_NET_ADMIN) != 0)
}

/// Fails with the missing capabilities named, when the process lacks them.
pub fn check_privileges() -> Result<()> {
    let missing = missing_privileges();
    if !missing.is_empty() {
        bail!(
            "missing {}: run as root, or grant them (e.g. `sudo setcap cap_bpf,cap_net_admin,cap_perfmon+ep $(which observer)`)",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Names of the needed capabilities absent from the effective set.
/// CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON on kernels < 5.8.
fn missing_capabilities(effective: u64) -> Vec<&'static str> {
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    let covered = |cap: u32| has(cap) || (cap != CAP_NET_ADMIN && has(CAP_SYS_ADMIN));
    NEEDED
        .iter()
        .filter(|(cap, _)| !covered(*cap))
        .map(|(_, name)| *name)
        .collect()
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Fails when the kernel exposes no BTF at `path`.
pub fn check_btf(path: &Path) -> Result<()> {
    if !path.exists() {
        bail!(
            "this kernel has no BTF ({} is missing): the observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }

    #[test]
    fn names_each_missing_capability() {
        assert_eq!(
            missing_capabilities(0),
            vec!["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]
        );
        let all = (1 << CAP_BPF) | (1 << CAP_NET_ADMIN) | (1 << CAP_PERFMON);
        assert!(missing_capabilities(all).is_empty());
        assert_eq!(
            missing_capabilities(1 << CAP_NET_ADMIN),
            vec!["CAP_BPF", "CAP_PERFMON"]
        );
    }

    #[test]
    fn sys_admin_covers_bpf_and_perfmon_but_not_net_admin() {
        assert_eq!(
            missing_capabilities(1 << CAP_SYS_ADMIN),
            vec!["CAP_NET_ADMIN"]
        );
    }

    #[test]
    fn missing_btf_is_explained() {
        let err = check_btf(Path::new("/nonexistent/vmlinux"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no BTF") && err.contains("CONFIG_DEBUG_INFO_BTF"),
            "{err}"
        );
    }
}
