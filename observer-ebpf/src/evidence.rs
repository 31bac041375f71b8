//! Evidence capture (`--capture-dir`): the frames the checks flag and the
//! drops the kernel reports, with their first bytes, handed to userspace
//! through the per-CPU rings of `EVIDENCE`. Off unless userspace sets
//! `config::EVIDENCE_SNAP`; at most `config::EVIDENCE_RATE` records per CPU
//! and second; every record not sent is counted (`Stat::EvidenceLost`,
//! `Stat::EvidenceRateLimited`), so the files and the counters add up to
//! what was flagged.
//!
//! A frame's checks (the checks programs of XDP and tc) may flag several
//! reasons: each is gathered in the hook's `EVIDENCE_SLOTS` slot (`flag`;
//! in map memory, where the verifier does not follow each combination of
//! reasons as it would a local's), and the checks program sends one
//! record at its end (`send_flagged`).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_CURRENT_CPU,
    helpers::{
        bpf_ktime_get_ns,
        generated::{bpf_perf_event_output, bpf_probe_read_kernel},
    },
};
use observer_common::{
    DropKey, EVIDENCE_MAX_SNAP, EvidenceHeader, Stat, config, evidence_link, parse::bounded,
};

use crate::{
    count::bump,
    maps::{EVIDENCE, EVIDENCE_BUDGET, EVIDENCE_COPY, EVIDENCE_SLOTS, config_word},
};

/// [`EVIDENCE_SLOTS`] slot of the tc hooks.
pub const EVIDENCE_TC: u32 = 0;
/// [`EVIDENCE_SLOTS`] slot of XDP.
pub const EVIDENCE_XDP: u32 = 1;

/// Bytes of each frame to send; 0 when capture is off.
#[inline(always)]
fn snap() -> u32 {
    config_word(config::EVIDENCE_SNAP)
}

/// Notes `reason` (a `ClassifierDrop`), flagged under `key` on the frame
/// of `wire_len` bytes in hand of the hook with evidence slot `slot`.
#[inline(always)]
pub fn flag(slot: u32, key: &DropKey, reason: u32, wire_len: u64) {
    if snap() == 0 {
        return;
    }
    if let Some(pending) = EVIDENCE_SLOTS.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot of this hook kind, which runs one frame
        // at a time on a CPU.
        unsafe {
            (*pending).key = *key;
            (*pending).reasons |= 1 << (reason & 31);
            (*pending).wire_len = wire_len as u32;
        }
    }
}

/// Sends the frame in hand of `slot`, when flagged, with its first bytes:
/// the helper appends them from `ctx` (XDP's buffer or the skb), at most
/// `available` of them (more fails the helper), and clears the slot.
#[inline(always)]
pub fn send_flagged<C: EbpfContext>(ctx: &C, slot: u32, available: u32) -> Option<()> {
    let snap = snap();
    if snap == 0 {
        return None;
    }
    let pending = EVIDENCE_SLOTS.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot (see `flag`); it is cleared before the
    // function returns, whatever happens.
    unsafe {
        if (*pending).reasons == 0 {
            return None;
        }
        if within_budget() {
            let captured = snap.min(available).min(EVIDENCE_MAX_SNAP);
            (*pending).time_ns = bpf_ktime_get_ns();
            (*pending).captured = captured;
            (*pending).link = evidence_link::ETHERNET;
            let flags = (u64::from(captured) << 32) | BPF_F_CURRENT_CPU;
            let sent = bpf_perf_event_output(
                ctx.as_ptr(),
                (&raw const EVIDENCE).cast_mut().cast(),
                flags,
                pending.cast(),
                size_of::<EvidenceHeader>() as u64,
            );
            bump(if sent == 0 {
                Stat::EvidenceSent
            } else {
                Stat::EvidenceLost
            });
        }
        (*pending).reasons = 0;
    }
    Some(())
}

/// Sends a kernel drop under `key`: a record assembled in this CPU's
/// `EVIDENCE_COPY` buffer from the packet's bytes at `from` (a kernel
/// address and the bytes of linear data there), which start with
/// `link` (`evidence_link`); `wire_len` counts from there too.
#[inline(always)]
pub fn send_drop<C: EbpfContext>(
    ctx: &C,
    key: &DropKey,
    wire_len: u64,
    (from, available): (usize, u32),
    link: u32,
) -> Option<()> {
    let snap = snap();
    if snap == 0 || !within_budget() {
        return None;
    }
    let record = EVIDENCE_COPY.get_ptr_mut(0)?;
    let wanted = snap.min(available).min(EVIDENCE_MAX_SNAP) as usize;
    // Bounded by a mask for the verifier; the buffer holds twice the most
    // a record carries (see `EvidenceCopy::data`).
    let captured = bounded(wanted, 2 * EVIDENCE_MAX_SNAP as usize - 1);
    // SAFETY: this CPU's buffer; the probe read writes at most `captured`
    // bytes into `data`, which holds more, and fails on a bad address.
    unsafe {
        let read = bpf_probe_read_kernel(
            (*record).data.as_mut_ptr().cast(),
            captured as u32,
            from as *const _,
        );
        if read != 0 {
            bump(Stat::EvidenceLost);
            return None;
        }
        (*record).header = EvidenceHeader {
            key: *key,
            time_ns: bpf_ktime_get_ns(),
            reasons: 0,
            wire_len: wire_len as u32,
            captured: captured as u32,
            link,
        };
        let sent = bpf_perf_event_output(
            ctx.as_ptr(),
            (&raw const EVIDENCE).cast_mut().cast(),
            BPF_F_CURRENT_CPU,
            record.cast(),
            (size_of::<EvidenceHeader>() + captured) as u64,
        );
        bump(if sent == 0 {
            Stat::EvidenceSent
        } else {
            Stat::EvidenceLost
        });
    }
    Some(())
}

/// Whether this CPU may send one more record this second; counts the
/// record as rate-limited when not.
#[inline(always)]
fn within_budget() -> bool {
    let Some(budget) = EVIDENCE_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let rate = u64::from(config_word(config::EVIDENCE_RATE));
    // SAFETY: this CPU's budget. A kernel drop interrupting a hook on the
    // same CPU between the read and the write loses one count of `sent`,
    // which lets one more record through: harmless.
    unsafe {
        let now = bpf_ktime_get_ns();
        if now.wrapping_sub((*budget).second_start_ns) >= 1_000_000_000 {
            (*budget).second_start_ns = now;
            (*budget).sent = 0;
        }
        if (*budget).sent >= rate {
            bump(Stat::EvidenceRateLimited);
            return false;
        }
        (*budget).sent += 1;
    }
    true
}
