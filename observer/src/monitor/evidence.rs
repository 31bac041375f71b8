//! Evidence capture while attached (`--capture-dir`): every interval, and
//! once more at the end, the programs' evidence rings are drained; each
//! record is named with what the monitor knows (interface, reasons, the
//! function that freed it, the peer), kernel drops the drop rows leave out
//! (the receiving socket layer after decapsulation) are left out here too,
//! and the rest go to the rotating pcapng files (`report::evidence`).
//!
//! Why on the interval and not a thread of its own: the rings are the
//! bounded queue (sized to hold a few intervals at the rate limit, see
//! [`ring_pages`]), what overflows them is counted by the programs, and
//! naming a record needs the monitor's interface names and kernel symbols.

use std::{collections::HashMap, time::Duration};

use anyhow::{Context, Result};
use observer_common::{ClassifierDrop, EvidenceHeader, evidence_link};
use observer_core::capture;

use crate::{
    bpf::{
        Observer,
        evidence::{EvidenceRecord, EvidenceRings},
    },
    cli::settings,
    model::{
        evidence::{Evidence, EvidenceCounts},
        rows::{self, DropId, KernelReasons, Origin, Stage},
    },
    node::kallsyms::KernelSymbols,
    report::evidence::{EvidenceFiles, FilesSettings, Written},
};

/// Bytes the perf ring adds to each record (its header and alignment).
const RING_OVERHEAD: u64 = 16;
/// Intervals of records at the rate limit a ring holds by default.
const RING_INTERVALS: u64 = 4;

/// The pages of each CPU's ring: `--capture-ring-pages`, else enough for
/// [`RING_INTERVALS`] intervals of records at the rate limit (a power of
/// two, 8 to 1,024 pages).
pub fn ring_pages(capture: &settings::Capture, interval: Duration) -> usize {
    if let Some(pages) = capture.ring_pages {
        return pages;
    }
    let record = size_of::<EvidenceHeader>() as u64 + u64::from(capture.snap) + RING_OVERHEAD;
    let per_interval = (u64::from(capture.rate) as f64 * interval.as_secs_f64()).ceil() as u64;
    let bytes = record * per_interval.max(1) * RING_INTERVALS;
    (bytes.div_ceil(4096) as usize)
        .next_power_of_two()
        .clamp(8, 1024)
}

/// What the monitor knows to name a record.
pub struct Names<'a> {
    /// Interface names by index.
    pub ifaces: &'a HashMap<u32, String>,
    /// The running kernel's drop reasons.
    pub kernel: &'a KernelReasons,
    /// The kernel's functions (drop locations).
    pub symbols: &'a mut KernelSymbols,
}

/// The rings and the files of a run that captures.
pub struct Capture {
    rings: EvidenceRings,
    files: EvidenceFiles,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns: the programs stamp
    /// records with the monotonic clock (`bpf_ktime_get_ns`).
    epoch_offset_ns: i128,
    counts: EvidenceCounts,
}

impl Capture {
    /// Opens the files' directory and the rings, and switches capture on
    /// in the programs.
    pub fn start(
        observer: &mut Observer,
        capture: &settings::Capture,
        interval: Duration,
    ) -> Result<Capture> {
        let files = EvidenceFiles::open(FilesSettings {
            dir: capture.dir.clone(),
            max_file_bytes: capture.file_bytes,
            max_files: capture.files,
            snap: capture.snap,
            ..FilesSettings::default()
        })
        .with_context(|| format!("--capture-dir {}", capture.dir.display()))?;
        // A killed run's partial files, completed at open: say so once.
        let recovery = files.recovery();
        for path in &recovery.completed {
            tracing::info!(file = %path.display(), "completed a killed run's evidence file");
        }
        for problem in &recovery.problems {
            tracing::warn!(error = %problem, "a killed run's evidence file was left as it was");
        }
        let pages = ring_pages(capture, interval);
        let rings = observer
            .open_evidence(pages, capture.snap, capture.rate)
            .context("--capture-dir")?;
        tracing::info!(
            dir = %capture.dir.display(),
            snap = capture.snap,
            rate = capture.rate,
            ring_pages = pages,
            "capturing evidence"
        );
        Ok(Capture {
            rings,
            files,
            epoch_offset_ns: epoch_offset_ns(),
            counts: EvidenceCounts::default(),
        })
    }

    /// Writes what the rings hold.
    pub fn drain(&mut self, names: Names<'_>) {
        let mut records = Vec::new();
        if let Err(e) = self.rings.read(Duration::ZERO, |r| records.push(r)) {
            tracing::warn!(error = %e, "reading the evidence rings");
        }
        if records.is_empty() {
            return;
        }
        names
            .symbols
            .resolve(records.iter().map(|r| r.header.key.location));
        for record in records {
            let Some(evidence) = evidence_of(record, &names, self.epoch_offset_ns) else {
                self.counts.not_drops += 1;
                continue;
            };
            match self.files.write(&evidence) {
                Ok(Written::Frame) => self.counts.written += 1,
                Ok(Written::SkippedLowSpace) => self.counts.skipped_low_space += 1,
                Err(e) => {
                    self.counts.failed += 1;
                    // Once per failure run, not per frame.
                    if self.counts.failed == 1 || self.counts.failed.is_power_of_two() {
                        tracing::warn!(error = %e, failed = self.counts.failed, "writing evidence");
                    }
                }
            }
        }
    }

    /// What was written and left out so far (the userspace part: the
    /// programs' part is in the kernel stats).
    pub fn counts(&self) -> EvidenceCounts {
        let files = self.files.stats();
        EvidenceCounts {
            files_completed: files.files_completed,
            files_removed: files.files_removed,
            ..self.counts
        }
    }

    /// Drains the rings a last time and completes the file being written.
    pub fn finish(mut self, names: Names<'_>) {
        self.drain(names);
        if let Err(e) = self.files.finish() {
            tracing::warn!(error = %e, "completing the last evidence file");
        }
    }
}

/// The record as evidence, named; `None` for a kernel drop the drop rows
/// leave out (`rows::socket_level` after decapsulation: the packet
/// reached its host).
fn evidence_of(
    record: EvidenceRecord,
    names: &Names<'_>,
    epoch_offset_ns: i128,
) -> Option<Evidence> {
    let header = record.header;
    let id = DropId::from_key(&header.key);
    let location = names.symbols.name(id.location);
    let reasons = match id.origin {
        Origin::Classifier => (1..32)
            .filter(|bit| header.reasons & (1 << bit) != 0)
            .filter_map(|bit| ClassifierDrop::from_u16(bit as u16))
            .map(|reason| reason.name().to_string())
            .collect(),
        Origin::Kernel => {
            let reason = id.reason_name(names.kernel);
            if id.stage != Stage::Underlay && rows::socket_level(&reason, location.as_deref()) {
                return None;
            }
            vec![reason]
        }
    };
    // One link type for every frame of a file, as libpcap (tcpdump) reads
    // nothing else: a packet from its IP header goes behind a synthetic
    // Ethernet header, as replay reads raw IP.
    let (data, wire_len) = if header.link == evidence_link::RAW_IP {
        let packet_len = record.data.len();
        let frame = capture::to_ethernet(capture::LINKTYPE_RAW, record.data);
        let link_header = (frame.len() - packet_len) as u32;
        (frame, header.wire_len.saturating_add(link_header))
    } else {
        (record.data, header.wire_len)
    };
    let wall_ns = (i128::from(header.time_ns) + epoch_offset_ns).max(0);
    Some(Evidence {
        timestamp: Duration::from_nanos(u64::try_from(wall_ns).unwrap_or(u64::MAX)),
        ifindex: id.ifindex,
        interface: names
            .ifaces
            .get(&id.ifindex)
            .cloned()
            .unwrap_or_else(|| format!("if{}", id.ifindex)),
        direction: id.direction,
        stage: id.stage,
        origin: id.origin,
        peer: id.peer,
        reasons,
        location,
        wire_len,
        data,
    })
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now, in ns.
fn epoch_offset_ns() -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use observer_common::{Direction, DropKey, drop_origin, family, stage};

    use super::*;

    fn capture(rate: u32, ring_pages: Option<usize>) -> settings::Capture {
        settings::Capture {
            dir: "/tmp".into(),
            snap: 256,
            rate,
            file_bytes: 16 << 20,
            files: 8,
            ring_pages,
        }
    }

    #[test]
    fn rings_hold_four_intervals_at_the_rate_limit_unless_sized() {
        let second = Duration::from_secs(1);
        // 100 records of 72 + 256 + 16 bytes a second, four seconds:
        // 134 KiB, 34 pages, rounded up to 64.
        assert_eq!(ring_pages(&capture(100, None), second), 64);
        assert_eq!(ring_pages(&capture(1, None), second), 8);
        assert_eq!(ring_pages(&capture(1_000_000, None), second), 1024);
        assert_eq!(
            ring_pages(&capture(100, None), Duration::from_secs(10)),
            512
        );
        assert_eq!(ring_pages(&capture(100, Some(2)), second), 2);
    }

    fn record(origin: u8, reasons: u32, reason: u32, stage_: u8) -> EvidenceRecord {
        EvidenceRecord {
            header: EvidenceHeader {
                key: DropKey {
                    peer: [u32::from_ne_bytes([10, 0, 0, 2]), 0, 0, 0],
                    ifindex: 7,
                    reason,
                    origin,
                    peer_family: family::V4,
                    stage: stage_,
                    direction: Direction::Rx as u8,
                    ..DropKey::default()
                },
                time_ns: 5_000_000_000,
                reasons,
                wire_len: 1500,
                captured: 3,
                link: evidence_link::ETHERNET,
            },
            data: vec![1, 2, 3],
        }
    }

    #[test]
    fn records_are_named_and_socket_layer_drops_after_decapsulation_left_out() {
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let kernel = KernelReasons {
            reasons: HashMap::from([
                (2, "NO_SOCKET".to_string()),
                (6, "NETFILTER_DROP".to_string()),
            ]),
            subsystems: HashMap::new(),
        };
        let mut symbols = KernelSymbols::open();
        let names = Names {
            ifaces: &ifaces,
            kernel: &kernel,
            symbols: &mut symbols,
        };
        let both = (1 << ClassifierDrop::CalicoAllowSet as u32)
            | (1 << ClassifierDrop::BadOuterChecksum as u32);
        let flagged = evidence_of(
            record(drop_origin::CLASSIFIER, both, 8, stage::UNDERLAY),
            &names,
            1_000,
        )
        .unwrap();
        assert_eq!(flagged.reasons, ["calico_allow_set", "bad_outer_checksum"]);
        assert_eq!(flagged.interface, "eth0");
        assert_eq!(flagged.peer, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(flagged.origin, Origin::Classifier);
        assert_eq!(flagged.timestamp, Duration::from_nanos(5_000_001_000));
        assert_eq!((flagged.wire_len, flagged.data.len()), (1500, 3));

        let dropped =
            evidence_of(record(drop_origin::KERNEL, 0, 6, stage::TUNNEL), &names, 0).unwrap();
        assert_eq!(dropped.reasons, ["NETFILTER_DROP"]);
        assert_eq!(dropped.stage, Stage::Tunnel);
        // After decapsulation the IP packet goes behind a synthetic
        // Ethernet header, and its length with it.
        let mut inner = record(drop_origin::KERNEL, 0, 6, stage::TUNNEL);
        inner.header.link = evidence_link::RAW_IP;
        inner.data = vec![0x45, 0, 0];
        let inner = evidence_of(inner, &names, 0).unwrap();
        assert_eq!(
            inner.data,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00, 0x45, 0, 0]
        );
        assert_eq!(inner.wire_len, 1514);
        // What the drop rows leave out is not evidence either.
        let delivered = record(drop_origin::KERNEL, 0, 2, stage::TUNNEL);
        assert!(evidence_of(delivered, &names, 0).is_none());
        let on_the_wire = record(drop_origin::KERNEL, 0, 2, stage::UNDERLAY);
        assert!(evidence_of(on_the_wire, &names, 0).is_some());
    }
}
