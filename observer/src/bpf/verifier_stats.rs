//! How many instructions the verifier processed for a program, on kernels
//! that do not say (`bpf_prog_info.verified_insns` arrived in 5.16).
//!
//! The only other source is the verifier's statistics log, which aya
//! requests only when a load fails. So this loads the program a second
//! time, by hand: the object's instructions relocated with aya-obj against
//! the maps the loaded programs already use (the same `.rodata`, so the
//! verifier prunes the same branches), then BPF_PROG_LOAD with
//! `log_level` BPF_LOG_STATS, and reads "processed N insns" from the log.
//! The second program is closed at once; nothing is attached.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Btf,
    maps::{MapFd, MapInfo},
    programs::ProgramInfo,
};
use aya_obj::{
    ProgramSection,
    btf::BtfKind,
    generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type},
};

use crate::bpf::EBPF_OBJECT;

/// BPF_LOG_STATS: only the closing statistics lines.
const BPF_LOG_STATS: u32 = 4;
/// BPF_F_XDP_HAS_FRAGS.
const XDP_HAS_FRAGS: u32 = 1 << 5;
/// Room for the statistics lines.
const LOG_SIZE: usize = 4096;

/// The maps of loaded programs, by name, opened by id.
pub struct LoadedMaps {
    fds: HashMap<String, MapFd>,
}

impl LoadedMaps {
    /// Opens every map the loaded programs `programs` use.
    pub fn of_programs(programs: &[&ProgramInfo]) -> Result<LoadedMaps> {
        let mut fds = HashMap::new();
        for info in programs {
            for map_id in info.map_ids()?.unwrap_or_default() {
                let map = MapInfo::from_id(map_id)?;
                let name = map.name_as_str().unwrap_or_default().to_string();
                if let std::collections::hash_map::Entry::Vacant(slot) = fds.entry(name) {
                    slot.insert(map.fd()?);
                }
            }
        }
        Ok(LoadedMaps { fds })
    }
}

/// Instructions the verifier processes for the program `name` of the
/// observer's object, using `maps` (see the module comment).
pub fn processed_instructions(name: &str, maps: &LoadedMaps) -> Result<u32> {
    let mut obj = aya_obj::Object::parse(EBPF_OBJECT).context("parsing the eBPF object")?;
    let object_maps = obj.maps.clone();
    let mut relocatable = Vec::new();
    for (map_name, map) in &object_maps {
        // Kernel map names are the object's, cut to 15 bytes.
        let kernel_name: String = map_name.chars().take(15).collect();
        if let Some(fd) = maps.fds.get(&kernel_name) {
            relocatable.push((map_name.as_str(), fd.as_fd().as_raw_fd(), map));
        }
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(relocatable.into_iter(), &text_sections)
        .map_err(|e| anyhow!("relocating maps: {e}"))?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| anyhow!("relocating calls: {e}"))?;
    let program = obj
        .programs
        .get(name)
        .with_context(|| format!("{name} is not in the object"))?;
    let function = &obj.functions[&program.function_key()];

    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the prog-load member of the zeroed union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    match &program.section {
        ProgramSection::Xdp { frags, .. } => {
            load.prog_type = bpf_prog_type::BPF_PROG_TYPE_XDP as u32;
            if *frags {
                load.prog_flags = XDP_HAS_FRAGS;
            }
        }
        ProgramSection::SchedClassifier => {
            load.prog_type = bpf_prog_type::BPF_PROG_TYPE_SCHED_CLS as u32;
        }
        ProgramSection::BtfTracePoint => {
            load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
            load.expected_attach_type = bpf_attach_type::BPF_TRACE_RAW_TP as u32;
            let btf = Btf::from_sys_fs().context("reading kernel BTF")?;
            load.attach_btf_id = btf
                .id_by_type_name_kind("btf_trace_kfree_skb", BtfKind::Typedef)
                .context("btf_trace_kfree_skb in the kernel's BTF")?;
        }
        other => bail!("{name}: program section {other:?} is not one of the observer's"),
    }
    let license = CString::new("GPL").expect("no NUL");
    let mut log = vec![0u8; LOG_SIZE];
    load.insn_cnt = function.instructions.len() as u32;
    load.insns = function.instructions.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    load.log_level = BPF_LOG_STATS;
    load.log_size = LOG_SIZE as u32;
    load.log_buf = log.as_mut_ptr() as u64;
    // SAFETY: bpf(2) with a fully initialised attribute whose pointers
    // (instructions, license, log) outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_PROG_LOAD as libc::c_int,
            &attr as *const bpf_attr,
            std::mem::size_of::<bpf_attr>() as u32,
        )
    };
    let error = std::io::Error::last_os_error();
    if ret >= 0 {
        // SAFETY: a new program fd the kernel just returned; closed here.
        drop(unsafe { OwnedFd::from_raw_fd(ret as i32) });
    }
    let text =
        String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    if ret < 0 {
        bail!("{name}: the second load for statistics failed ({error}): {text}");
    }
    processed(&text)
        .with_context(|| format!("no statistics in the verifier log of {name}: {text:?}"))
}

/// N of the verifier's "processed N insns" line.
pub(crate) fn processed(log: &str) -> Option<u32> {
    log.lines()
        .find_map(|line| line.strip_prefix("processed "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_statistics_line() {
        let log = "verification time 12 usec\nstack depth 368\nprocessed 38146 insns (limit 1000000) max_states_per_insn 17 total_states 1865 peak_states 613 mark_read 21\n";
        assert_eq!(processed(log), Some(38146));
        assert_eq!(processed("stack depth 8\n"), None);
    }
}
