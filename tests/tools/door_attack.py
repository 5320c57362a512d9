#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""door_attack -- peers that hold a coordinator's door without ever
authenticating, for integration tests.

Every connection leaves from a source address of its own choosing
(--src 127.0.0.2, or a range 127.0.0.10-29: connections take them in
turn), so that a coordinator's per-address limits meet several addresses
on one host.

  burst   one connection sends --frames handshake frames (a well-formed
          hello with a random key, or --pub's key with a random signature),
          reads the answers for --read seconds (0: none, it closes at once)
          and closes; --parallel such connections at once, again and again
          for --seconds. With --hold S a connection stays open S seconds
          without reading before it closes (a staller: its queue fills).
  idle    keeps --conns raw TCP connections open that send a ZMTP greeting
          and READY, then nothing (what they receive is read and dropped).
  partial the same, then the header of a --size frame and --body bytes of
          it, then nothing.
  noop    opens --conns connections that send nothing at all.

A closed connection is opened again (at most --rate new connections a
second over all), so the pressure stays for --seconds. Prints one JSON
line: connections opened, closed by the coordinator, the longest an
unauthenticated connection stayed open (from the coordinator's first
bytes, its ZMTP greeting: a connection the kernel completed stays in the
listener's backlog, costing the coordinator nothing, until accepted),
rejects received and their texts
(burst; the key's fingerprint replaced by K).

usage: door_attack.py HOST:PORT MODE [options]
"""
import argparse
import errno
import json
import os
import random
import re
import resource
import selectors
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fbwire  # noqa: E402

HANDSHAKE = 12   # Envelope field of Handshake (proto/fedbox.proto)
HELLO_LEN = 164  # FB_HS_HELLO_LEN (crypto/crypto.h)


def sources(spec):
    """'127.0.0.10-29' or 'a,b,c' -> list of addresses."""
    out = []
    for part in spec.split(","):
        if "-" in part.rsplit(".", 1)[-1]:
            head, rng = part.rsplit(".", 1)
            lo, hi = (int(x) for x in rng.split("-"))
            out += ["%s.%d" % (head, i) for i in range(lo, hi + 1)]
        else:
            out.append(part)
    return out


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft),
                                                    max(want, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def greeting():
    """ZMTP 3.1 greeting (NULL mechanism, client) and a READY command, as
    a libzmq DEALER sends them."""
    g = b"\xff" + b"\x00" * 7 + b"\x01\x7f" + b"\x03\x01" + b"NULL"
    g += b"\x00" * 16 + b"\x00" + b"\x00" * 31
    body = (b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) +
            b"DEALER" + b"\x08Identity" + struct.pack(">I", 0))
    return g + b"\x04" + bytes([len(body)]) + body


def hello_blob(pub, rng):
    b = bytearray(os.urandom(HELLO_LEN))
    b[0], b[1] = 1, 1  # FB_CRYPTO_WIRE_VERSION, FB_KIND_HELLO
    b[2:4] = struct.pack("<H", fbwire.PROTOCOL_VERSION)
    if pub is not None:
        b[4:36] = pub
    return bytes(b)


def load_pub(path):
    import base64
    line = open(path).read().split()
    return base64.b64decode(line[1])


class Pacer:
    """At most `rate` new connections a second, overall."""

    def __init__(self, rate):
        self.rate = rate
        self.t = time.monotonic()
        self.tokens = float(rate)

    def take(self):
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def zmtp_done(rx):
    """Whether rx holds the coordinator's greeting and READY command."""
    return len(rx) >= 66 and len(rx) >= 66 + rx[65]


def raw_holder(a, host, port, srcs, first, after):
    """idle, partial, noop: hold a.conns raw connections for a.seconds.
    Each sends `first`, then `after` once the coordinator's ZMTP greeting
    and READY are in (libzmq drops a peer whose frames come before)."""
    raise_nofile(a.conns + 256)
    sel = selectors.DefaultSelector()
    pacer = Pacer(a.rate)
    stats = {"mode": a.mode, "opened": 0, "closed_by_peer": 0,
             "connect_failed": 0, "max_life_s": 0.0, "held_peak": 0,
             "sources": len(srcs)}
    # sock -> [when the coordinator first spoke (its ZMTP greeting: it has
    # accepted the connection), bytes to send, bytes received until the
    # ZMTP handshake is done or None]
    live = {}
    want = a.conns
    i = 0
    end = time.monotonic() + a.seconds
    initial = True

    def open_one():
        nonlocal i
        src = srcs[i % len(srcs)]
        i += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((src, 0))
            s.setblocking(False)
            rc = s.connect_ex((host, port))
        except OSError:
            s.close()
            stats["connect_failed"] += 1
            return
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            stats["connect_failed"] += 1
            return
        live[s] = [None, first, b"" if after else None]
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        stats["opened"] += 1

    def gone(s, by_peer):
        t0 = live.pop(s)[0]
        if t0 is not None:
            life = time.monotonic() - t0
            stats["max_life_s"] = max(stats["max_life_s"], life)
        if by_peer:
            stats["closed_by_peer"] += 1
        sel.unregister(s)
        s.close()

    while time.monotonic() < end:
        while len(live) < want and (initial or pacer.take()):
            open_one()
            if stats["connect_failed"] > 1000 and len(live) == 0:
                break
        initial = False
        stats["held_peak"] = max(stats["held_peak"], len(live))
        for key, ev in sel.select(timeout=0.05):
            s = key.fileobj
            if s not in live:
                continue
            if ev & selectors.EVENT_READ:
                try:
                    data = s.recv(65536)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    gone(s, True)
                    continue
                st = live[s]
                if st[0] is None:
                    st[0] = time.monotonic()
                if st[2] is not None:
                    st[2] = (st[2] + data)[:512]
                    if zmtp_done(st[2]):
                        st[2] = None
                        st[1] += after
                        sel.modify(s, selectors.EVENT_READ |
                                   selectors.EVENT_WRITE)
            if ev & selectors.EVENT_WRITE:
                todo = live[s][1]
                try:
                    if todo:
                        n = s.send(todo)
                        live[s][1] = todo[n:]
                except (BlockingIOError, InterruptedError):
                    pass
                except (ConnectionError, OSError):
                    gone(s, True)
                    continue
                if not live[s][1]:
                    sel.modify(s, selectors.EVENT_READ)
    now = time.monotonic()
    for s, st in list(live.items()):
        if st[0] is not None:
            stats["max_life_s"] = max(stats["max_life_s"], now - st[0])
        s.close()
    stats["open_at_end"] = len(live)
    stats["max_life_s"] = round(stats["max_life_s"], 3)
    return stats


def burst(a, host, port, srcs):
    import zmq
    raise_nofile(a.parallel * 4 + 256)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    rng = random.Random(a.seed)
    pub = load_pub(a.pub) if a.pub else None
    stats = {"mode": "burst", "connections": 0, "frames": 0, "rejects": 0,
             "reject_texts": [], "sources": len(srcs)}
    end = time.monotonic() + a.seconds
    i = 0
    while True:
        socks = []
        for _ in range(a.parallel):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.SNDHWM, a.frames + 16)
            s.setsockopt(zmq.SNDTIMEO, 0)
            s.connect("tcp://%s:0;%s:%d" % (srcs[i % len(srcs)], host, port))
            i += 1
            for _ in range(a.frames):
                try:
                    s.send(fbwire.frame(HANDSHAKE, fbwire.field_bytes(
                        1, hello_blob(pub, rng))), zmq.DONTWAIT)
                    stats["frames"] += 1
                except zmq.Again:
                    break
            socks.append(s)
            stats["connections"] += 1
        if a.hold > 0:
            time.sleep(a.hold)  # a staller: never reads
        elif a.read > 0:
            # a burster: reads what came back within a moment, then closes
            t_end = time.monotonic() + a.read
            for s in socks:
                while time.monotonic() < t_end and s.poll(
                        max(1, int((t_end - time.monotonic()) * 1000))):
                    m = s.recv_multipart()
                    top = fbwire.parse_top(m[0])
                    if top and top[0] == fbwire.REJECT:
                        stats["rejects"] += 1
                        txt = fbwire.fields(top[1]).get(1, [b""])[0]
                        # the key's fingerprint is the sender's own: the
                        # rest of the text is what could tell keys apart
                        txt = re.sub(r"key fb:[0-9a-f]+ ", "key K ",
                                     txt.decode(errors="replace"))
                        if txt not in stats["reject_texts"]:
                            stats["reject_texts"].append(txt)
        for s in socks:
            # with --read 0 and no --hold it closes at once: linger, so
            # that its frames still go out (the REJECTs then find it gone)
            s.close(linger=1000)
        if time.monotonic() >= end:
            break
        if a.pause > 0:
            time.sleep(a.pause)
    ctx.term()
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target", help="HOST:PORT of the coordinator")
    ap.add_argument("mode", choices=["burst", "idle", "partial", "noop"])
    ap.add_argument("--src", default="127.0.0.2")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--read", type=float, default=0.2)
    ap.add_argument("--pause", type=float, default=0.05)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--body", type=int, default=0)
    ap.add_argument("--pub", help="public key file: hellos carry this key")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)
    port = int(port)
    srcs = sources(a.src)
    if a.mode == "burst":
        st = burst(a, host, port, srcs)
    else:
        first, after = b"", b""
        if a.mode in ("idle", "partial"):
            first = greeting()
        if a.mode == "partial":
            after = b"\x02" + struct.pack(">Q", a.size) + os.urandom(
                min(a.body, a.size - 1))
        st = raw_holder(a, host, port, srcs, first, after)
    print(json.dumps(st))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
