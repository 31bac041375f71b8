//! Evidence (`--capture-dir`): one frame the observer flagged or saw
//! dropped, with the bytes the kernel kept of it ([`Evidence`]); the
//! comment it carries in its pcapng file ([`Tag`]: written by
//! [`Evidence::comment`], read back by [`Tag::parse`] for `observer
//! replay`); [`EvidenceTally`], the bounded counts replay prints; and
//! [`EvidenceCounts`], what a run did with the records it read.
//! `report::evidence` writes the files. Pure: no I/O.
//!
//! The comment is one line of `key=value` fields after the word
//! `observer`, in this order (docs/evidence.md documents it for users):
//!
//! ```text
//! observer origin=classifier reason=calico_allow_set,bad_outer_checksum stage=underlay direction=rx peer=10.0.0.2 interface=eth0
//! observer origin=kernel reason=NETFILTER_DROP stage=tunnel direction=rx peer=- interface=vxlan.calico location=nf_hook_slow
//! ```
//!
//! `peer=-` when no peer is known, `reason=-` when no reason is; `location`
//! only when the kernel named the function that freed the packet. A
//! value's `%`, `,`, `=`, whitespace and control characters are written
//! `%XX` (their UTF-8 bytes), and a value that is exactly `-` is written
//! `%2D`, so fields split on spaces, reasons on commas, and every value
//! reads back as it was. Keys a reader does not know are skipped, so
//! fields can be added without breaking older readers.

use std::{collections::BTreeMap, fmt, net::IpAddr, time::Duration};

use observer_common::Direction;

use super::rows::{Stage, direction_name};

/// Where the frame was judged: flagged by the classifier (the packet
/// itself passed) or freed by the kernel; the rows' own type.
pub use super::rows::Origin;

/// The first word of every comment the observer writes.
pub const COMMENT_PREFIX: &str = "observer";

/// Distinct (peer, stage, direction, origin, reason) keys an
/// [`EvidenceTally`] keeps; the rest are counted in its overflow. A
/// file's frames come from a bounded number of peers and reasons, but
/// replay reads files users give: a crafted one must not grow memory.
pub const TALLY_MAX_KEYS: usize = 4_096;

/// What became of the evidence records a run read, for its stats and
/// export (the programs' own part — sent, lost to a full ring, rate
/// limited — is in `rows::KernelStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvidenceCounts {
    /// Frames written to the files.
    pub written: u64,
    /// Frames skipped: the filesystem had less than the floor free.
    pub skipped_low_space: u64,
    /// Frames not written for an I/O error.
    pub failed: u64,
    /// Kernel drops the drop rows leave out (the packet reached its
    /// host's socket layer after decapsulation), not written.
    pub not_drops: u64,
    /// Files completed.
    pub files_completed: u64,
    /// Completed files removed by rotation.
    pub files_removed: u64,
}

/// One frame the observer flagged or saw dropped, as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// When the kernel saw it, since the Unix epoch.
    pub timestamp: Duration,
    /// The interface's index.
    pub ifindex: u32,
    /// Interface name (or `if<N>` when unknown).
    pub interface: String,
    /// Received or sent on that interface.
    pub direction: Direction,
    /// Underlay, tunnel or pod.
    pub stage: Stage,
    /// Flagged by the classifier (the packet still passes) or freed by
    /// the kernel.
    pub origin: Origin,
    /// The tunnel peer (node) the frame is attributed to, when known.
    pub peer: Option<IpAddr>,
    /// Reason names: classifier reasons (`ClassifierDrop::name`), or one
    /// kernel drop reason name.
    pub reasons: Vec<String>,
    /// Kernel drops: the function that freed it (e.g. `nf_hook_slow`),
    /// when named.
    pub location: Option<String>,
    /// The frame's length on the wire (may exceed `data.len()`).
    pub wire_len: u32,
    /// The captured bytes (at most the snap length), from the Ethernet
    /// header on: one link type serves every frame of a file, as libpcap
    /// requires. A packet freed after decapsulation has none of its own and
    /// carries a synthetic one (zero MACs, its IP version's EtherType).
    pub data: Vec<u8>,
}

impl Evidence {
    /// What the frame's comment says.
    pub fn tag(&self) -> Tag {
        Tag {
            origin: self.origin,
            reasons: self.reasons.clone(),
            stage: self.stage,
            direction: self.direction,
            peer: self.peer,
            interface: self.interface.clone(),
            location: self.location.clone(),
        }
    }

    /// The pcapng packet comment (Wireshark's `frame.comment`): see the
    /// module documentation for the format.
    pub fn comment(&self) -> String {
        self.tag().to_string()
    }
}

/// What an observer comment says about its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// Classifier or kernel.
    pub origin: Origin,
    /// Reason names, in the order written.
    pub reasons: Vec<String>,
    /// Underlay, tunnel or pod.
    pub stage: Stage,
    /// Received or sent.
    pub direction: Direction,
    /// The tunnel peer, when known.
    pub peer: Option<IpAddr>,
    /// The interface's name.
    pub interface: String,
    /// Kernel drops: the function that freed the packet, when named.
    pub location: Option<String>,
}

impl Tag {
    /// The tag of `comment`, or `None` when the observer did not write it
    /// (another first word, a field missing or unreadable). Never panics:
    /// replay reads comments from files users give.
    pub fn parse(comment: &str) -> Option<Tag> {
        let mut words = comment.split_ascii_whitespace();
        if words.next()? != COMMENT_PREFIX {
            return None;
        }
        let (mut origin, mut reasons, mut stage, mut direction) = (None, None, None, None);
        let (mut peer, mut interface, mut location) = (None, None, None);
        for word in words {
            let (key, value) = word.split_once('=')?;
            match key {
                "origin" => origin = Some(origin_named(value)?),
                "reason" => reasons = Some(parse_list(value)?),
                "stage" => stage = Some(stage_named(value)?),
                "direction" => direction = Some(direction_named(value)?),
                "peer" => {
                    peer = Some(match value {
                        "-" => None,
                        addr => Some(addr.parse().ok()?),
                    })
                }
                "interface" => interface = Some(decode(value)?),
                "location" => location = Some(decode(value)?),
                // A field a later observer added.
                _ => {}
            }
        }
        Some(Tag {
            origin: origin?,
            reasons: reasons?,
            stage: stage?,
            direction: direction?,
            peer: peer?,
            interface: interface?,
            location,
        })
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{COMMENT_PREFIX} origin={} reason=", self.origin.name())?;
        if self.reasons.is_empty() {
            f.write_str("-")?;
        }
        for (i, reason) in self.reasons.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            encode(f, reason)?;
        }
        write!(
            f,
            " stage={} direction={} peer=",
            self.stage.name(),
            direction_name(self.direction)
        )?;
        match self.peer {
            Some(peer) => write!(f, "{peer}")?,
            None => f.write_str("-")?,
        }
        f.write_str(" interface=")?;
        encode(f, &self.interface)?;
        if let Some(location) = &self.location {
            f.write_str(" location=")?;
            encode(f, location)?;
        }
        Ok(())
    }
}

fn origin_named(name: &str) -> Option<Origin> {
    [Origin::Classifier, Origin::Kernel]
        .into_iter()
        .find(|o| o.name() == name)
}

fn stage_named(name: &str) -> Option<Stage> {
    [Stage::Underlay, Stage::Tunnel, Stage::Pod]
        .into_iter()
        .find(|s| s.name() == name)
}

fn direction_named(name: &str) -> Option<Direction> {
    [Direction::Rx, Direction::Tx]
        .into_iter()
        .find(|d| direction_name(*d) == name)
}

/// Whether `c` is written `%XX` in a value: what separates fields
/// (whitespace), reasons (`,`) or keys (`=`), the escape itself, and
/// control characters, which a one-line comment must not hold.
fn escaped(c: char) -> bool {
    matches!(c, '%' | ',' | '=') || c.is_whitespace() || c.is_control()
}

/// Writes `value` with [`escaped`] characters as `%XX`; a value that is
/// exactly `-` (which means "none") as `%2D`.
fn encode(f: &mut fmt::Formatter<'_>, value: &str) -> fmt::Result {
    if value == "-" {
        return f.write_str("%2D");
    }
    for c in value.chars() {
        if escaped(c) {
            let mut utf8 = [0u8; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                write!(f, "%{byte:02X}")?;
            }
        } else {
            write!(f, "{c}")?;
        }
    }
    Ok(())
}

/// The value `%XX` escapes stand for; `None` for a broken escape or bytes
/// that are not UTF-8.
fn decode(value: &str) -> Option<String> {
    if !value.contains('%') {
        return Some(value.to_string());
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            // Two hex digits exactly (`from_str_radix` alone takes `+1`).
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A comma-separated list of values; `-` is the empty list.
fn parse_list(value: &str) -> Option<Vec<String>> {
    if value == "-" {
        return Some(Vec::new());
    }
    value.split(',').map(decode).collect()
}

/// One line of an [`EvidenceTally`]. Ordered by its fields in turn: peer
/// (unknown first), stage, direction, origin, reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TallyKey {
    /// The tunnel peer, when known.
    pub peer: Option<IpAddr>,
    /// Underlay, tunnel or pod.
    pub stage: Stage,
    /// Received or sent.
    pub direction: Direction,
    /// Classifier or kernel.
    pub origin: Origin,
    /// One reason name; `-` for a frame whose comment names none.
    pub reason: String,
}

/// Evidence frames counted per (peer, stage, direction, origin, reason):
/// a frame with two reasons counts once under each. Bounded at
/// [`TALLY_MAX_KEYS`] keys; a (frame, reason) whose key is new once the
/// bound is reached is counted in [`EvidenceTally::overflow`] instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvidenceTally {
    counts: BTreeMap<TallyKey, u64>,
    frames: u64,
    overflow: u64,
}

impl EvidenceTally {
    /// An empty tally.
    pub fn new() -> EvidenceTally {
        EvidenceTally::default()
    }

    /// Counts one frame with tag `tag`.
    pub fn add(&mut self, tag: &Tag) {
        self.frames += 1;
        let none = ["-".to_string()];
        let reasons = if tag.reasons.is_empty() {
            &none[..]
        } else {
            &tag.reasons[..]
        };
        for (i, reason) in reasons.iter().enumerate() {
            // A reason written twice still counts the frame once.
            if reasons[..i].contains(reason) {
                continue;
            }
            let key = TallyKey {
                peer: tag.peer,
                stage: tag.stage,
                direction: tag.direction,
                origin: tag.origin,
                reason: reason.clone(),
            };
            if let Some(count) = self.counts.get_mut(&key) {
                *count += 1;
            } else if self.counts.len() < TALLY_MAX_KEYS {
                self.counts.insert(key, 1);
            } else {
                self.overflow += 1;
            }
        }
    }

    /// Frames counted.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// (frame, reason) pairs whose key found no room.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Whether no frame was counted.
    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// The counts, in [`TallyKey`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&TallyKey, u64)> + '_ {
        self.counts.iter().map(|(key, count)| (key, *count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence() -> Evidence {
        Evidence {
            timestamp: Duration::new(1_700_000_000, 123_456_789),
            ifindex: 2,
            interface: "eth0".to_string(),
            direction: Direction::Rx,
            stage: Stage::Underlay,
            origin: Origin::Classifier,
            peer: Some("10.0.0.2".parse().unwrap()),
            reasons: vec![
                "calico_allow_set".to_string(),
                "bad_outer_checksum".to_string(),
            ],
            location: None,
            wire_len: 1_500,
            data: vec![0; 64],
        }
    }

    #[test]
    fn comments_are_one_line_of_fields_in_a_fixed_order() {
        assert_eq!(
            evidence().comment(),
            "observer origin=classifier reason=calico_allow_set,bad_outer_checksum \
             stage=underlay direction=rx peer=10.0.0.2 interface=eth0"
        );
        let kernel = Evidence {
            origin: Origin::Kernel,
            stage: Stage::Tunnel,
            direction: Direction::Tx,
            peer: None,
            interface: "vxlan.calico".to_string(),
            reasons: vec!["NETFILTER_DROP".to_string()],
            location: Some("nf_hook_slow".to_string()),
            ..evidence()
        };
        assert_eq!(
            kernel.comment(),
            "observer origin=kernel reason=NETFILTER_DROP stage=tunnel direction=tx peer=- \
             interface=vxlan.calico location=nf_hook_slow"
        );
    }

    #[test]
    fn comments_read_back_as_their_tag() {
        let plain = evidence();
        assert_eq!(Tag::parse(&plain.comment()), Some(plain.tag()));
        // Every value the fields could hold, separators included.
        let odd = Evidence {
            origin: Origin::Kernel,
            stage: Stage::Pod,
            direction: Direction::Tx,
            peer: Some("2001:db8::7".parse().unwrap()),
            interface: "a b=c,d%e\tf\u{7f}é-".to_string(),
            reasons: vec![
                "-".to_string(),
                String::new(),
                "OPENVSWITCH:3".to_string(),
                "x,y".to_string(),
            ],
            location: Some("-".to_string()),
            ..evidence()
        };
        let comment = odd.comment();
        assert!(!comment.contains('\t') && !comment.contains('\u{7f}'));
        assert_eq!(comment.split(' ').count(), 8, "{comment}");
        assert_eq!(Tag::parse(&comment), Some(odd.tag()));
        for (interface, reasons) in [("", vec![]), ("-", vec![String::new()])] {
            let e = Evidence {
                interface: interface.to_string(),
                reasons,
                ..evidence()
            };
            assert_eq!(Tag::parse(&e.comment()), Some(e.tag()), "{}", e.comment());
        }
    }

    #[test]
    fn comments_the_observer_did_not_write_are_none() {
        let good = evidence().comment();
        for comment in [
            "",
            "   ",
            "a comment someone typed in Wireshark",
            "observer",
            "observer was here",
            "observers origin=classifier",
            // A field missing.
            "observer origin=classifier reason=x stage=underlay direction=rx peer=-",
            // Values that name nothing.
            &good.replace("origin=classifier", "origin=firewall"),
            &good.replace("stage=underlay", "stage=UNDERLAY"),
            &good.replace("direction=rx", "direction=in"),
            &good.replace("peer=10.0.0.2", "peer=10.0.0.256"),
            // Broken escapes and bytes that are not UTF-8.
            &good.replace("interface=eth0", "interface=eth%"),
            &good.replace("interface=eth0", "interface=eth%4"),
            &good.replace("interface=eth0", "interface=eth%zz"),
            &good.replace("interface=eth0", "interface=eth%FF"),
            &good.replace("interface=eth0", "interface=%C3%"),
            &good.replace("interface=eth0", "interface=%+1"),
        ] {
            assert_eq!(Tag::parse(comment), None, "{comment:?}");
        }
        // Fields a later observer adds are skipped; spacing is forgiven.
        let later = format!("  {} vni=42 ", good.replace(' ', "  "));
        assert_eq!(Tag::parse(&later), Some(evidence().tag()));
    }

    #[test]
    fn parse_never_panics_on_any_cut_of_a_comment() {
        let comment = Evidence {
            interface: "é%x y".to_string(),
            location: Some("nf_hook_slow".to_string()),
            ..evidence()
        }
        .comment();
        for (end, _) in comment.char_indices() {
            let _ = Tag::parse(&comment[..end]);
            let _ = Tag::parse(&comment[end..]);
        }
        for bytes in [
            &b"observer interface=%"[..],
            b"observer reason=%%%",
            b"observer ==",
        ] {
            let _ = Tag::parse(std::str::from_utf8(bytes).unwrap());
        }
    }

    fn tag(peer: &str, stage: Stage, origin: Origin, reasons: &[&str]) -> Tag {
        Tag {
            origin,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            stage,
            direction: Direction::Rx,
            peer: (peer != "-").then(|| peer.parse().unwrap()),
            interface: "eth0".to_string(),
            location: None,
        }
    }

    #[test]
    fn a_tally_counts_each_frame_once_per_reason_in_key_order() {
        let mut tally = EvidenceTally::new();
        assert!(tally.is_empty());
        let both = ["calico_allow_set", "bad_outer_checksum"];
        tally.add(&tag("10.0.0.2", Stage::Underlay, Origin::Classifier, &both));
        tally.add(&tag(
            "10.0.0.2",
            Stage::Underlay,
            Origin::Classifier,
            &["calico_allow_set", "calico_allow_set"],
        ));
        tally.add(&tag(
            "10.0.0.1",
            Stage::Tunnel,
            Origin::Kernel,
            &["NETFILTER_DROP"],
        ));
        tally.add(&tag(
            "10.0.0.1",
            Stage::Underlay,
            Origin::Kernel,
            &["NETFILTER_DROP"],
        ));
        tally.add(&tag("-", Stage::Pod, Origin::Kernel, &[]));
        let got: Vec<(String, u64)> = tally
            .iter()
            .map(|(k, n)| {
                let peer = k.peer.map_or("-".to_string(), |p| p.to_string());
                let key = format!("{peer} {} {} {}", k.stage, k.origin, k.reason);
                (key, n)
            })
            .collect();
        let want = [
            ("- pod kernel -", 1),
            ("10.0.0.1 underlay kernel NETFILTER_DROP", 1),
            ("10.0.0.1 tunnel kernel NETFILTER_DROP", 1),
            ("10.0.0.2 underlay classifier bad_outer_checksum", 1),
            ("10.0.0.2 underlay classifier calico_allow_set", 2),
        ];
        let want: Vec<(String, u64)> = want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        assert_eq!(got, want);
        assert_eq!(tally.frames(), 5);
        assert_eq!(tally.overflow(), 0);
    }

    #[test]
    fn a_tally_is_bounded_and_counts_what_did_not_fit() {
        let mut tally = EvidenceTally::new();
        let reason = |i: usize| format!("reason_{i}");
        for i in 0..TALLY_MAX_KEYS + 10 {
            let r = reason(i);
            tally.add(&tag(
                "10.0.0.2",
                Stage::Underlay,
                Origin::Kernel,
                &[r.as_str()],
            ));
        }
        // Keys already kept go on counting.
        let first = reason(0);
        tally.add(&tag(
            "10.0.0.2",
            Stage::Underlay,
            Origin::Kernel,
            &[first.as_str()],
        ));
        assert_eq!(tally.iter().count(), TALLY_MAX_KEYS);
        assert_eq!(tally.overflow(), 10);
        assert_eq!(tally.frames(), TALLY_MAX_KEYS as u64 + 11);
        let kept: u64 = tally.iter().map(|(_, n)| n).sum();
        assert_eq!(kept + tally.overflow(), tally.frames());
    }
}
