//! Which slots of the programs' per-CPU slot arrays (the flow cache and
//! the plain counters) an interval reads: every slot after the programs
//! put a slot to use on some CPU (their count of first uses moved since
//! the last full read), and at least every [`FULL_READ_EVERY`] reads;
//! else only the slots seen in use.
//!
//! Why: a per-CPU array is read whole by copying every slot of every CPU
//! (the two arrays are 3,072 slots of 96 and 16 bytes per CPU: 8 MiB per
//! interval on a 64-CPU node, and a system call per slot before 5.13),
//! while a node's flows use a few of them. A slot once used stays in use
//! (cache slots are never freed, plain slots never cleared), so the slots
//! in use change only when the count of first uses does.

use std::collections::BTreeSet;

/// Reads between two full reads at most, even when the count of first
/// uses stood still: a safety net for a first use whose count became
/// visible to userspace before its slot did (CPUs without store order).
pub const FULL_READ_EVERY: u32 = 60;

/// Above this many slots in use, a full read (one batch) costs less than
/// one lookup per slot.
pub const MAX_TARGETED: usize = 256;

/// What to read this interval.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotPlan {
    /// Every slot; then tell [`SlotReads::read_all`] which are in use.
    All,
    /// Only these slots.
    Only(Vec<u32>),
}

/// The slots of one array seen in use, and the count of first uses at the
/// full read that saw them.
#[derive(Debug, Default)]
pub struct SlotReads {
    first_uses: Option<u64>,
    in_use: BTreeSet<u32>,
    targeted: u32,
}

impl SlotReads {
    /// The plan for a read, given the programs' count of first uses
    /// (summed over CPUs) read just before.
    pub fn plan(&mut self, first_uses: u64) -> SlotPlan {
        if self.first_uses != Some(first_uses)
            || self.targeted >= FULL_READ_EVERY
            || self.in_use.len() > MAX_TARGETED
        {
            return SlotPlan::All;
        }
        self.targeted += 1;
        SlotPlan::Only(self.in_use.iter().copied().collect())
    }

    /// Records a full read, made after reading `first_uses`, that found
    /// `in_use` in use.
    pub fn read_all(&mut self, first_uses: u64, in_use: BTreeSet<u32>) {
        self.first_uses = Some(first_uses);
        self.in_use = in_use;
        self.targeted = 0;
    }
}

/// The trackers of the two arrays.
#[derive(Debug, Default)]
pub struct SlotTrackers {
    /// `FLOW_CACHE`, whose first uses are `Stat::FlowCacheClaims`.
    pub flow_cache: SlotReads,
    /// `PLAIN`, whose first uses are `Stat::PlainSlotsUsed`.
    pub plain: SlotReads,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_read_and_every_new_first_use_read_everything() {
        let mut reads = SlotReads::default();
        assert_eq!(reads.plan(0), SlotPlan::All);
        reads.read_all(0, BTreeSet::new());
        assert_eq!(reads.plan(0), SlotPlan::Only(vec![]));
        // A slot was put to use: read everything, then only what is used.
        assert_eq!(reads.plan(1), SlotPlan::All);
        reads.read_all(1, [7, 3].into());
        assert_eq!(reads.plan(1), SlotPlan::Only(vec![3, 7]));
        assert_eq!(reads.plan(1), SlotPlan::Only(vec![3, 7]));
        // Until the plan is carried out, the new count keeps asking.
        assert_eq!(reads.plan(2), SlotPlan::All);
        assert_eq!(reads.plan(2), SlotPlan::All);
    }

    #[test]
    fn a_full_read_comes_at_least_every_full_read_every() {
        let mut reads = SlotReads::default();
        reads.read_all(5, [1].into());
        for _ in 0..FULL_READ_EVERY {
            assert_eq!(reads.plan(5), SlotPlan::Only(vec![1]));
        }
        assert_eq!(reads.plan(5), SlotPlan::All);
        reads.read_all(5, [1].into());
        assert_eq!(reads.plan(5), SlotPlan::Only(vec![1]));
    }

    #[test]
    fn many_slots_in_use_are_read_whole() {
        let mut reads = SlotReads::default();
        let many: BTreeSet<u32> = (0..=MAX_TARGETED as u32).collect();
        reads.read_all(9, many);
        assert_eq!(reads.plan(9), SlotPlan::All);
        let enough: BTreeSet<u32> = (0..MAX_TARGETED as u32).collect();
        reads.read_all(9, enough.clone());
        assert_eq!(reads.plan(9), SlotPlan::Only(enough.into_iter().collect()));
    }
}
