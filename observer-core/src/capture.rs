//! Reading captures: pcap and pcapng files (the `pcap-file` crate) turned
//! into numbered Ethernet frames for the classifier.
//!
//! Pure: no kernel, no other module of the crate (the fuzz target in
//! `fuzz/` includes this file by path), and no panics on any input: every
//! problem of the file is a [`CaptureError`] naming the frame.

use std::{
    fmt,
    io::{self, Read},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use pcap_file::{
    PcapError, TsResolution,
    pcap::PcapReader,
    pcapng::{
        Block, PcapNgReader,
        blocks::{
            enhanced_packet::EnhancedPacketOption,
            interface_description::InterfaceDescriptionOption,
        },
    },
};

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// LINKTYPE_LINUX_SLL: Linux "cooked" v1 (`tcpdump -i any`, older libpcap).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// LINKTYPE_LINUX_SLL2: Linux "cooked" v2 (`tcpdump -i any`, libpcap >= 1.10).
pub const LINKTYPE_LINUX_SLL2: u32 = 276;
/// LINKTYPE_RAW: raw IPv4 or IPv6 (tunnel and `tun` devices).
pub const LINKTYPE_RAW: u32 = 101;
/// DLT_RAW as some systems write it into pcap files.
pub const LINKTYPE_RAW_12: u32 = 12;
/// DLT_RAW on OpenBSD.
pub const LINKTYPE_RAW_14: u32 = 14;
/// LINKTYPE_IPV4: raw IPv4 only.
pub const LINKTYPE_IPV4: u32 = 228;
/// LINKTYPE_IPV6: raw IPv6 only.
pub const LINKTYPE_IPV6: u32 = 229;
/// LINKTYPE_NULL: BSD and macOS loopback; a 4-byte address family in the
/// capturing host's byte order.
pub const LINKTYPE_NULL: u32 = 0;
/// LINKTYPE_LOOP: OpenBSD loopback; the family in network byte order.
pub const LINKTYPE_LOOP: u32 = 108;
/// LINKTYPE_NFLOG: Linux netfilter log (`tcpdump -i nflog:N`).
pub const LINKTYPE_NFLOG: u32 = 239;

/// Link types this module turns into Ethernet, for messages.
pub const SUPPORTED_LINK_TYPES: &str = "Ethernet (1), Linux cooked v1 (113) and v2 (276), \
     raw IP (12, 14, 101, 228, 229), BSD loopback (0, 108), NFLOG (239)";

/// `observer_common::parse::ETH_HLEN`, written out: the capture fuzz target
/// builds this file on its own, without the workspace's crates.
const ETH_HLEN: usize = 14;
const SLL_HLEN: usize = 16;
const SLL2_HLEN: usize = 20;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// The upper bits of a pcap link-type field carry FCS information
/// (libpcap's LT_LINKTYPE).
const LINKTYPE_MASK: u32 = 0x03ff_ffff;

const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// The longest original length a record may claim. The largest packet a
/// Linux capture shows is a BIG TCP super-packet of up to 512 KiB
/// (`GSO_MAX_SIZE` since 6.3) plus its headers; a record claiming more is
/// a damaged length field, and counting it would add gigabytes of
/// "truncated" bytes that were never sent.
pub const MAX_ORIGINAL_LEN: u32 = 1 << 20;

/// One captured frame, normalised to Ethernet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Position in the file, from 1, as tcpdump and Wireshark number frames.
    pub number: u64,
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// The frame with an Ethernet header: as captured for Ethernet
    /// captures; for cooked and raw-IP captures the link header is replaced
    /// by a synthetic one (zero MACs, the frame's EtherType).
    pub data: Vec<u8>,
    /// The capture's link type for this frame.
    pub link_type: u32,
    /// Bytes captured, on the capture's own link.
    pub captured_len: u32,
    /// Length on the wire, on the capture's own link.
    pub original_len: u32,
    /// The first comment (`opt_comment`) of a pcapng enhanced packet
    /// block, where the observer's evidence files say why it kept the
    /// frame; `None` for pcap records and other blocks.
    pub comment: Option<String>,
}

impl Frame {
    /// Whether the snap length cut the frame (fewer bytes captured than sent).
    pub fn truncated(&self) -> bool {
        self.captured_len < self.original_len
    }
}

/// Why a capture cannot be read (further).
#[derive(Debug)]
pub enum CaptureError {
    /// The file is not a pcap or pcapng capture at all.
    NotACapture(String),
    /// A link type with no Ethernet equivalent here; `frame` is `None` when
    /// the file header says so.
    UnsupportedLinkType {
        /// The link type.
        link_type: u32,
        /// The first frame on it (pcapng), or `None` (pcap file header).
        frame: Option<u64>,
    },
    /// The file is damaged at (or just before) frame `frame`.
    Damaged {
        /// Number the frame would have.
        frame: u64,
        /// What is wrong.
        reason: String,
    },
}

impl CaptureError {
    /// True when frames before the error were read: the file is damaged,
    /// not unusable.
    pub fn is_damage(&self) -> bool {
        matches!(self, CaptureError::Damaged { .. })
    }
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::NotACapture(why) => write!(
                f,
                "not a pcap or pcapng capture ({why}); record one with `tcpdump -i IFACE -w FILE`"
            ),
            CaptureError::UnsupportedLinkType { link_type, frame } => {
                if let Some(frame) = frame {
                    write!(f, "frame {frame}: ")?;
                }
                write!(
                    f,
                    "link type {link_type} is not supported (supported: {SUPPORTED_LINK_TYPES}); \
                     capture on the underlay interface itself (`tcpdump -i eth0`)"
                )
            }
            CaptureError::Damaged { frame, reason } => write!(f, "frame {frame}: {reason}"),
        }
    }
}

impl std::error::Error for CaptureError {}

/// A pcapng interface: its link type and timestamp units per second.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link_type: u32,
    resolution: Resolution,
}

/// Units of a pcapng timestamp (`if_tsresol`): 10^-n or 2^-n seconds.
#[derive(Debug, Clone, Copy)]
enum Resolution {
    Decimal(u8),
    Binary(u8),
}

impl Resolution {
    fn from_option(value: u8) -> Resolution {
        if value & 0x80 == 0 {
            Resolution::Decimal(value)
        } else {
            Resolution::Binary(value & 0x7f)
        }
    }

    /// `units` of this resolution as a duration (saturating: a damaged
    /// timestamp must not stop the replay).
    fn duration(self, units: u64) -> Duration {
        let nanos: u128 = match self {
            Resolution::Decimal(n) if n <= 9 => {
                u128::from(units).saturating_mul(10u128.pow(9 - u32::from(n)))
            }
            Resolution::Decimal(n) => 10u128
                .checked_pow(u32::from(n) - 9)
                .map_or(0, |div| u128::from(units) / div),
            Resolution::Binary(n) => (u128::from(units) * 1_000_000_000) >> n.min(127),
        };
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos)
    }
}

/// The pcapng default: microseconds.
const PCAPNG_DEFAULT_RESOLUTION: Resolution = Resolution::Decimal(6);

type Input<R> = io::Chain<io::Cursor<[u8; 4]>, R>;

enum Reader<R: Read> {
    Pcap {
        reader: PcapReader<Input<R>>,
        link_type: u32,
        nanos: bool,
    },
    PcapNg {
        reader: PcapNgReader<Input<R>>,
        interfaces: Vec<Interface>,
    },
}

/// The frames of one capture, in file order. Stops after the first error.
pub struct Frames<R: Read> {
    reader: Reader<R>,
    /// Packets read so far.
    count: u64,
    /// Time of the latest packet (a pcapng simple packet has none: it gets this).
    last_timestamp: Duration,
    done: bool,
}

/// Opens a capture: detects pcap or pcapng by its magic number and reads
/// its header. Fails with [`CaptureError::NotACapture`] for anything else,
/// and with [`CaptureError::UnsupportedLinkType`] for a pcap file whose
/// link type has no Ethernet equivalent here.
pub fn frames<R: Read>(mut input: R) -> Result<Frames<R>, CaptureError> {
    let mut magic = [0u8; 4];
    if let Err(e) = input.read_exact(&mut magic) {
        return Err(CaptureError::NotACapture(match e.kind() {
            io::ErrorKind::UnexpectedEof => "shorter than a capture header".to_string(),
            _ => format!("cannot read: {e}"),
        }));
    }
    let chained = io::Cursor::new(magic).chain(input);
    let reader = if PCAP_MAGICS.contains(&magic) {
        let reader = PcapReader::new(chained).map_err(|e| header_error("pcap", e))?;
        let header = reader.header();
        let link_type = u32::from(header.datalink) & LINKTYPE_MASK;
        if !supported(link_type) {
            return Err(CaptureError::UnsupportedLinkType {
                link_type,
                frame: None,
            });
        }
        Reader::Pcap {
            reader,
            link_type,
            nanos: header.ts_resolution == TsResolution::NanoSecond,
        }
    } else if magic == PCAPNG_MAGIC {
        let reader = PcapNgReader::new(chained).map_err(|e| header_error("pcapng", e))?;
        Reader::PcapNg {
            reader,
            interfaces: Vec::new(),
        }
    } else {
        return Err(CaptureError::NotACapture(format!(
            "unknown magic number {:02x}{:02x}{:02x}{:02x}",
            magic[0], magic[1], magic[2], magic[3]
        )));
    };
    Ok(Frames {
        reader,
        count: 0,
        last_timestamp: Duration::ZERO,
        done: false,
    })
}

fn header_error(format: &str, e: PcapError) -> CaptureError {
    CaptureError::NotACapture(match e {
        PcapError::IoError(io) if io.kind() == io::ErrorKind::UnexpectedEof => {
            format!("{format} file header truncated")
        }
        e => format!("{format} file header: {}", describe(&e)),
    })
}

/// The text of a reader error. The reader turns "this record goes past the
/// end of the data" into UnexpectedEof: for a file that is a truncated
/// record, or a length field that points past the end.
fn describe(e: &PcapError) -> String {
    match e {
        PcapError::IoError(io) if io.kind() == io::ErrorKind::UnexpectedEof => {
            "record truncated (the file ends inside it, or its length field is damaged)".to_string()
        }
        PcapError::IoError(io) => format!("read error: {io}"),
        PcapError::InvalidField(what) => format!("invalid field: {what}"),
        e => e.to_string(),
    }
}

fn supported(link_type: u32) -> bool {
    matches!(
        link_type,
        LINKTYPE_ETHERNET
            | LINKTYPE_LINUX_SLL
            | LINKTYPE_LINUX_SLL2
            | LINKTYPE_RAW
            | LINKTYPE_RAW_12
            | LINKTYPE_RAW_14
            | LINKTYPE_IPV4
            | LINKTYPE_IPV6
            | LINKTYPE_NULL
            | LINKTYPE_LOOP
            | LINKTYPE_NFLOG
    )
}

impl<R: Read> Frames<R> {
    /// `pcap` or `pcapng`.
    pub fn format(&self) -> &'static str {
        match self.reader {
            Reader::Pcap { .. } => "pcap",
            Reader::PcapNg { .. } => "pcapng",
        }
    }

    fn damaged(&mut self, e: &PcapError) -> CaptureError {
        CaptureError::Damaged {
            frame: self.count + 1,
            reason: describe(e),
        }
    }

    /// A packet record: numbered and normalised.
    fn frame(
        &mut self,
        link_type: u32,
        timestamp: Duration,
        data: Vec<u8>,
        original_len: u32,
        comment: Option<String>,
    ) -> Result<Frame, CaptureError> {
        self.count += 1;
        if !supported(link_type) {
            return Err(CaptureError::UnsupportedLinkType {
                link_type,
                frame: Some(self.count),
            });
        }
        let captured_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if let Some(reason) = implausible_lengths(captured_len, original_len) {
            return Err(CaptureError::Damaged {
                frame: self.count,
                reason,
            });
        }
        self.last_timestamp = timestamp;
        Ok(Frame {
            number: self.count,
            timestamp,
            data: to_ethernet(link_type, data),
            link_type,
            captured_len,
            original_len,
            comment,
        })
    }

    fn next_pcap(&mut self) -> Option<Result<Frame, CaptureError>> {
        let Reader::Pcap {
            reader,
            link_type,
            nanos,
        } = &mut self.reader
        else {
            return None;
        };
        let (link_type, nanos) = (*link_type, *nanos);
        let packet = match reader.next_raw_packet()? {
            Ok(p) => p,
            Err(e) => return Some(Err(self.damaged(&e))),
        };
        // libpcap writes the fraction below one second; more means the
        // record header is not where the file says (damaged or shifted).
        let frac_limit = if nanos { 1_000_000_000 } else { 1_000_000 };
        if packet.ts_frac >= frac_limit {
            self.count += 1;
            return Some(Err(CaptureError::Damaged {
                frame: self.count,
                reason: format!(
                    "record header damaged: its timestamp's {} field is {} (at most {})",
                    if nanos { "nanoseconds" } else { "microseconds" },
                    packet.ts_frac,
                    frac_limit - 1
                ),
            }));
        }
        let frac = u64::from(packet.ts_frac) * if nanos { 1 } else { 1000 };
        let timestamp = Duration::from_secs(u64::from(packet.ts_sec)) + Duration::from_nanos(frac);
        let original_len = packet.orig_len;
        let data = packet.data.into_owned();
        Some(self.frame(link_type, timestamp, data, original_len, None))
    }

    fn next_pcapng(&mut self) -> Option<Result<Frame, CaptureError>> {
        loop {
            let Reader::PcapNg { reader, interfaces } = &mut self.reader else {
                return None;
            };
            let block = match reader.next_block()? {
                Ok(b) => b,
                Err(e) => return Some(Err(self.damaged(&e))),
            };
            // pcap-file reads timestamps as nanoseconds; they are in the
            // interface's units (microseconds unless if_tsresol says).
            let (interface, timestamp, data, original_len, comment) = match block {
                Block::SectionHeader(_) => {
                    // A new section starts its own interface list.
                    interfaces.clear();
                    continue;
                }
                Block::InterfaceDescription(idb) => {
                    let resolution = idb
                        .options
                        .iter()
                        .find_map(|o| match o {
                            InterfaceDescriptionOption::IfTsResol(v) => {
                                Some(Resolution::from_option(*v))
                            }
                            _ => None,
                        })
                        .unwrap_or(PCAPNG_DEFAULT_RESOLUTION);
                    interfaces.push(Interface {
                        link_type: u32::from(idb.linktype) & LINKTYPE_MASK,
                        resolution,
                    });
                    continue;
                }
                Block::EnhancedPacket(epb) => (
                    epb.interface_id,
                    Some(u64::try_from(epb.timestamp.as_nanos()).unwrap_or(u64::MAX)),
                    epb.data.into_owned(),
                    epb.original_len,
                    epb.options.into_iter().find_map(|o| match o {
                        EnhancedPacketOption::Comment(c) => Some(c.into_owned()),
                        _ => None,
                    }),
                ),
                Block::Packet(pb) => (
                    u32::from(pb.interface_id),
                    Some(pb.timestamp),
                    pb.data.into_owned(),
                    pb.original_len,
                    None,
                ),
                // A simple packet has no time and no captured length: its
                // data runs to the end of the block, padding included.
                Block::SimplePacket(spb) => {
                    let mut data = spb.data.into_owned();
                    data.truncate(spb.original_len as usize);
                    (0, None, data, spb.original_len, None)
                }
                _ => continue,
            };
            let Some(iface) = interfaces.get(interface as usize).copied() else {
                self.count += 1;
                return Some(Err(CaptureError::Damaged {
                    frame: self.count,
                    reason: format!(
                        "packet of interface {interface}, which no interface description block declares"
                    ),
                }));
            };
            let timestamp = timestamp.map_or(self.last_timestamp, |units| {
                iface.resolution.duration(units)
            });
            return Some(self.frame(iface.link_type, timestamp, data, original_len, comment));
        }
    }
}

impl<R: Read> Iterator for Frames<R> {
    type Item = Result<Frame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = match self.reader {
            Reader::Pcap { .. } => self.next_pcap(),
            Reader::PcapNg { .. } => self.next_pcapng(),
        };
        // After an error the reader's position is unknown: stop there.
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

/// Why a record's two length fields cannot both be right, if they cannot:
/// fewer bytes on the wire than captured, or more than any packet has.
fn implausible_lengths(captured_len: u32, original_len: u32) -> Option<String> {
    if original_len > MAX_ORIGINAL_LEN {
        Some(format!(
            "record's length field damaged: it claims {original_len} bytes on the wire \
             (no packet is longer than {MAX_ORIGINAL_LEN})"
        ))
    } else if original_len < captured_len {
        Some(format!(
            "record's length field damaged: {captured_len} bytes captured of a packet \
             of {original_len}"
        ))
    } else {
        None
    }
}

/// A synthetic Ethernet header (zero MACs) for `ethertype`, then `payload`.
fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(ETH_HLEN + payload.len());
    frame.extend_from_slice(&[0; 12]);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The EtherType of a raw IP packet, from its version nibble. Anything
/// that is not version 6 is handed over as IPv4, so the classifier calls
/// it what it is (malformed or truncated IP), not "not IP".
fn raw_ip_ethertype(packet: &[u8]) -> u16 {
    match packet.first().map(|b| b >> 4) {
        Some(6) => ETH_P_IPV6,
        _ => ETH_P_IP,
    }
}

/// `data` of link type `link_type` as an Ethernet frame. A cooked frame
/// shorter than its own header becomes an empty frame: the classifier's
/// "shorter than an Ethernet header" (truncated_l2).
pub fn to_ethernet(link_type: u32, data: Vec<u8>) -> Vec<u8> {
    match link_type {
        LINKTYPE_LINUX_SLL if data.len() >= SLL_HLEN => {
            ethernet(u16::from_be_bytes([data[14], data[15]]), &data[SLL_HLEN..])
        }
        LINKTYPE_LINUX_SLL2 if data.len() >= SLL2_HLEN => {
            ethernet(u16::from_be_bytes([data[0], data[1]]), &data[SLL2_HLEN..])
        }
        LINKTYPE_LINUX_SLL | LINKTYPE_LINUX_SLL2 => Vec::new(),
        LINKTYPE_RAW | LINKTYPE_RAW_12 | LINKTYPE_RAW_14 => {
            ethernet(raw_ip_ethertype(&data), &data)
        }
        LINKTYPE_IPV4 => ethernet(ETH_P_IP, &data),
        LINKTYPE_IPV6 => ethernet(ETH_P_IPV6, &data),
        LINKTYPE_NULL | LINKTYPE_LOOP if data.len() >= LOOPBACK_HLEN => {
            let packet = &data[LOOPBACK_HLEN..];
            ethernet(loopback_ethertype(&data, packet), packet)
        }
        LINKTYPE_NULL | LINKTYPE_LOOP => Vec::new(),
        LINKTYPE_NFLOG => match nflog_payload(&data) {
            Some(packet) => ethernet(raw_ip_ethertype(packet), packet),
            None => Vec::new(),
        },
        _ => data,
    }
}

/// Length of the NULL and LOOP link headers: the address family.
const LOOPBACK_HLEN: usize = 4;

/// The EtherType of a loopback packet from its 4-byte address family.
/// NULL writes it in the capturing host's byte order, which the file does
/// not say, and IPv6's number differs between systems (Linux 10, NetBSD
/// and OpenBSD 24, FreeBSD 28, macOS 30): both byte orders are tried, and
/// an unknown family falls back to the packet's version nibble.
fn loopback_ethertype(header: &[u8], packet: &[u8]) -> u16 {
    let bytes: [u8; 4] = [header[0], header[1], header[2], header[3]];
    for family in [u32::from_le_bytes(bytes), u32::from_be_bytes(bytes)] {
        match family {
            2 => return ETH_P_IP,
            10 | 24 | 28 | 30 => return ETH_P_IPV6,
            _ => {}
        }
    }
    raw_ip_ethertype(packet)
}

/// NFLOG's type-length-value attribute that carries the logged packet.
const NFULA_PAYLOAD: u16 = 9;

/// The IP packet of an NFLOG record: a 4-byte header (family, version,
/// resource id), then attributes of a 4-byte header (length including
/// it, type; in the capturing host's byte order) padded to 4 bytes. The
/// byte order is the one that gives a known attribute type (the kernel's
/// are below 32). A payload cut by the snap length is returned as far as
/// it was captured. `None` when the record has no payload attribute.
fn nflog_payload(record: &[u8]) -> Option<&[u8]> {
    let mut at = 4;
    while let Some(header) = record.get(at..at + 4) {
        let le_kind = u16::from_le_bytes([header[2], header[3]]) & 0x7fff;
        let (len, kind) = if le_kind < 32 {
            (u16::from_le_bytes([header[0], header[1]]), le_kind)
        } else {
            (
                u16::from_be_bytes([header[0], header[1]]),
                u16::from_be_bytes([header[2], header[3]]) & 0x7fff,
            )
        };
        let len = usize::from(len);
        if len < 4 {
            return None;
        }
        if kind == NFULA_PAYLOAD {
            return Some(&record[at + 4..record.len().min(at + len)]);
        }
        at += len.div_ceil(4) * 4;
    }
    None
}

/// The outer source address of an Ethernet frame (up to two VLAN tags, like
/// the classifier), or `None` when it carries no complete outer IP source.
/// Only decides which program a replayed frame goes through (sent by a
/// `--local` address or not); classifying is the parser's job.
pub fn outer_source(frame: &[u8]) -> Option<IpAddr> {
    let mut offset = 12;
    let mut ethertype = u16::from_be_bytes(frame.get(offset..offset + 2)?.try_into().ok()?);
    for _ in 0..2 {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        offset += 4;
        ethertype = u16::from_be_bytes(frame.get(offset..offset + 2)?.try_into().ok()?);
    }
    let ip = offset + 2;
    match ethertype {
        ETH_P_IP => {
            let src: [u8; 4] = frame.get(ip + 12..ip + 16)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(src)))
        }
        ETH_P_IPV6 => {
            let src: [u8; 16] = frame.get(ip + 8..ip + 24)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(src)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian microsecond pcap header and records.
    fn pcap(link_type: u32, records: &[(&[u8], u32)]) -> Vec<u8> {
        let mut file = Vec::new();
        file.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        file.extend_from_slice(&2u16.to_le_bytes());
        file.extend_from_slice(&4u16.to_le_bytes());
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&65535u32.to_le_bytes());
        file.extend_from_slice(&link_type.to_le_bytes());
        for (i, (data, orig)) in records.iter().enumerate() {
            file.extend_from_slice(&(1000 + i as u32).to_le_bytes());
            file.extend_from_slice(&500u32.to_le_bytes());
            file.extend_from_slice(&(data.len() as u32).to_le_bytes());
            file.extend_from_slice(&orig.to_le_bytes());
            file.extend_from_slice(data);
        }
        file
    }

    fn ipv4_header(src: [u8; 4]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0];
        h.extend_from_slice(&src);
        h.extend_from_slice(&[198, 18, 0, 1]);
        h
    }

    fn all(file: &[u8]) -> Vec<Result<Frame, CaptureError>> {
        frames(file).unwrap().collect()
    }

    #[test]
    fn reads_ethernet_pcap_frames_with_numbers_and_times() {
        let frame = ethernet(ETH_P_IP, &ipv4_header([198, 18, 0, 2]));
        let file = pcap(1, &[(&frame, frame.len() as u32), (&frame[..20], 100)]);
        let frames: Vec<Frame> = all(&file).into_iter().map(Result::unwrap).collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].number, 1);
        assert_eq!(frames[0].data, frame);
        assert_eq!(frames[0].timestamp, Duration::new(1000, 500_000));
        assert!(!frames[0].truncated());
        assert!(frames[1].truncated());
        assert_eq!(frames[1].number, 2);
    }

    #[test]
    fn loopback_frames_name_their_family_in_either_byte_order() {
        let v4 = ipv4_header([198, 18, 0, 2]);
        let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        v6.extend_from_slice(&[0; 32]);
        let with = |family: [u8; 4], packet: &[u8]| [&family[..], packet].concat();
        // NULL from a little-endian host, AF_INET.
        assert_eq!(
            to_ethernet(LINKTYPE_NULL, with(2u32.to_le_bytes(), &v4)),
            ethernet(ETH_P_IP, &v4)
        );
        // NULL from a big-endian host, macOS's AF_INET6 (30).
        assert_eq!(
            to_ethernet(LINKTYPE_NULL, with(30u32.to_be_bytes(), &v6)),
            ethernet(ETH_P_IPV6, &v6)
        );
        // LOOP (network order), OpenBSD's AF_INET6 (24).
        assert_eq!(
            to_ethernet(LINKTYPE_LOOP, with(24u32.to_be_bytes(), &v6)),
            ethernet(ETH_P_IPV6, &v6)
        );
        // An unknown family: the version nibble decides.
        assert_eq!(
            to_ethernet(LINKTYPE_NULL, with(99u32.to_le_bytes(), &v6)),
            ethernet(ETH_P_IPV6, &v6)
        );
        // Shorter than the family: truncated_l2.
        assert_eq!(to_ethernet(LINKTYPE_LOOP, vec![0, 0, 0]), Vec::<u8>::new());
    }

    /// An NFLOG record as the kernel writes it on a little-endian host:
    /// header, a prefix attribute padded to 4 bytes, the payload.
    fn nflog(family: u8, packet: &[u8]) -> Vec<u8> {
        let mut record = vec![family, 0, 0, 5];
        let prefix = b"cali-drop\0";
        record.extend_from_slice(&(4 + prefix.len() as u16).to_le_bytes());
        record.extend_from_slice(&10u16.to_le_bytes()); // NFULA_PREFIX
        record.extend_from_slice(prefix);
        record.resize(record.len().div_ceil(4) * 4, 0);
        record.extend_from_slice(&(4 + packet.len() as u16).to_le_bytes());
        record.extend_from_slice(&NFULA_PAYLOAD.to_le_bytes());
        record.extend_from_slice(packet);
        record
    }

    #[test]
    fn nflog_records_give_their_payload() {
        let v4 = ipv4_header([198, 18, 0, 2]);
        let record = nflog(2, &v4);
        let file = pcap(LINKTYPE_NFLOG, &[(&record, record.len() as u32)]);
        let frames: Vec<Frame> = all(&file).into_iter().map(Result::unwrap).collect();
        assert_eq!(frames[0].data, ethernet(ETH_P_IP, &v4));
        assert_eq!(frames[0].captured_len as usize, record.len());
        // Big-endian attribute headers are read too.
        let mut big = vec![2, 0, 0, 5];
        big.extend_from_slice(&(4 + v4.len() as u16).to_be_bytes());
        big.extend_from_slice(&NFULA_PAYLOAD.to_be_bytes());
        big.extend_from_slice(&v4);
        assert_eq!(to_ethernet(LINKTYPE_NFLOG, big), ethernet(ETH_P_IP, &v4));
        // A payload cut by the snap length: what was captured.
        assert_eq!(
            to_ethernet(LINKTYPE_NFLOG, record[..record.len() - 3].to_vec()),
            ethernet(ETH_P_IP, &v4[..v4.len() - 3])
        );
        // No payload attribute, or a damaged length: truncated_l2.
        let no_payload = nflog(2, &[])[..16].to_vec();
        assert_eq!(to_ethernet(LINKTYPE_NFLOG, no_payload), Vec::<u8>::new());
        assert_eq!(
            to_ethernet(LINKTYPE_NFLOG, vec![2, 0, 0, 5, 1, 0, 9, 0]),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn cooked_and_raw_frames_get_an_ethernet_header() {
        let ip = ipv4_header([198, 18, 0, 2]);
        let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0xb, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&ip);
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0xb, 0, 0,
        ];
        sll2.extend_from_slice(&ip);
        let want = ethernet(ETH_P_IP, &ip);
        assert_eq!(to_ethernet(LINKTYPE_LINUX_SLL, sll.clone()), want);
        assert_eq!(to_ethernet(LINKTYPE_LINUX_SLL2, sll2), want);
        assert_eq!(to_ethernet(LINKTYPE_RAW, ip.clone()), want);
        assert_eq!(to_ethernet(LINKTYPE_IPV4, ip), want);
        assert_eq!(
            to_ethernet(LINKTYPE_LINUX_SLL, sll[..10].to_vec()),
            Vec::<u8>::new()
        );
        let v6 = [0x60u8; 40];
        assert_eq!(
            &to_ethernet(LINKTYPE_RAW_14, v6.to_vec())[12..14],
            &[0x86, 0xdd]
        );
    }

    #[test]
    fn outer_source_skips_vlan_tags() {
        let ip = ipv4_header([198, 18, 0, 9]);
        let mut tagged = vec![0; 12];
        tagged.extend_from_slice(&[0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2, 0x08, 0x00]);
        tagged.extend_from_slice(&ip);
        assert_eq!(outer_source(&tagged), Some("198.18.0.9".parse().unwrap()));
        assert_eq!(outer_source(&tagged[..30]), None);
        assert_eq!(outer_source(&[]), None);
    }

    #[test]
    fn damage_names_the_frame() {
        let frame = ethernet(ETH_P_IP, &ipv4_header([198, 18, 0, 2]));
        let file = pcap(1, &[(&frame, 34), (&frame, 34)]);
        let cut = &file[..file.len() - 5];
        let got = all(cut);
        assert!(got[0].is_ok());
        let err = got[1].as_ref().unwrap_err();
        assert!(err.is_damage());
        assert!(
            err.to_string().starts_with("frame 2: record truncated"),
            "{err}"
        );
        assert_eq!(got.len(), 2, "nothing after the error");
    }

    #[test]
    fn implausible_lengths_and_times_are_damage() {
        let frame = ethernet(ETH_P_IP, &ipv4_header([198, 18, 0, 2]));
        // A 4 GB claim, and fewer bytes on the wire than captured.
        for (orig, says) in [
            (4_093_509_154u32, "claims 4093509154"),
            (20, "34 bytes captured"),
        ] {
            let got = all(&pcap(1, &[(&frame, 34), (&frame, orig), (&frame, 34)]));
            assert!(got[0].is_ok());
            let err = got[1].as_ref().unwrap_err();
            assert!(err.is_damage(), "{err}");
            assert!(
                err.to_string()
                    .starts_with("frame 2: record's length field damaged"),
                "{err}"
            );
            assert!(err.to_string().contains(says), "{err}");
            assert_eq!(got.len(), 2, "nothing after the error");
        }
        // The largest plausible claim is a frame.
        assert!(all(&pcap(1, &[(&frame, MAX_ORIGINAL_LEN)]))[0].is_ok());
        // Microseconds of a second or more.
        let mut file = pcap(1, &[(&frame, 34), (&frame, 34)]);
        let second_ts_frac = 24 + 16 + frame.len() + 4;
        file[second_ts_frac..second_ts_frac + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
        let got = all(&file);
        assert!(got[0].is_ok());
        let err = got[1].as_ref().unwrap_err();
        assert!(err.is_damage());
        assert!(
            err.to_string().starts_with(
                "frame 2: record header damaged: its timestamp's microseconds field is 1000000"
            ),
            "{err}"
        );
    }

    #[test]
    fn not_a_capture_and_unsupported_link_types_are_refused() {
        let err = frames(&b"hello world, not a capture"[..]).err().unwrap();
        assert!(
            err.to_string().contains("unknown magic number 68656c6c"),
            "{err}"
        );
        let err = frames(&b"\xd4\xc3"[..]).err().unwrap();
        assert!(
            err.to_string().contains("shorter than a capture header"),
            "{err}"
        );
        let err = frames(&pcap(1, &[])[..10]).err().unwrap();
        assert!(
            err.to_string().contains("pcap file header truncated"),
            "{err}"
        );
        let err = frames(&pcap(105, &[])[..]).err().unwrap();
        assert!(
            err.to_string()
                .starts_with("link type 105 is not supported"),
            "{err}"
        );
        assert!(!err.is_damage());
    }

    #[test]
    fn pcapng_packets_carry_their_first_comment() {
        use pcap_file::{
            DataLink,
            pcapng::{
                PcapNgWriter,
                blocks::{
                    enhanced_packet::EnhancedPacketBlock,
                    interface_description::InterfaceDescriptionBlock,
                },
            },
        };
        use std::borrow::Cow;
        let frame = ethernet(ETH_P_IP, &ipv4_header([198, 18, 0, 2]));
        let mut writer = PcapNgWriter::new(Vec::new()).unwrap();
        writer
            .write_pcapng_block(InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 256,
                options: vec![InterfaceDescriptionOption::IfTsResol(9)],
            })
            .unwrap();
        let packet = |options| EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::new(1_700_000_000, 7),
            original_len: frame.len() as u32,
            data: Cow::Borrowed(&frame[..]),
            options,
        };
        writer
            .write_pcapng_block(packet(vec![
                EnhancedPacketOption::Flags(1),
                EnhancedPacketOption::Comment(Cow::Borrowed("first")),
                EnhancedPacketOption::Comment(Cow::Borrowed("second")),
            ]))
            .unwrap();
        writer.write_pcapng_block(packet(vec![])).unwrap();
        let file = writer.into_inner();
        let frames: Vec<Frame> = all(&file).into_iter().map(Result::unwrap).collect();
        assert_eq!(frames[0].comment.as_deref(), Some("first"));
        assert_eq!(frames[0].timestamp, Duration::new(1_700_000_000, 7));
        assert_eq!(frames[1].comment, None);
        // pcap records have none.
        let file = pcap(1, &[(&frame, frame.len() as u32)]);
        assert_eq!(all(&file)[0].as_ref().unwrap().comment, None);
    }

    #[test]
    fn pcapng_timestamps_follow_the_interface_resolution() {
        assert_eq!(
            Resolution::Decimal(6).duration(1_500_000),
            Duration::from_millis(1500)
        );
        assert_eq!(Resolution::Decimal(9).duration(7), Duration::from_nanos(7));
        assert_eq!(
            Resolution::Binary(1).duration(3),
            Duration::from_millis(1500)
        );
        assert_eq!(Resolution::Decimal(200).duration(u64::MAX), Duration::ZERO);
    }
}
