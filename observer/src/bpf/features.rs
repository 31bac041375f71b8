//! What the running kernel offers the observer, probed rather than inferred
//! from its version number (distributions backport features): the facts
//! [`Observer::load`](crate::bpf::Observer::load) picks program variants
//! and attach mechanisms from, and that `observer check` prints.
//!
//! Each fact comes from the kernel itself: a helper probe (a two-instruction
//! program the verifier accepts only if the helper exists) or the kernel's
//! own BTF, which describes its uapi enums and tracepoint arguments.

use std::path::Path;

use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};
// The data lives in the pure core, beside what it decides (`plan`); this
// module probes it.
pub use observer_core::model::kernel::{
    DropProgram, Fallback, Features, Plan, XdpProgram, xdp_test_run_rewrites_dispatcher,
};

use crate::{bpf::btf::KernelBtf, node::preflight};

/// Probes the running kernel. Needs the privileges loading programs
/// needs (the helper probe loads a program); without them `xdp_frags`
/// reads false.
pub fn probe() -> Features {
    probe_with(&KernelBtf::open(Path::new(preflight::KERNEL_BTF)))
}

/// [`probe`] with the kernel's BTF already parsed (parsing
/// it takes longer than everything else a start does).
pub fn probe_with(btf: &anyhow::Result<KernelBtf>) -> Features {
    let release = kernel_release();
    let (btf_problem, tcx, drop_reasons) = match btf {
        Ok(btf) => (
            None,
            Some(btf.enum_has("bpf_attach_type", "BPF_TCX_INGRESS")),
            Some(btf.kfree_skb_has_reason()),
        ),
        Err(e) => (Some(format!("{e:#}")), None, None),
    };
    Features {
        release,
        btf_problem,
        xdp_frags: matches!(
            is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_get_buff_len),
            Ok(true)
        ),
        tcx,
        drop_reasons,
    }
}

/// `uname -r`, or `unknown`.
pub fn kernel_release() -> String {
    // SAFETY: uname fills the zeroed struct; release is NUL-terminated.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut name) } != 0 {
        return "unknown".to_string();
    }
    // SAFETY: NUL-terminated by the kernel.
    unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_kernel_is_probed() {
        let release = kernel_release();
        assert!(
            release.chars().next().is_some_and(|c| c.is_ascii_digit()),
            "{release}"
        );
    }
}
