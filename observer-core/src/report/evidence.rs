//! Evidence files (`--capture-dir DIR`): the frames the observer flagged
//! or saw dropped ([`Evidence`]), written as pcapng into a bounded,
//! rotating set of files that readers only ever see complete.
//!
//! - One file at a time is written, under a hidden temporary name
//!   (`.observer-<stamp>-XXXXXX.pcapng.partial`, random, created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0644 set on the descriptor, as
//!   `textfile::write_atomic` does: the directory may be shared, and the
//!   observer runs as root; locked with flock(2) while written, so that
//!   another observer's start does not take it for a leftover). It is
//!   completed — fsync, then renamed without replacing anything to
//!   `observer-<YYYYmmddTHHMMSSZ>-<seq>.pcapng` (the UTC time of its
//!   first frame and a sequence number that goes on from the highest in
//!   the directory), the directory synced — when the next frame would take it past
//!   `max_file_bytes`, and on [`EvidenceFiles::finish`] (also on drop).
//!   Wireshark, `observer replay` and rsync therefore never read a file
//!   while it grows.
//! - After each completion the oldest completed files of that naming (by
//!   sequence number) beyond `max_files` are removed; no other file is
//!   ever touched. The directory holds at most `max_files` completed files
//!   and the one being written: (`max_files` + 1) × `max_file_bytes`
//!   (a file exceeds the size only when a single frame does).
//! - No file is started or grown while the filesystem has less than
//!   `min_free_bytes` available: the frame is skipped
//!   ([`Written::SkippedLowSpace`]).
//! - Each frame's blocks are written with one `write(2)` of whole blocks,
//!   and a write that fails is cut back to the last whole block, so the
//!   file is valid pcapng up to its last whole block at every instant;
//!   the leftovers of a killed run are completed at the next start
//!   ([`EvidenceFiles::open`]).
//!
//! The pcapng: a section header (`shb_userappl` names the observer), one
//! interface description per interface name as first met in each file
//! (`if_name`, the snap length, `if_tsresol` 9: nanoseconds), and an
//! enhanced packet block per frame whose `opt_comment` is
//! [`Evidence::comment`] (Wireshark's `frame.comment`). Every interface is
//! Ethernet: every frame's data starts with an Ethernet header (a synthetic
//! one after decapsulation), because libpcap, and so tcpdump, refuses a
//! file whose interfaces differ in link type.

use std::{
    borrow::Cow,
    ffi::CString,
    fs,
    io::{self, Write},
    os::unix::{
        ffi::OsStrExt,
        fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use pcap_file::{
    DataLink, PcapError,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
            section_header::{SectionHeaderBlock, SectionHeaderOption},
        },
    },
};

use super::textfile::create_shared_temp;
use crate::model::evidence::Evidence;

/// Default `dir`.
pub const DEFAULT_DIR: &str = "/var/lib/observer/evidence";
/// Default `max_file_bytes`: 16 MiB, about 40,000 frames of 256 bytes
/// with their block headers and comments.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 << 20;
/// Default `max_files`: with the file being written, at most 144 MiB.
pub const DEFAULT_MAX_FILES: usize = 8;
/// Default `snap`: bytes kept of each frame, enough for every header of
/// a tunnel packet and the start of its inner payload.
pub const DEFAULT_SNAP: u32 = 256;
/// Default `min_free_bytes`: 256 MiB. An absolute floor rather than a
/// share of the filesystem: what the node's other writers (logs, the
/// container runtime, kubelet, which starts evicting pods at 10-15 %
/// free) need does not grow with the disk, and a share of a 2 TB disk
/// would keep the observer from writing long before anything is short.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 256 << 20;
/// The largest `snap`: tcpdump's largest snap length.
pub const MAX_SNAP: u32 = 262_144;

/// Completed files: `observer-<stamp>-<seq>.pcapng`.
const NAME_PREFIX: &str = "observer-";
const NAME_SUFFIX: &str = ".pcapng";
/// The file being written: `.observer-<stamp>-XXXXXX.pcapng.partial`.
const PARTIAL_PREFIX: &str = ".observer-";
const PARTIAL_SUFFIX: &str = ".pcapng.partial";
/// Characters of a stamp, `YYYYmmddTHHMMSSZ`.
const STAMP_LEN: usize = 16;
/// The latest time a stamp can say, 9999-12-31T23:59:59Z: names keep
/// their length and a damaged timestamp cannot overflow the clock.
const MAX_STAMP_SECS: u64 = 253_402_300_799;
/// Sequence numbers tried when a completed name is taken (by another
/// process writing the same directory) before giving up.
const RENAME_TRIES: usize = 64;
/// `if_tsresol` 9: timestamps in nanoseconds. pcap-file writes an
/// enhanced packet block's timestamp as its `Duration` in nanoseconds
/// whatever the interface says, so this is the one value that reads back
/// right; it also keeps the kernel's nanoseconds.
const TS_RESOL_NANOS: u8 = 9;
/// Bytes of a string option (comment, interface name) at most. pcap-file
/// writes an option's length as 16 bits without checking; no observer
/// comment comes near this (names are short), a longer one is cut at a
/// character boundary.
const MAX_OPTION_BYTES: usize = 4_096;

/// pcapng block types and the byte-order magic, for reading leftovers.
const SECTION_HEADER_BLOCK: u32 = 0x0A0D_0D0A;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const PACKET_BLOCKS: [u32; 3] = [2, 3, 6];

/// Where and how much evidence is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesSettings {
    /// The directory (created, mode 0755, when missing).
    pub dir: PathBuf,
    /// A file is completed before it would exceed this size.
    pub max_file_bytes: u64,
    /// Completed files kept; older ones are removed.
    pub max_files: usize,
    /// Bytes kept of each frame (the interface descriptions' snap
    /// length), 1 to [`MAX_SNAP`]: longer data is cut.
    pub snap: u32,
    /// No file is started or grown while the filesystem has less than
    /// this available (`f_bavail`: root's reserved blocks not counted,
    /// though the observer runs as root).
    pub min_free_bytes: u64,
}

impl FilesSettings {
    /// The defaults, in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> FilesSettings {
        FilesSettings {
            dir: dir.into(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_files: DEFAULT_MAX_FILES,
            snap: DEFAULT_SNAP,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
        }
    }
}

impl Default for FilesSettings {
    /// The defaults, in [`DEFAULT_DIR`].
    fn default() -> FilesSettings {
        FilesSettings::new(DEFAULT_DIR)
    }
}

/// What became of a frame handed to [`EvidenceFiles::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// In the file being written.
    Frame,
    /// Skipped: the filesystem had fewer than `min_free_bytes` available.
    SkippedLowSpace,
}

/// Counters since [`EvidenceFiles::open`], for export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvidenceStats {
    /// Frames written.
    pub frames_written: u64,
    /// Bytes written, block headers and interface descriptions included.
    pub bytes_written: u64,
    /// Files completed (renamed to their final name), a killed run's
    /// leftovers included.
    pub files_completed: u64,
    /// Completed files removed by rotation.
    pub files_removed: u64,
}

/// What [`EvidenceFiles::open`] did with a killed run's leftovers.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Completed under their final names (cut to their last whole block).
    pub completed: Vec<PathBuf>,
    /// Removed: they held no whole packet.
    pub removed: Vec<PathBuf>,
    /// Left in place, and why.
    pub problems: Vec<EvidenceError>,
}

/// Why evidence could not be written. Each names the path, the cause and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// A setting that cannot work.
    #[error("--capture-dir {}: {why}", .dir.display())]
    Settings {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        why: &'static str,
    },
    /// The filesystem is full (or the quota reached) while writing.
    #[error("no space left on {}: free some or lower --capture-files ({error})", .dir.display())]
    NoSpace {
        /// The directory.
        dir: PathBuf,
        /// What the kernel said.
        error: io::Error,
    },
    /// A file system operation failed.
    #[error("cannot {action} {}: {}", .path.display(), cause(.error))]
    Io {
        /// What was being done (`create a file in`, `write`, ...).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// What the kernel said.
        error: io::Error,
    },
    /// pcap-file refused a block (not an I/O error: blocks are encoded in
    /// memory).
    #[error("cannot encode a pcapng block for {}: {reason}", .path.display())]
    Encode {
        /// The file.
        path: PathBuf,
        /// What pcap-file said.
        reason: String,
    },
}

/// The cause of an I/O error in words, with what to do for the causes a
/// user fixes.
fn cause(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            "permission denied: run the observer as root or give it a --capture-dir it can write"
                .to_string()
        }
        Some(libc::EROFS) => "read-only file system: choose a writable --capture-dir".to_string(),
        Some(libc::ENOENT) => "no such file or directory".to_string(),
        _ => error.to_string(),
    }
}

/// `error` while doing `action` on `path`: [`EvidenceError::NoSpace`] when
/// the filesystem is full.
fn io_error(dir: &Path, action: &'static str, path: &Path, error: io::Error) -> EvidenceError {
    if matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        EvidenceError::NoSpace {
            dir: dir.to_path_buf(),
            error,
        }
    } else {
        EvidenceError::Io {
            action,
            path: path.to_path_buf(),
            error,
        }
    }
}

/// The file being written.
struct Current {
    file: fs::File,
    /// Its hidden name.
    partial: PathBuf,
    /// The UTC time of its first frame, for the final name.
    stamp: String,
    /// Bytes in it: whole blocks only.
    len: u64,
    /// Packets in it.
    frames: u64,
    /// Its interface descriptions' names, by interface id.
    interfaces: Vec<String>,
    /// Encodes blocks into memory; knows the same interfaces (it refuses
    /// a packet of an undeclared one).
    encoder: PcapNgWriter<Vec<u8>>,
}

/// The evidence files of one directory. Writes are unbuffered (one
/// `write(2)` per frame: the kernel side rate-limits the frames), so what
/// was written survives a kill.
pub struct EvidenceFiles {
    settings: FilesSettings,
    current: Option<Current>,
    /// The highest sequence number of a completed file.
    seq: u64,
    stats: EvidenceStats,
    recovery: Recovery,
}

impl EvidenceFiles {
    /// Opens `settings.dir` (created when missing) and completes the
    /// leftovers of a killed run: each `.observer-*.pcapng.partial`
    /// regular file this user owns is cut to its last whole block and
    /// renamed like any completed file (removed when it holds no whole
    /// packet), then rotation runs. Completing rather than deleting: a
    /// partial file is valid pcapng up to its last whole block, and the
    /// frames before a crash are the evidence most wanted. What could not
    /// be completed is in [`EvidenceFiles::recovery`]; an error here is a
    /// directory that cannot be created or listed.
    pub fn open(settings: FilesSettings) -> Result<EvidenceFiles, EvidenceError> {
        let why = if settings.max_files == 0 {
            Some("--capture-files must be at least 1")
        } else if settings.max_file_bytes == 0 {
            Some("the file size must be at least 1 byte")
        } else if settings.snap == 0 || settings.snap > MAX_SNAP {
            Some("the snap length must be 1 to 262144 bytes")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(EvidenceError::Settings {
                dir: settings.dir,
                why,
            });
        }
        let dir = &settings.dir;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| io_error(dir, "create the directory", dir, e))?;
        let listing = list(dir)?;
        let mut files = EvidenceFiles {
            seq: listing
                .completed
                .iter()
                .map(|(seq, _)| *seq)
                .max()
                .unwrap_or(0),
            settings,
            current: None,
            stats: EvidenceStats::default(),
            recovery: Recovery::default(),
        };
        let mut leftovers = listing.leftovers;
        // Stamps first in their names: oldest first.
        leftovers.sort();
        for path in leftovers {
            match files.recover(&path) {
                Ok(Leftover::Completed(done)) => files.recovery.completed.push(done),
                Ok(Leftover::Removed) => files.recovery.removed.push(path),
                Ok(Leftover::Foreign) => {}
                Err(e) => files.recovery.problems.push(e),
            }
        }
        if let Err(e) = files.rotate() {
            files.recovery.problems.push(e);
        }
        Ok(files)
    }

    /// Counters since open.
    pub fn stats(&self) -> EvidenceStats {
        self.stats
    }

    /// What open did with a killed run's leftovers.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Writes `e` (its data cut to the snap length) into the current
    /// file, first completing that file when `e` would take it past
    /// `max_file_bytes` (a file holds at least one frame). Skipped
    /// ([`Written::SkippedLowSpace`]) while the filesystem has less than
    /// `min_free_bytes` available. On an error nothing of the frame is in
    /// the file, and the next write goes on.
    pub fn write(&mut self, e: &Evidence) -> Result<Written, EvidenceError> {
        let dir = &self.settings.dir;
        // One statvfs per frame: the kernel side rate-limits frames, and
        // a cached figure would let a burst fill the last bytes.
        let available =
            free_bytes(dir).map_err(|err| io_error(dir, "read the free space of", dir, err))?;
        if available < self.settings.min_free_bytes {
            return Ok(Written::SkippedLowSpace);
        }
        let snap = self.settings.snap;
        let mut current = match self.current.take() {
            Some(current) => current,
            None => self.start(e)?,
        };
        let mut blocks = match current.encode(e, snap) {
            Ok(blocks) => blocks,
            Err(err) => {
                self.current = Some(current);
                return Err(err);
            }
        };
        let fits =
            current.len.saturating_add(blocks.bytes.len() as u64) <= self.settings.max_file_bytes;
        if !fits && current.frames > 0 {
            self.current = Some(current);
            self.finish()?;
            current = self.start(e)?;
            blocks = match current.encode(e, snap) {
                Ok(blocks) => blocks,
                Err(err) => {
                    self.current = Some(current);
                    return Err(err);
                }
            };
        }
        match current.append(blocks, snap) {
            Ok(bytes) => {
                self.stats.frames_written += 1;
                self.stats.bytes_written += bytes;
                self.current = Some(current);
                Ok(Written::Frame)
            }
            Err((err, cut_back)) => {
                let error = io_error(&self.settings.dir, "write", &current.partial, err);
                // A file that could not be cut back is left as it is:
                // completed (cut to its last whole block) at the next
                // start.
                if cut_back {
                    self.current = Some(current);
                }
                Err(error)
            }
        }
    }

    /// Completes the file being written, if any, and rotates. Returns the
    /// completed file's path. The caller calls it on exit; dropping the
    /// writer does it too, without a word on failure.
    pub fn finish(&mut self) -> Result<Option<PathBuf>, EvidenceError> {
        let Some(current) = self.current.take() else {
            return Ok(None);
        };
        let dir = self.settings.dir.clone();
        let Current {
            file,
            partial,
            stamp,
            frames,
            ..
        } = current;
        if frames == 0 {
            // Only a header, after a failed first write: no evidence.
            drop(file);
            return fs::remove_file(&partial)
                .map(|()| None)
                .map_err(|e| io_error(&dir, "remove", &partial, e));
        }
        // Writes are unbuffered: the data is in the kernel; make it stay
        // there before the name says the file is complete. On failure the
        // file stays a leftover, completed at the next start.
        file.sync_all()
            .map_err(|e| io_error(&dir, "sync", &partial, e))?;
        drop(file);
        let done = self.complete(&partial, &stamp)?;
        self.rotate()?;
        Ok(Some(done))
    }

    /// Starts a file for `e`: the hidden name, the section header.
    fn start(&mut self, e: &Evidence) -> Result<Current, EvidenceError> {
        let dir = &self.settings.dir;
        let stamp = utc_stamp(e.timestamp);
        // Appends: a write cut back with set_len goes on at the new end.
        // On failure the file is removed when `tmp` drops.
        let tmp = create_shared_temp(
            dir,
            &format!("{PARTIAL_PREFIX}{stamp}-"),
            PARTIAL_SUFFIX,
            true,
        )
        .map_err(|err| io_error(dir, "create a file in", dir, err))?;
        // Locked while this process lives, so that another observer
        // starting on the same directory does not take it for a leftover.
        lock(tmp.as_file()).map_err(|err| io_error(dir, "lock", tmp.path(), err))?;
        let (file, partial) = tmp
            .keep()
            .map_err(|err| io_error(dir, "keep", dir, err.error))?;
        let mut encoder = PcapNgWriter::with_section_header(Vec::new(), section_header())
            .map_err(|err| encode_error(&partial, &err))?;
        let header = std::mem::take(encoder.get_mut());
        if let Err(err) = (&file).write_all(&header) {
            drop(file);
            let _ = fs::remove_file(&partial);
            return Err(io_error(dir, "write", &partial, err));
        }
        self.stats.bytes_written += header.len() as u64;
        Ok(Current {
            file,
            partial,
            stamp,
            len: header.len() as u64,
            frames: 0,
            interfaces: Vec::new(),
            encoder,
        })
    }

    /// Renames `partial` to the next free completed name with `stamp`,
    /// never replacing a file.
    fn complete(&mut self, partial: &Path, stamp: &str) -> Result<PathBuf, EvidenceError> {
        let dir = &self.settings.dir;
        let mut last = None;
        for _ in 0..RENAME_TRIES {
            self.seq += 1;
            let done = dir.join(format!("{NAME_PREFIX}{stamp}-{:06}{NAME_SUFFIX}", self.seq));
            // tempfile's no-replace rename: renameat2(RENAME_NOREPLACE),
            // else link and unlink where the filesystem lacks it.
            let from = tempfile::TempPath::try_from_path(partial)
                .map_err(|err| io_error(dir, "complete", partial, err))?;
            match from.persist_noclobber(&done) {
                Ok(()) => {
                    self.stats.files_completed += 1;
                    // The new name survives a crash only once the
                    // directory is synced: a file counted as completed
                    // must not come back as a partial one.
                    fs::File::open(dir)
                        .and_then(|d| d.sync_all())
                        .map_err(|err| io_error(dir, "sync", dir, err))?;
                    return Ok(done);
                }
                Err(err) => {
                    // Not ours to delete on failure.
                    let _ = err.path.keep();
                    if err.error.kind() != io::ErrorKind::AlreadyExists {
                        return Err(io_error(dir, "complete", partial, err.error));
                    }
                    last = Some(err.error);
                }
            }
        }
        let err = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists));
        Err(io_error(dir, "complete", partial, err))
    }

    /// Removes the oldest completed files beyond `max_files`. Tries every
    /// one; returns the first failure.
    fn rotate(&mut self) -> Result<(), EvidenceError> {
        let dir = &self.settings.dir;
        let mut completed = list(dir)?.completed;
        let Some(excess) = completed.len().checked_sub(self.settings.max_files) else {
            return Ok(());
        };
        completed.sort();
        let mut first = None;
        for (_, path) in completed.into_iter().take(excess) {
            match fs::remove_file(&path) {
                Ok(()) => self.stats.files_removed += 1,
                // Removed by someone else meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first.get_or_insert(io_error(dir, "remove", &path, e));
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Completes one leftover of a killed run.
    fn recover(&mut self, path: &Path) -> Result<Leftover, EvidenceError> {
        let dir = self.settings.dir.clone();
        let io = |action, e| io_error(&dir, action, path, e);
        let file = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(file) => file,
            // A symlink planted under the name (ELOOP), gone meanwhile.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOENT)) => {
                return Ok(Leftover::Foreign);
            }
            Err(e) => return Err(io("open", e)),
        };
        let meta = file.metadata().map_err(|e| io("read", e))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != euid {
            return Ok(Leftover::Foreign);
        }
        match lock(&file) {
            Ok(()) => {}
            // Being written by a running observer.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Leftover::Foreign),
            Err(e) => return Err(io("lock", e)),
        }
        let (whole, packets) = whole_blocks(&file, meta.len()).map_err(|e| io("read", e))?;
        if packets == 0 {
            drop(file);
            fs::remove_file(path).map_err(|e| io("remove", e))?;
            return Ok(Leftover::Removed);
        }
        if whole < meta.len() {
            file.set_len(whole).map_err(|e| io("cut", e))?;
        }
        file.sync_all().map_err(|e| io("sync", e))?;
        drop(file);
        let stamp = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(partial_stamp)
            .map(str::to_string)
            .unwrap_or_else(|| {
                let modified = meta.modified().ok();
                let since = modified.and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok());
                utc_stamp(since.unwrap_or_default())
            });
        self.complete(path, &stamp).map(Leftover::Completed)
    }
}

impl Drop for EvidenceFiles {
    fn drop(&mut self) {
        // Best effort: what fails stays a leftover for the next start.
        let _ = self.finish();
    }
}

/// What became of a leftover.
enum Leftover {
    Completed(PathBuf),
    Removed,
    /// Not this user's regular file, or one a running observer writes:
    /// left alone.
    Foreign,
}

/// One frame's blocks, encoded.
struct Blocks {
    bytes: Vec<u8>,
    /// The name of the interface description among them, if any.
    interface: Option<String>,
}

impl Current {
    /// `e`'s blocks in this file's terms: its interface description when
    /// the file has none for it yet, then its packet.
    fn encode(&mut self, e: &Evidence, snap: u32) -> Result<Blocks, EvidenceError> {
        let known = self.interfaces.iter().position(|name| *name == e.interface);
        let id = known.unwrap_or(self.interfaces.len());
        let encoded = (|| {
            self.encoder.get_mut().clear();
            if known.is_none() {
                self.encoder
                    .write_pcapng_block(interface_description(&e.interface, snap))?;
            }
            let data = &e.data[..e.data.len().min(snap as usize)];
            let captured = u32::try_from(data.len()).unwrap_or(u32::MAX);
            self.encoder.write_pcapng_block(EnhancedPacketBlock {
                interface_id: u32::try_from(id).unwrap_or(u32::MAX),
                timestamp: e.timestamp,
                // Never less than captured: readers call that damage.
                original_len: e.wire_len.max(captured),
                data: Cow::Borrowed(data),
                options: vec![EnhancedPacketOption::Comment(Cow::Owned(bounded(
                    e.comment(),
                )))],
            })
        })();
        encoded.map_err(|err| encode_error(&self.partial, &err))?;
        Ok(Blocks {
            bytes: std::mem::take(self.encoder.get_mut()),
            interface: known.is_none().then(|| e.interface.clone()),
        })
    }

    /// Writes a frame's `blocks` in one write; returns their size. On
    /// failure the file is cut back to its last whole block (part of a
    /// block would end the readable file there) and the encoder told
    /// which interfaces the file declares; the flag says whether that
    /// worked.
    fn append(&mut self, blocks: Blocks, snap: u32) -> Result<u64, (io::Error, bool)> {
        match (&self.file).write_all(&blocks.bytes) {
            Ok(()) => {
                let bytes = blocks.bytes.len() as u64;
                self.len += bytes;
                self.frames += 1;
                self.interfaces.extend(blocks.interface);
                Ok(bytes)
            }
            Err(err) => {
                let cut = self.file.set_len(self.len);
                let encoder = encoder_knowing(&self.interfaces, snap);
                let cut_back = match (cut, encoder) {
                    (Ok(()), Ok(encoder)) => {
                        self.encoder = encoder;
                        true
                    }
                    _ => false,
                };
                Err((err, cut_back))
            }
        }
    }
}

fn encode_error(path: &Path, err: &PcapError) -> EvidenceError {
    EvidenceError::Encode {
        path: path.to_path_buf(),
        reason: err.to_string(),
    }
}

/// The section header: the byte order of this machine, the observer named.
fn section_header() -> SectionHeaderBlock<'static> {
    SectionHeaderBlock {
        options: vec![SectionHeaderOption::UserApplication(Cow::Borrowed(
            concat!("observer ", env!("CARGO_PKG_VERSION")),
        ))],
        ..SectionHeaderBlock::default()
    }
}

fn interface_description(name: &str, snap: u32) -> InterfaceDescriptionBlock<'static> {
    InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: snap,
        options: vec![
            InterfaceDescriptionOption::IfName(Cow::Owned(bounded(name.to_string()))),
            InterfaceDescriptionOption::IfTsResol(TS_RESOL_NANOS),
        ],
    }
}

/// An encoder that knows `interfaces` (their blocks are in the file).
fn encoder_knowing(interfaces: &[String], snap: u32) -> Result<PcapNgWriter<Vec<u8>>, PcapError> {
    let mut encoder = PcapNgWriter::with_section_header(Vec::new(), section_header())?;
    for name in interfaces {
        encoder.write_pcapng_block(interface_description(name, snap))?;
    }
    encoder.get_mut().clear();
    Ok(encoder)
}

/// `text` cut to [`MAX_OPTION_BYTES`] at a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_OPTION_BYTES {
        let mut end = MAX_OPTION_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `YYYYmmddTHHMMSSZ` of `since_epoch`, clamped to year 9999.
fn utc_stamp(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs().min(MAX_STAMP_SECS);
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect()
}

/// Whether `stamp` is `YYYYmmddTHHMMSSZ`.
fn is_stamp(stamp: &str) -> bool {
    let b = stamp.as_bytes();
    b.len() == STAMP_LEN
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z'
}

/// The sequence number of a completed file's name
/// (`observer-<stamp>-<seq>.pcapng`), `None` for any other name.
fn completed_seq(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(NAME_PREFIX)?.strip_suffix(NAME_SUFFIX)?;
    let (stamp, seq) = rest.split_once('-')?;
    if !is_stamp(stamp) || seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// The stamp of a partial file's name, when it has one.
fn partial_stamp(name: &str) -> Option<&str> {
    let rest = name
        .strip_prefix(PARTIAL_PREFIX)?
        .strip_suffix(PARTIAL_SUFFIX)?;
    let stamp = rest.get(..STAMP_LEN)?;
    is_stamp(stamp).then_some(stamp)
}

/// The observer's files in a directory.
struct Listing {
    /// Completed files and their sequence numbers.
    completed: Vec<(u64, PathBuf)>,
    /// Partial files (of a killed run, or the one being written).
    leftovers: Vec<PathBuf>,
}

/// The regular files of `dir` named as the observer names its files (the
/// type as the directory says it: a symlink is never followed).
fn list(dir: &Path) -> Result<Listing, EvidenceError> {
    let listing_error = |e| io_error(dir, "list", dir, e);
    let mut listing = Listing {
        completed: Vec::new(),
        leftovers: Vec::new(),
    };
    for entry in fs::read_dir(dir).map_err(listing_error)? {
        let entry = entry.map_err(listing_error)?;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !kind.is_file() {
            continue;
        }
        if let Some(seq) = completed_seq(name) {
            listing.completed.push((seq, entry.path()));
        } else if name.starts_with(PARTIAL_PREFIX) && name.ends_with(PARTIAL_SUFFIX) {
            listing.leftovers.push(entry.path());
        }
    }
    Ok(listing)
}

/// Bytes of `file` (of `size` bytes) that are whole pcapng blocks from
/// the start, and the packets among them: each block's two length fields
/// agree and it ends within the file. (0, 0) when it does not start with
/// a section header.
fn whole_blocks(file: &fs::File, size: u64) -> io::Result<(u64, u64)> {
    let (mut at, mut packets, mut little) = (0u64, 0u64, true);
    while size - at >= 12 {
        let mut head = [0u8; 12];
        file.read_exact_at(&mut head, at)?;
        let word = |b: &[u8], little: bool| {
            let b = [b[0], b[1], b[2], b[3]];
            if little {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        // The section header's type reads the same in both byte orders;
        // its byte-order magic says which one the section uses.
        if word(&head[..4], true) == SECTION_HEADER_BLOCK {
            little = match word(&head[8..], true) {
                BYTE_ORDER_MAGIC => true,
                _ if word(&head[8..], false) == BYTE_ORDER_MAGIC => false,
                _ => break,
            };
        } else if at == 0 {
            break;
        }
        let len = u64::from(word(&head[4..8], little));
        if len < 12 || len % 4 != 0 || len > size - at {
            break;
        }
        let mut tail = [0u8; 4];
        file.read_exact_at(&mut tail, at + len - 4)?;
        if u64::from(word(&tail, little)) != len {
            break;
        }
        if PACKET_BLOCKS.contains(&word(&head[..4], little)) {
            packets += 1;
        }
        at += len;
    }
    Ok((at, packets))
}

/// Takes `file`'s exclusive lock without waiting (`WouldBlock` when
/// another process holds it); the kernel releases it with the last
/// descriptor, also when the process is killed.
fn lock(file: &fs::File) -> io::Result<()> {
    // SAFETY: the descriptor is open for the call's duration.
    if unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes available to unprivileged users on the filesystem of `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stat` is large enough for
    // the struct statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    // The field types differ between targets (32 bits on some).
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (stat.f_bavail as u64, stat.f_frsize as u64);
    Ok(blocks.saturating_mul(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{self, Frame};
    use crate::model::{evidence::Origin, rows::Stage};
    use observer_common::Direction;
    use pcap_file::pcapng::{Block, PcapNgReader};
    use std::os::unix::fs::symlink;

    fn evidence(n: u32) -> Evidence {
        Evidence {
            timestamp: Duration::new(1_700_000_000 + u64::from(n), n * 1_000 + 7),
            ifindex: 2,
            interface: "eth0".to_string(),
            direction: Direction::Rx,
            stage: Stage::Underlay,
            origin: Origin::Classifier,
            peer: Some("10.0.0.2".parse().unwrap()),
            reasons: vec!["calico_allow_set".to_string()],
            location: None,
            wire_len: 1_500,
            // Same length for every n: every packet block the same size.
            data: (0..100).map(|i| (i as u32 + n) as u8).collect(),
        }
    }

    const ETH_P_IP: u16 = 0x0800;
    const ETH_P_IPV6: u16 = 0x86dd;

    /// [`evidence`] as a kernel drop on a tunnel device.
    fn dropped_after_decapsulation(n: u32) -> Evidence {
        Evidence {
            interface: "tunl0".to_string(),
            stage: Stage::Tunnel,
            origin: Origin::Kernel,
            reasons: vec!["NETFILTER_DROP".to_string()],
            location: Some("nf_hook_slow".to_string()),
            ..evidence(n)
        }
    }

    /// `ip` behind the Ethernet header a packet freed after decapsulation
    /// gets: zero MACs, `ethertype`.
    fn synthetic_ethernet(ethertype: u16, ip: &[u8]) -> Vec<u8> {
        [&[0; 12][..], &ethertype.to_be_bytes(), ip].concat()
    }

    /// An IPv4 ICMP echo request (checksums left zero: nothing here
    /// verifies them).
    fn ipv4_icmp(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let head = [0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 1, 0, 0];
        [&head[..], &src, &dst, &[8, 0, 0, 0, 0, 1, 0, 1]].concat()
    }

    /// An IPv6 ICMPv6 echo request between the /32s `src` and `dst` (::1,
    /// ::2).
    fn ipv6_icmp(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let address = |prefix: [u8; 4], last: u8| {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&prefix);
            a[15] = last;
            a
        };
        let head = [0x60, 0, 0, 0, 0, 8, 58, 64];
        [
            &head[..],
            &address(src, 1),
            &address(dst, 2),
            &[128, 0, 0, 0, 0, 1, 0, 1],
        ]
        .concat()
    }

    fn settings(dir: &Path) -> FilesSettings {
        FilesSettings {
            min_free_bytes: 0,
            ..FilesSettings::new(dir)
        }
    }

    /// The names of `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn read_back(path: &Path) -> Vec<Frame> {
        let frames = capture::frames(fs::File::open(path).unwrap()).unwrap();
        frames.map(Result::unwrap).collect()
    }

    /// Sizes of (section header + interface description, packet block)
    /// for [`evidence`], measured.
    fn sizes() -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(settings(dir.path())).unwrap();
        files.write(&evidence(0)).unwrap();
        let one = files.stats().bytes_written;
        files.write(&evidence(1)).unwrap();
        let packet = files.stats().bytes_written - one;
        (one - packet, packet)
    }

    #[test]
    fn rotation_by_size_and_count_is_exact() {
        let (head, packet) = sizes();
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(FilesSettings {
            max_file_bytes: head + 3 * packet,
            max_files: 2,
            ..settings(dir.path())
        })
        .unwrap();
        for n in 0..10 {
            assert_eq!(files.write(&evidence(n)).unwrap(), Written::Frame);
        }
        // Frames 0-2, 3-5 and 6-8 were completed as they filled; the third
        // completion removed the first file. Frame 9 is being written,
        // under a hidden name.
        let listed = names(dir.path());
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert!(
            listed[0].starts_with(".observer-20231114T221329Z-"),
            "{listed:?}"
        );
        assert!(listed[0].ends_with(".pcapng.partial"), "{listed:?}");
        assert_eq!(
            listed[1..],
            [
                "observer-20231114T221323Z-000002.pcapng",
                "observer-20231114T221326Z-000003.pcapng"
            ]
        );
        let done = files.finish().unwrap().unwrap();
        assert_eq!(
            done,
            dir.path().join("observer-20231114T221329Z-000004.pcapng")
        );
        assert_eq!(files.finish().unwrap(), None, "nothing left to finish");
        assert_eq!(
            names(dir.path()),
            [
                "observer-20231114T221326Z-000003.pcapng",
                "observer-20231114T221329Z-000004.pcapng"
            ]
        );
        assert_eq!(
            files.stats(),
            EvidenceStats {
                frames_written: 10,
                bytes_written: 4 * head + 10 * packet,
                files_completed: 4,
                files_removed: 2,
            }
        );
        for (name, numbers) in [
            ("observer-20231114T221326Z-000003.pcapng", 6..9),
            ("observer-20231114T221329Z-000004.pcapng", 9..10),
        ] {
            let path = dir.path().join(name);
            let meta = fs::metadata(&path).unwrap();
            assert_eq!(meta.mode() & 0o777, 0o644);
            assert!(meta.len() <= head + 3 * packet);
            let frames = read_back(&path);
            assert_eq!(frames.len(), numbers.len());
            for (frame, n) in frames.iter().zip(numbers) {
                let e = evidence(n);
                assert_eq!(frame.data, e.data);
                assert_eq!(frame.timestamp, e.timestamp, "nanoseconds kept");
                assert_eq!(frame.original_len, e.wire_len);
                assert_eq!(frame.link_type, capture::LINKTYPE_ETHERNET);
                assert_eq!(frame.comment.as_deref(), Some(e.comment().as_str()));
            }
        }
    }

    #[test]
    fn each_file_describes_its_interfaces_and_frames_are_cut_to_the_snap_length() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(FilesSettings {
            snap: 64,
            ..settings(dir.path())
        })
        .unwrap();
        let tunnel = Evidence {
            // An IPv4 header's first byte.
            data: synthetic_ethernet(ETH_P_IP, &[&[0x45][..], &[0; 40]].concat()),
            wire_len: 20,
            ..dropped_after_decapsulation(1)
        };
        for e in [&evidence(0), &tunnel, &evidence(2)] {
            files.write(e).unwrap();
        }
        let done = files.finish().unwrap().unwrap();
        let frames = read_back(&done);
        assert_eq!(frames.len(), 3);
        // Cut to the snap length, the length on the wire kept.
        assert_eq!(frames[0].data, evidence(0).data[..64]);
        assert_eq!(
            (frames[0].captured_len, frames[0].original_len),
            (64, 1_500)
        );
        // Behind its synthetic Ethernet header as written; the original
        // length never below what was captured.
        assert_eq!(frames[1].link_type, capture::LINKTYPE_ETHERNET);
        assert_eq!(frames[1].data, tunnel.data);
        assert_eq!((frames[1].captured_len, frames[1].original_len), (55, 55));
        assert_eq!(frames[1].comment, Some(tunnel.comment()));
        assert_eq!(frames[2].link_type, capture::LINKTYPE_ETHERNET);
        // One interface description per name, every one Ethernet.
        let mut reader = PcapNgReader::new(fs::File::open(&done).unwrap()).unwrap();
        let mut interfaces = Vec::new();
        while let Some(block) = reader.next_block() {
            if let Block::InterfaceDescription(idb) = block.unwrap() {
                interfaces.push((
                    u32::from(idb.linktype),
                    idb.snaplen,
                    idb.into_owned().options,
                ));
            }
        }
        let described = |name: &str| {
            vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(name.to_string())),
                InterfaceDescriptionOption::IfTsResol(9),
            ]
        };
        assert_eq!(
            interfaces,
            [(1, 64, described("eth0")), (1, 64, described("tunl0"))]
        );
    }

    /// Frames of two interfaces in one file, flagged ones with their own
    /// Ethernet header and drops after decapsulation (IPv4 and IPv6)
    /// behind a synthetic one: tcpdump (libpcap, the outside reference)
    /// reads every one. libpcap refuses a file whose interfaces differ in
    /// link type, which Wireshark accepts.
    #[test]
    fn tcpdump_reads_every_frame_of_a_file_with_two_interfaces() {
        const TCPDUMP: &str = "/usr/bin/tcpdump";
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(settings(dir.path())).unwrap();
        let (v4, v6) = (
            ipv4_icmp([10, 0, 0, 2], [10, 0, 0, 1]),
            ipv6_icmp([0x20, 0x01, 0x0d, 0xb8], [0x20, 0x01, 0x0d, 0xb8]),
        );
        let flagged = |n: u32| Evidence {
            data: [
                &[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2][..],
                &ETH_P_IP.to_be_bytes(),
                &v4,
            ]
            .concat(),
            wire_len: 14 + v4.len() as u32,
            ..evidence(n)
        };
        let dropped = |n: u32, ethertype: u16, ip: &[u8]| Evidence {
            data: synthetic_ethernet(ethertype, ip),
            wire_len: 14 + ip.len() as u32,
            ..dropped_after_decapsulation(n)
        };
        let evidence = [
            flagged(0),
            dropped(1, ETH_P_IP, &v4),
            flagged(2),
            dropped(3, ETH_P_IPV6, &v6),
            dropped(4, ETH_P_IP, &v4),
            flagged(5),
        ];
        for e in &evidence {
            files.write(e).unwrap();
        }
        let done = files.finish().unwrap().unwrap();
        if !Path::new(TCPDUMP).exists() {
            eprintln!("{TCPDUMP} is absent: not checking that libpcap reads {done:?}");
            return;
        }
        // `-tt`: each packet line starts with its Unix time, seconds first.
        let out = std::process::Command::new(TCPDUMP)
            .args(["-tt", "-nn", "-r"])
            .arg(&done)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{}: {stderr}{stdout}", out.status);
        let seconds: Vec<u64> = stdout
            .lines()
            .filter_map(|line| line.split_once('.')?.0.parse().ok())
            .collect();
        let want: Vec<u64> = evidence.iter().map(|e| e.timestamp.as_secs()).collect();
        assert_eq!(seconds, want, "{stderr}{stdout}");
    }

    #[test]
    fn leftovers_of_a_killed_run_are_completed() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(settings(dir.path())).unwrap();
        for n in 0..3 {
            files.write(&evidence(n)).unwrap();
        }
        // Killed: the file closed (its lock released by the kernel)
        // without being completed; and the last write torn.
        drop(files.current.take());
        drop(files);
        let partial = dir.path().join(&names(dir.path())[0]);
        let mut torn = fs::OpenOptions::new().append(true).open(&partial).unwrap();
        torn.write_all(&[6, 0, 0, 0, 200, 0, 0, 0, 1, 2]).unwrap();
        // One that died within its header, and an older completed file.
        let empty = dir
            .path()
            .join(".observer-20231114T000000Z-abcdef.pcapng.partial");
        fs::write(&empty, &fs::read(&partial).unwrap()[..28]).unwrap();
        fs::write(
            dir.path().join("observer-20231113T000000Z-000041.pcapng"),
            b"old",
        )
        .unwrap();

        let files = EvidenceFiles::open(settings(dir.path())).unwrap();
        let recovery = files.recovery();
        assert!(recovery.problems.is_empty(), "{:?}", recovery.problems);
        assert_eq!(recovery.removed, [empty]);
        let done = dir.path().join("observer-20231114T221320Z-000042.pcapng");
        assert_eq!(recovery.completed, std::slice::from_ref(&done));
        assert_eq!(
            names(dir.path()),
            [
                "observer-20231113T000000Z-000041.pcapng",
                "observer-20231114T221320Z-000042.pcapng"
            ]
        );
        let frames = read_back(&done);
        assert_eq!(frames.len(), 3, "the torn block is cut");
        assert_eq!(frames[2].comment, Some(evidence(2).comment()));
        assert_eq!(files.stats().files_completed, 1);
    }

    #[test]
    fn a_file_another_running_observer_writes_is_no_leftover() {
        let dir = tempfile::tempdir().unwrap();
        let mut running = EvidenceFiles::open(settings(dir.path())).unwrap();
        running.write(&evidence(0)).unwrap();
        let second = EvidenceFiles::open(settings(dir.path())).unwrap();
        assert!(second.recovery().completed.is_empty());
        assert!(second.recovery().problems.is_empty());
        drop(second);
        running.write(&evidence(1)).unwrap();
        let done = running.finish().unwrap().unwrap();
        assert_eq!(read_back(&done).len(), 2);
    }

    #[test]
    fn files_the_observer_did_not_name_are_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("precious");
        fs::write(&target, b"keep me").unwrap();
        let others = [
            "notes.txt",
            "observer-foo.pcapng",
            "observer-20000101T000000Z-000001.pcapng.bak",
            "observer-20000101T000000Z-x1.pcapng",
            "observer-2000010T000000Z-000001.pcapng",
            ".observer-20000101T000000Z-abc.pcapng.tmp",
        ];
        for name in others {
            fs::write(dir.path().join(name), b"theirs").unwrap();
        }
        // Named like the observer's, but a directory and symlinks.
        fs::create_dir(dir.path().join("observer-20000101T000000Z-000001.pcapng")).unwrap();
        symlink(
            &target,
            dir.path().join("observer-20000101T000000Z-000002.pcapng"),
        )
        .unwrap();
        symlink(
            &target,
            dir.path()
                .join(".observer-20000101T000000Z-abcdef.pcapng.partial"),
        )
        .unwrap();
        let before = names(dir.path());
        let (head, packet) = sizes();
        let mut files = EvidenceFiles::open(FilesSettings {
            max_file_bytes: head + packet,
            max_files: 1,
            ..settings(dir.path())
        })
        .unwrap();
        assert!(files.recovery().completed.is_empty());
        assert!(files.recovery().problems.is_empty());
        for n in 0..5 {
            files.write(&evidence(n)).unwrap();
        }
        files.finish().unwrap();
        assert_eq!(files.stats().files_removed, 4);
        let mut want = before;
        want.push("observer-20231114T221324Z-000005.pcapng".to_string());
        want.sort();
        assert_eq!(names(dir.path()), want);
        for name in others {
            assert_eq!(fs::read(dir.path().join(name)).unwrap(), b"theirs");
        }
        assert_eq!(fs::read(&target).unwrap(), b"keep me");
    }

    #[test]
    fn below_the_free_space_floor_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = EvidenceFiles::open(FilesSettings {
            min_free_bytes: u64::MAX,
            ..settings(dir.path())
        })
        .unwrap();
        for n in 0..3 {
            assert_eq!(files.write(&evidence(n)).unwrap(), Written::SkippedLowSpace);
        }
        assert_eq!(files.finish().unwrap(), None);
        assert!(names(dir.path()).is_empty());
        assert_eq!(files.stats(), EvidenceStats::default());
    }

    #[test]
    fn settings_that_cannot_work_and_errors_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [
            FilesSettings {
                max_files: 0,
                ..settings(dir.path())
            },
            FilesSettings {
                snap: MAX_SNAP + 1,
                ..settings(dir.path())
            },
        ] {
            let err = EvidenceFiles::open(bad).err().unwrap();
            assert!(err.to_string().starts_with("--capture-dir "), "{err}");
        }
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let err = EvidenceFiles::open(settings(&file.join("sub")))
            .err()
            .unwrap();
        assert!(
            err.to_string().starts_with(&format!(
                "cannot create the directory {}/sub: ",
                file.display()
            )),
            "{err}"
        );
        let denied = io_error(
            dir.path(),
            "create a file in",
            Path::new("/var/lib/observer/evidence"),
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(
            denied.to_string(),
            "cannot create a file in /var/lib/observer/evidence: permission denied: \
             run the observer as root or give it a --capture-dir it can write"
        );
        let full = io_error(
            Path::new("/var/lib/observer/evidence"),
            "write",
            Path::new("/var/lib/observer/evidence/.observer-x.pcapng.partial"),
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(
            full.to_string().starts_with(
                "no space left on /var/lib/observer/evidence: free some or lower --capture-files"
            ),
            "{full}"
        );
    }

    #[test]
    fn names_carry_the_utc_time_and_a_sequence_number() {
        assert_eq!(
            utc_stamp(Duration::new(1_700_000_000, 999)),
            "20231114T221320Z"
        );
        assert_eq!(utc_stamp(Duration::ZERO), "19700101T000000Z");
        assert_eq!(utc_stamp(Duration::MAX), "99991231T235959Z");
        assert_eq!(
            completed_seq("observer-20231114T221320Z-000042.pcapng"),
            Some(42)
        );
        for other in [
            "observer-20231114T221320Z-.pcapng",
            "observer-20231114T221320Z-+1.pcapng",
            "observer-20231114T221320Z-99999999999999999999999.pcapng",
            "observer-20231114X221320Z-1.pcapng",
            "observer-20231114T221320Z1.pcapng",
        ] {
            assert_eq!(completed_seq(other), None, "{other}");
        }
        assert_eq!(
            partial_stamp(".observer-20231114T221320Z-Ab12Cd.pcapng.partial"),
            Some("20231114T221320Z")
        );
        assert_eq!(partial_stamp(".observer-x.pcapng.partial"), None);
    }

    #[test]
    fn options_longer_than_pcapng_holds_are_cut_at_a_character() {
        let long = "é".repeat(MAX_OPTION_BYTES);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_OPTION_BYTES && cut.len() > MAX_OPTION_BYTES - 2);
        assert_eq!(bounded("eth0".to_string()), "eth0");
    }
}
