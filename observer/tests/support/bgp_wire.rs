//! BGP at the wire in tests: a scripted BGP exchange over a real TCP
//! connection between two namespaces, and tcpdump's count of TCP/179
//! segments by flag and by first BGP message, the reference the
//! observer's `bgp_wire` lines are compared with. Shared by `bgp.rs`
//! (real BIRD) and `kernels.rs` (every kernel).

use std::{
    io::{Read, Write},
    net::{IpAddr, TcpListener, TcpStream},
};

use observer_testkit::netns::Netns;
use serde_json::Value;

use super::netns::Capture;

/// The counters of a `bgp_wire` line, by name, as tcpdump is asked.
pub const COUNTERS: [&str; 9] = [
    "segments",
    "syn",
    "fin",
    "rst",
    "open",
    "update",
    "notification",
    "keepalive",
    "route_refresh",
];

/// A BGP message: the 16-byte marker, its length, its type, `body`.
pub fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(kind);
    m.extend_from_slice(body);
    m
}

/// An OPEN: version 4, AS 64512, `hold_time`, BGP identifier, no
/// parameters.
pub fn open(hold_time: u16) -> Vec<u8> {
    let [h0, h1] = hold_time.to_be_bytes();
    message(1, &[4, 0xfc, 0x00, h0, h1, 10, 99, 0, 4, 0])
}

/// A KEEPALIVE.
pub fn keepalive() -> Vec<u8> {
    message(4, &[])
}

/// A NOTIFICATION Cease / Administrative Shutdown.
pub fn cease() -> Vec<u8> {
    message(3, &[6, 2])
}

/// One short BGP session, `client` connecting from namespace `from` to
/// `server`'s port 179 in namespace `to`: OPEN; OPEN and KEEPALIVE in one
/// segment back; KEEPALIVE; a NOTIFICATION Cease / Administrative
/// Shutdown back, and both close. Each side writes only after reading
/// the other's message, so every message is one segment of its own.
pub fn exchange(from: &Netns, to: &Netns, server: IpAddr) {
    let listener = to
        .run(move || TcpListener::bind((server, 179)))
        .expect("listening on TCP 179");
    let client = from
        .run(move || TcpStream::connect((server, 179)))
        .expect("connecting to TCP 179");
    let (peer, _) = listener.accept().expect("accepting");
    let (mut client, mut peer) = (client, peer);
    for socket in [&client, &peer] {
        socket.set_nodelay(true).unwrap();
    }
    let mut buf = [0u8; 64];
    let mut read_exact = |socket: &mut TcpStream, len: usize| {
        socket
            .read_exact(&mut buf[..len])
            .expect("reading a message");
    };
    client.write_all(&open(9)).unwrap();
    read_exact(&mut peer, 29);
    peer.write_all(&[open(6), keepalive()].concat()).unwrap();
    read_exact(&mut client, 48);
    client.write_all(&keepalive()).unwrap();
    read_exact(&mut peer, 19);
    peer.write_all(&cease()).unwrap();
    peer.shutdown(std::net::Shutdown::Both).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).expect("reading to the end");
    assert_eq!(rest, cease(), "the NOTIFICATION, then the end");
}

/// tcpdump's filter for a TCP segment whose payload starts with a BGP
/// message of type `kind`: a whole header in the payload, the marker's
/// first four bytes all ones (IPv4).
fn first_message_filter(kind: u8) -> String {
    let payload = "((tcp[12:1] & 0xf0) >> 2)";
    format!(
        "ip[2:2] - ((ip[0:1] & 0x0f) << 2) - {payload} >= 19 \
         and tcp[{payload}:4] = 0xffffffff and tcp[{payload} + 18:1] = {kind}"
    )
}

/// tcpdump's count of each of [`COUNTERS`] in `capture`, for the TCP/179
/// segments `host` selects (`src host X` for rx, `dst host X` for tx).
pub fn reference(capture: &Capture, host: &str) -> Vec<(&'static str, u64)> {
    let count = |filter: &str| capture.count(&format!("tcp port 179 and {host} and ({filter})"));
    COUNTERS
        .iter()
        .map(|name| {
            let filter = match *name {
                "segments" => "tcp".to_string(),
                "syn" => "tcp[tcpflags] & tcp-syn != 0".to_string(),
                "fin" => "tcp[tcpflags] & tcp-fin != 0".to_string(),
                "rst" => "tcp[tcpflags] & tcp-rst != 0".to_string(),
                "open" => first_message_filter(1),
                "update" => first_message_filter(2),
                "notification" => first_message_filter(3),
                "keepalive" => first_message_filter(4),
                _ => first_message_filter(5),
            };
            (*name, count(&filter))
        })
        .collect()
}

/// The last `bgp_wire` line of (`iface`, `direction`, `peer`).
pub fn last_line(lines: &[Value], iface: &str, direction: &str, peer: IpAddr) -> Option<Value> {
    lines
        .iter()
        .rfind(|l| {
            l["type"] == "bgp_wire"
                && l["iface"] == iface
                && l["direction"] == direction
                && l["peer"] == peer.to_string()
        })
        .cloned()
}
