#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""netem -- a small userspace network emulator for fedbox's fault tests.

This kernel has no netem qdisc, so delay and loss are made here (rate
limits come from tc tbf, which works). Two modes:

  tun A_NS A_IP B_NS B_IP [--delay MS] [--jitter MS] [--loss P]
      makes two TUN devices, moves one into network namespace A_NS (address
      A_IP) and one into B_NS (B_IP), point to point, and carries the IP
      packets between them: each is held --delay ms (plus up to --jitter,
      uniformly) and dropped with probability --loss, so TCP really sees
      latency, loss and retransmissions. Both namespaces must exist.

  relay LISTEN_PORT TARGET_HOST TARGET_PORT [--cut-after BYTES] [--delay MS]
      a TCP relay on 127.0.0.1:LISTEN_PORT to TARGET: with --cut-after, the
      first connection is closed (both sides, RST) once BYTES went from the
      client to the target, as a link that dies in the middle of an upload;
      later connections are relayed whole. --delay holds each piece.

It runs until SIGTERM or SIGINT, prints "ready" once set up, and counts
what it did on stderr when it stops. Debian's /usr/bin/python3, standard
library only.
"""
import argparse
import fcntl
import heapq
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000

running = True


def stop(sig, frame):
    global running
    running = False


def tun_open(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(),
                                           IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def ip(*args):
    subprocess.run(["ip"] + list(args), check=True)


def tun_mode(a):
    tag = "%x" % (os.getpid() & 0xffff)
    names = ["fbta" + tag, "fbtb" + tag]
    fds = [tun_open(n) for n in names]
    for name, ns, mine, peer in ((names[0], a.a_ns, a.a_ip, a.b_ip),
                                 (names[1], a.b_ns, a.b_ip, a.a_ip)):
        ip("link", "set", name, "netns", ns)
        ip("-n", ns, "addr", "add", mine, "peer", peer, "dev", name)
        ip("-n", ns, "link", "set", name, "up")
    rng = random.Random(a.seed)
    held = []  # (due, seq, out fd, packet)
    seq = 0
    stats = {"carried": 0, "dropped": 0}
    print("ready", flush=True)
    while running:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, out, pkt = heapq.heappop(held)
            try:
                os.write(out, pkt)
                stats["carried"] += 1
            except OSError:
                stats["dropped"] += 1
        wait = max(0.0, held[0][0] - now) if held else 0.2
        try:
            r, _, _ = select.select(fds, [], [], wait)
        except InterruptedError:
            continue
        for i, fd in enumerate(fds):
            if fd not in r:
                continue
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if rng.random() < a.loss:
                    stats["dropped"] += 1
                    continue
                due = time.monotonic() + (a.delay +
                                          rng.uniform(0, a.jitter)) / 1000
                seq += 1
                heapq.heappush(held, (due, seq, fds[1 - i], pkt))
    print("netem tun: %(carried)d packets carried, %(dropped)d dropped"
          % stats, file=sys.stderr)


def relay_mode(a):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.listen_port))
    ls.listen(64)
    ls.setblocking(False)
    pairs = {}  # socket -> [peer socket, is client side, pending bytes]
    cut_left = a.cut_after  # None: never cut
    held = []  # (due, seq, socket, data)
    seq = 0
    stats = {"connections": 0, "up_bytes": 0, "cuts": 0}
    print("ready", flush=True)

    def close_pair(s, rst):
        p = pairs.pop(s, None)
        for x in (s, p[0] if p else None):
            if x is None:
                continue
            pairs.pop(x, None)
            try:
                if rst:
                    x.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack("ii", 1, 0))
                x.close()
            except OSError:
                pass

    while running:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, s, data = heapq.heappop(held)
            if s in pairs:
                try:
                    s.setblocking(True)
                    s.sendall(data)
                    s.setblocking(False)
                except OSError:
                    close_pair(s, False)
        wait = max(0.0, held[0][0] - now) if held else 0.2
        try:
            r, _, _ = select.select([ls] + list(pairs), [], [], wait)
        except (InterruptedError, ValueError):
            continue
        for s in r:
            if s is ls:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                u = socket.create_connection((a.target_host, a.target_port))
                for x in (c, u):
                    x.setblocking(False)
                    x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pairs[c] = [u, True]
                pairs[u] = [c, False]
                stats["connections"] += 1
                continue
            if s not in pairs:
                continue
            peer, client = pairs[s]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                close_pair(s, False)
                continue
            if client:
                stats["up_bytes"] += len(data)
                if cut_left is not None:
                    if len(data) >= cut_left:
                        # forward up to the cut, then the link dies
                        data = data[:cut_left]
                        peer.setblocking(True)
                        peer.sendall(data)
                        close_pair(s, True)
                        cut_left = None
                        stats["cuts"] += 1
                        print("netem relay: cut after %d bytes up"
                              % a.cut_after, file=sys.stderr, flush=True)
                        continue
                    cut_left -= len(data)
            seq += 1
            heapq.heappush(held, (time.monotonic() + a.delay / 1000, seq,
                                  peer, data))
    print("netem relay: %(connections)d connections, %(up_bytes)d bytes "
          "up, %(cuts)d cut" % stats, file=sys.stderr)


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("tun", help="packet delay and loss between two "
                       "network namespaces")
    t.add_argument("a_ns")
    t.add_argument("a_ip")
    t.add_argument("b_ns")
    t.add_argument("b_ip")
    t.add_argument("--delay", type=float, default=0, help="ms each way")
    t.add_argument("--jitter", type=float, default=0, help="ms, uniform")
    t.add_argument("--loss", type=float, default=0,
                   help="probability a packet is dropped (0..1)")
    t.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("relay", help="a TCP relay that can cut the first "
                       "connection after some bytes up")
    r.add_argument("listen_port", type=int)
    r.add_argument("target_host")
    r.add_argument("target_port", type=int)
    r.add_argument("--cut-after", type=int, default=None)
    r.add_argument("--delay", type=float, default=0, help="ms each way")
    a = p.parse_args()
    if a.mode == "tun" and not 0 <= a.loss < 1:
        p.error("--loss must be in [0, 1)")
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    (tun_mode if a.mode == "tun" else relay_mode)(a)


if __name__ == "__main__":
    main()
