//! The evidence rings (`--capture-dir`): the per-CPU perf rings of the
//! programs' `EVIDENCE` map, opened once, read as raw records (an
//! `EvidenceHeader` and the frame's first bytes); and the `CONFIG` words
//! that switch capture on. Naming the records (interfaces, reasons,
//! locations) and writing them is the monitor's and the report's.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    time::Duration,
};

use aya::maps::{MapData, PerfEventArray, perf::PerfEvent, perf::PerfEventArrayBuffer};
use observer_common::{EVIDENCE_MAP, EVIDENCE_MAX_SNAP, EvidenceHeader, config};

use super::{Observer, maps::MapsError};

/// Why the evidence rings could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The map is not in the object, or was taken already.
    #[error("the programs' {EVIDENCE_MAP} map is missing (opened twice?)")]
    Missing,
    /// aya refused the map.
    #[error(transparent)]
    Map(#[from] aya::maps::MapError),
    /// The online CPUs could not be read.
    #[error("reading the online CPUs ({0})")]
    Cpus(String),
    /// A CPU's ring could not be opened (perf_event_open or mmap).
    #[error(
        "opening the evidence ring of CPU {cpu} (perf_event_open needs CAP_PERFMON or CAP_SYS_ADMIN; locked memory: raise RLIMIT_MEMLOCK or lower --capture-ring-pages)"
    )]
    Open {
        cpu: u32,
        #[source]
        source: aya::maps::perf::PerfBufferError,
    },
    /// Writing the CONFIG words failed.
    #[error(transparent)]
    Config(#[from] MapsError),
}

/// One record of a ring: what the programs sent.
#[derive(Debug, Clone)]
pub struct EvidenceRecord {
    /// The record's head.
    pub header: EvidenceHeader,
    /// The frame's first bytes (`header.captured` of them).
    pub data: Vec<u8>,
}

impl EvidenceRecord {
    /// Decodes one sample; `None` for one shorter than its header says
    /// (never from these programs).
    fn decode(sample: &[u8]) -> Option<EvidenceRecord> {
        let size = size_of::<EvidenceHeader>();
        let head = sample.get(..size)?;
        // SAFETY: `EvidenceHeader` is plain data without padding (asserted
        // in observer-common), read unaligned from `size` bytes.
        let header: EvidenceHeader = unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) };
        let captured = header.captured.min(EVIDENCE_MAX_SNAP) as usize;
        let data = sample.get(size..size + captured)?.to_vec();
        Some(EvidenceRecord { header, data })
    }
}

/// The open rings, one per online CPU.
pub struct EvidenceRings {
    rings: Vec<PerfEventArrayBuffer<MapData>>,
}

impl Observer {
    /// Opens the evidence rings, `pages` pages per CPU (a power of two),
    /// then switches capture on in the programs: `snap` bytes of each
    /// frame, at most `rate` records per CPU and second. Once only (the
    /// map is taken).
    pub fn open_evidence(
        &mut self,
        pages: usize,
        snap: u32,
        rate: u32,
    ) -> Result<EvidenceRings, EvidenceError> {
        let map = self
            .ebpf
            .take_map(EVIDENCE_MAP)
            .ok_or(EvidenceError::Missing)?;
        let mut array = PerfEventArray::try_from(map)?;
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| EvidenceError::Cpus(format!("{what}: {e}")))?;
        let mut rings = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let ring = array
                .open(cpu, Some(pages))
                .map_err(|source| EvidenceError::Open { cpu, source })?;
            rings.push(ring);
        }
        super::maps::set_config(self, config::EVIDENCE_RATE, rate)?;
        super::maps::set_config(self, config::EVIDENCE_SNAP, snap.min(EVIDENCE_MAX_SNAP))?;
        Ok(EvidenceRings { rings })
    }
}

impl Observer {
    /// Switches capture off in the programs: no record is sent after
    /// this (a program already past the switch may still send one), so
    /// that a last read of the rings and the counters agree.
    pub fn stop_evidence(&mut self) -> Result<(), EvidenceError> {
        super::maps::set_config(self, config::EVIDENCE_SNAP, 0)?;
        Ok(())
    }
}

impl EvidenceRings {
    /// Waits up to `timeout` for records, then hands every record the
    /// rings hold to `each`; returns how many.
    ///
    /// The rings' own "lost" notices are not counted here: the programs
    /// count each record the helper could not write (`Stat::EvidenceLost`),
    /// at once and exactly, where a notice comes only once the ring has
    /// room again.
    pub fn read(
        &mut self,
        timeout: Duration,
        mut each: impl FnMut(EvidenceRecord),
    ) -> io::Result<u64> {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|ring| libc::pollfd {
                fd: ring.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let mut records = 0;
        let mut sample = Vec::new();
        for ring in &mut self.rings {
            if !ring.readable() {
                continue;
            }
            ring.for_each(|event| {
                if let PerfEvent::Sample { head, tail } = event {
                    sample.clear();
                    sample.extend_from_slice(head);
                    sample.extend_from_slice(tail);
                    if let Some(record) = EvidenceRecord::decode(&sample) {
                        records += 1;
                        each(record);
                    }
                }
            });
        }
        Ok(records)
    }
}
