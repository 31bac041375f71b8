#!/usr/bin/env python3
"""Records the seeds of the fuzz targets from a real node: builds Calico's
VXLAN data plane (devices, routes, neighbours, FDB, allow-set, drop rules)
in a network namespace of its own, saves what the observer reads there
(rtnetlink dumps as raw datagrams, iptables-save, iptables -v -S, ipset
save, nft -j listings) under seeds/<target>/, and deletes the namespace.
The settings seeds come from deploy/configmap.yaml and every key of the
config file. Run as root: python3 fuzz/record_seeds.py

Python because the raw datagrams need a bare NETLINK_ROUTE socket, which its
standard library has and the image's tools (ip, bridge) do not expose."""

import os
import socket
import struct
import subprocess
import sys

FUZZ = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(FUZZ, "seeds")
NS = f"obs-fuzz-seeds-{os.getpid()}"
VXLAN_DROP = "Drop IPv4 VXLAN packets from non-allowed hosts"

# <linux/rtnetlink.h>, <linux/netlink.h>
RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE, RTM_GETNEIGH = 18, 22, 26, 30
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
AF_INET, AF_INET6, AF_BRIDGE = 2, 10, 7


def sh(*argv, ns=True):
    """Runs a command (in the namespace) and returns its output."""
    full = ["ip", "netns", "exec", NS, *argv] if ns else list(argv)
    return subprocess.run(full, check=True, capture_output=True, text=True).stdout


def setup():
    """Calico's VXLAN data plane on node 10.10.60.1 with two peers."""
    sh("ip", "netns", "add", NS, ns=False)
    for line in [
        "link add u0 type veth peer name u1",
        "link set u0 up", "link set u1 up",
        "addr add 10.10.60.1/24 dev u0", "addr add fd00:10::1/64 dev u0 nodad",
        "link add vxlan.calico type vxlan id 4096 dstport 4789 local 10.10.60.1 dev u0 nolearning",
        "link set vxlan.calico mtu 1450 up",
        "addr add 192.168.10.0/32 dev vxlan.calico",
        "link add vxlan-v6.calico type vxlan id 4096 dstport 4789 local fd00:10::1 dev u0 nolearning",
        "link set vxlan-v6.calico up",
        "link add wg0 type veth peer name wg0p", "link set wg0 up", "link set wg0p up",
        "neigh add 192.168.20.0 lladdr 66:a0:00:00:00:02 dev vxlan.calico nud permanent",
        "neigh add fd00:20:: lladdr 66:a0:00:00:00:02 dev vxlan-v6.calico nud permanent",
        "route add 192.168.20.0/26 via 192.168.20.0 dev vxlan.calico onlink proto 80",
        "route add blackhole 192.168.10.0/26 proto 80",
        "route add 192.168.30.0/26 via 10.10.60.3 dev u0 proto bird mtu 1400",
        "route add 192.168.40.0/26 proto bird nexthop via 10.10.60.2 dev u0 nexthop via 10.10.60.3 dev u0",
        "route add 192.168.50.0/26 dev wg0",
        "-6 route add fd00:20::/122 via fd00:20:: dev vxlan-v6.calico onlink proto 80",
    ]:
        sh("ip", *line.split())
    for line in [
        "fdb append 66:a0:00:00:00:02 dst 10.10.60.2 dev vxlan.calico self permanent",
        "fdb append 00:00:00:00:00:00 dst 10.10.60.3 dev vxlan.calico self permanent",
        "fdb append 66:a0:00:00:00:02 dst fd00:10::2 dev vxlan-v6.calico self permanent",
    ]:
        sh("bridge", *line.split())
    sh("ipset", "create", "cali40all-vxlan-net", "hash:net", "family", "inet")
    for member in ["10.10.60.2", "10.10.61.0/24", "10.10.62.1-10.10.62.5", "10.10.61.128/25 nomatch"]:
        sh("ipset", "add", "cali40all-vxlan-net", *member.split())
    sh("iptables", "-N", "cali-INPUT")
    sh("iptables", "-A", "INPUT", "-j", "cali-INPUT")
    sh("iptables", "-A", "cali-INPUT", "-p", "udp", "-m", "comment", "--comment",
       "Allow IPv4 VXLAN packets from allowed hosts", "-m", "set", "--match-set",
       "cali40all-vxlan-net", "src", "-m", "udp", "--dport", "4789", "-j", "ACCEPT")
    sh("iptables", "-A", "cali-INPUT", "-p", "udp", "-m", "comment", "--comment", VXLAN_DROP,
       "-m", "udp", "--dport", "4789", "-c", "579", "34740", "-j", "DROP")
    sh("iptables", "-A", "cali-INPUT", "-m", "comment", "--comment", 'policy "q" -c 1 2',
       "-c", "7", "420", "-j", "ACCEPT")
    subprocess.run(["ip", "netns", "exec", NS, "nft", "-f", "-"], check=True, text=True, input=f"""
table ip calico {{
    set cali40all-vxlan-net {{
        type ipv4_addr; flags interval;
        elements = {{ 10.10.60.2, 10.10.61.0/24, 10.10.62.1-10.10.62.5 }}
    }}
    chain filter-INPUT {{
        type filter hook input priority 0;
        udp dport 4789 ip saddr @cali40all-vxlan-net counter accept
        udp dport 4789 counter packets 579 bytes 34740 drop comment "{VXLAN_DROP}"
    }}
}}
""")


def request(kind, payload, seq):
    """A dump request (nlmsghdr, then the family header `payload`)."""
    return struct.pack("=IHHII", 16 + len(payload), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + payload


def dumps():
    """The observer's dumps (node/dataplane/netlink.rs), datagrams as the
    kernel sent them, concatenated."""
    requests = [
        (RTM_GETLINK, struct.pack("=BxHiII", 0, 0, 0, 0, 0)),
        (RTM_GETADDR, struct.pack("=BBBBi", 0, 0, 0, 0, 0)),
        (RTM_GETROUTE, struct.pack("=BBBBBBBBI", AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)),
        (RTM_GETROUTE, struct.pack("=BBBBBBBBI", AF_INET6, 0, 0, 0, 0, 0, 0, 0, 0)),
    ] + [(RTM_GETNEIGH, struct.pack("=BxxxiHBB", f, 0, 0, 0, 0)) for f in (AF_INET, AF_INET6, AF_BRIDGE)]
    out = bytearray()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        for seq, (kind, payload) in enumerate(requests, 1):
            s.send(request(kind, payload, seq))
            done = False
            while not done:
                data = s.recv(1 << 20)
                out += data
                offset = 0
                while offset + 16 <= len(data):
                    length, kind_ = struct.unpack_from("=IH", data, offset)
                    done |= kind_ in (NLMSG_DONE, NLMSG_ERROR)
                    offset += (length + 3) & ~3
    return bytes(out)


def save(target, name, content):
    """Writes seeds/<target>/<name> (bytes or text)."""
    os.makedirs(os.path.join(SEEDS, target), exist_ok=True)
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(os.path.join(SEEDS, target, name), mode) as f:
        f.write(content)


def settings():
    """The config file of deploy/configmap.yaml, and one with every key."""
    with open(os.path.join(FUZZ, "..", "deploy", "configmap.yaml")) as f:
        lines = f.read().split("  config.toml: |\n", 1)[1].splitlines()
    save("settings", "configmap.toml", "".join(l[4:] + "\n" for l in lines))
    save("settings", "every-key.toml", """interfaces = ["eth0", "bond0"]
interval = "15s"
textfile_dir = "/var/lib/node_exporter/textfile_collector"
max_peers = 50
xdp_mode = "generic"
max_flows = 65536
vxlan_ports = [4789, 8472]
vxlan_gpe_ports = [4790]
geneve_ports = [6081]
wireguard_ports = [51820, 51821]
allow_sets = ["vxlan=my-vteps", "ipip=cali40all-hosts-net"]
allow_cidrs = ["10.0.0.0/8", "ipip=fd00::/64"]
allow_set_refresh = "5s"
anomaly_window = "10s"
anomaly_min_packets = 5
tunnel_devices = ["wg0=wireguard", "tun0=vxlan"]
drop_spike_rate = 2.5
bird_sockets = ["/var/run/calico/bird.ctl"]
bgp_flaps = 3
bgp_flap_window = "10m"
""")


def main():
    if sys.argv[1:] == ["--dump"]:
        sys.stdout.buffer.write(dumps())
        return
    if os.geteuid() != 0:
        sys.exit("record_seeds.py: run as root (it creates a network namespace)")
    settings()
    try:
        setup()
        save("iptables", "iptables-save.txt", sh("iptables-save", "-c", "-t", "filter"))
        save("iptables", "iptables-v-S.txt", sh("iptables", "-t", "filter", "-v", "-S", "cali-INPUT"))
        save("ipset", "ipset-save.txt", sh("ipset", "save", "cali40all-vxlan-net"))
        save("nft", "list-chain.json", sh("nft", "-j", "list", "chain", "ip", "calico", "filter-INPUT"))
        save("nft", "list-chains.json", sh("nft", "-j", "list", "chains"))
        save("nft", "list-set.json", sh("nft", "-j", "list", "set", "ip", "calico", "cali40all-vxlan-net"))
        save("nft", "list-sets-terse.json", sh("nft", "-j", "-t", "list", "sets"))
        # The dumps are read in the namespace: by this script, run there.
        dump = subprocess.run(["ip", "netns", "exec", NS, sys.executable, __file__, "--dump"],
                              check=True, capture_output=True).stdout
        save("netlink", "calico-vxlan.bin", dump)
    finally:
        subprocess.run(["ip", "netns", "delete", NS], check=False)


main()
