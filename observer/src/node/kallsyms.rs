//! The kernel functions that freed dropped packets, named from
//! `/proc/kallsyms` (read by `parse::kallsyms`).
//!
//! The file is opened once, before the observer drops its capabilities:
//! with `kernel.kptr_restrict` 1 the kernel shows addresses only to a
//! reader that held CAP_SYSLOG when it opened the file, and the open file
//! keeps showing them. It is read again from the start only when drops
//! come from an address not named yet: a few times per run.

use std::{
    collections::{BTreeSet, HashMap},
    fs::File,
    io::{BufRead, BufReader, Seek, SeekFrom},
};

use crate::parse::kallsyms::{Nearest, text_symbol};

/// Names kept; a kernel frees packets from a few dozen places.
const MAX_NAMED: usize = 4096;

/// Kernel addresses and the function each lies in.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    file: Option<File>,
    /// Address -> its function; `None` once a read found none.
    named: HashMap<u64, Option<String>>,
}

impl KernelSymbols {
    /// Opens `/proc/kallsyms`; without it addresses stay unnamed (said
    /// once in the log).
    pub fn open() -> KernelSymbols {
        let file = match File::open("/proc/kallsyms") {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::info!(error = %e, "cannot read /proc/kallsyms: drop locations are shown as addresses");
                None
            }
        };
        KernelSymbols {
            file,
            named: HashMap::new(),
        }
    }

    /// Names every address of `addrs` not named yet, in one read of the
    /// file.
    pub fn resolve(&mut self, addrs: impl IntoIterator<Item = u64>) {
        // A set: thousands of rows share a handful of locations, and each
        // line of the file is compared with every address asked for (a
        // Vec of 16,000 copies of one address took 38 s a read).
        let new: BTreeSet<u64> = addrs
            .into_iter()
            .filter(|a| *a != 0 && !self.named.contains_key(a))
            .collect();
        if new.is_empty() {
            return;
        }
        if self.named.len() + new.len() > MAX_NAMED {
            self.named.clear();
        }
        let mut nearest = Nearest::new(new.iter().copied());
        if let Some(file) = &mut self.file
            && file.seek(SeekFrom::Start(0)).is_ok()
        {
            let mut reader = BufReader::with_capacity(64 * 1024, &*file);
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                if let Some(symbol) = text_symbol(&line) {
                    nearest.offer(symbol);
                }
                line.clear();
            }
        }
        self.named.extend(nearest.finish());
    }

    /// The function `addr` lies in, else the address in hex; `None` for 0
    /// (no location: the classifier's rows).
    pub fn name(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        Some(match self.named.get(&addr) {
            Some(Some(name)) => name.clone(),
            _ => format!("{addr:#x}"),
        })
    }
}
