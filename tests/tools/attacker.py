#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""attacker -- a hostile peer for integration tests.

Speaks to a coordinator's port with python3-zmq and sends what a buggy or
malicious peer might: random bytes, random protobufs, truncated frames,
frames with missing or oversized payloads, stale rounds, out-of-order and
non-finite update chunks, and a hello with a wrong protocol version.

usage: attacker.py ENDPOINT MODE [--seconds S] [--seed N]
MODE: garbage | version | hostile
Prints one line per finding; exits 0 when it ran, 1 on unexpected answers.
"""
import argparse
import os
import random
import struct
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fbwire  # noqa: E402


def dealer(ctx, endpoint):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 2000)
    s.connect(endpoint)
    return s


def join(ctx, endpoint, name, samples, session, index=0):
    """A dealer that said hello as `name` (data index `index`, which must
    be no other worker's) and is where the coordinator wants it: a Redirect
    (coordinator lanes) is followed like a worker does."""
    s = dealer(ctx, endpoint)
    s.send(fbwire.hello(name, samples, session=session, index=index))
    if s.poll(2000):
        top = fbwire.parse_top(s.recv_multipart()[0])
        if top and top[0] == fbwire.REDIRECT:
            f = fbwire.fields(top[1])
            lane, port = f[1][0], f[2][0]
            s.close()
            s = dealer(ctx, fbwire.with_port(endpoint, port))
            s.send(fbwire.hello(name, samples, session=session, lane=lane,
                                index=index))
    return s


def random_protobuf(rng):
    out = bytearray()
    for _ in range(rng.randint(0, 6)):
        num = rng.randint(1, 20)
        wt = rng.choice([0, 1, 2, 5])
        out += fbwire.varint((num << 3) | wt)
        if wt == 0:
            out += fbwire.varint(rng.getrandbits(64))
        elif wt == 1:
            out += os.urandom(8)
        elif wt == 5:
            out += os.urandom(4)
        else:
            b = os.urandom(rng.randint(0, 40))
            out += fbwire.varint(len(b)) + b
    return bytes(out)


def garbage(endpoint, seconds, rng):
    ctx = zmq.Context()
    socks = [dealer(ctx, endpoint) for _ in range(4)]
    n = 0
    end = time.time() + seconds
    while time.time() < end:
        s = rng.choice(socks)
        kind = rng.randint(0, 5)
        if kind == 0:
            parts = [os.urandom(rng.randint(0, 300))]
        elif kind == 1:
            parts = [fbwire.PREFIX + bytes([rng.randint(0, 1)]) + random_protobuf(rng)]
        elif kind == 2:
            good = fbwire.hello("intruder-%d" % rng.randint(0, 9), 100)
            parts = [good[:rng.randint(0, len(good) - 1)]]
        elif kind == 3:
            parts = [fbwire.update_chunk(rng.randint(0, 5), 0)]  # no payload
        elif kind == 4:
            parts = [os.urandom(20) for _ in range(rng.randint(2, 5))]
        else:
            parts = [fbwire.model_fetch(rng.randint(0, 5), rng.randint(0, 1 << 31))]
        try:
            s.send_multipart(parts)
            n += 1
        except zmq.Again:
            pass
        time.sleep(0.001)
    print("garbage: sent %d messages" % n)
    for s in socks:
        s.close()
    ctx.term()
    return 0


def version(endpoint):
    ctx = zmq.Context()
    s = dealer(ctx, endpoint)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.send(fbwire.hello("time-traveller", 100, version=99))
    try:
        frames = s.recv_multipart()
    except zmq.Again:
        print("version: no answer")
        return 1
    top = fbwire.parse_top(frames[0])
    if top is None or top[0] != fbwire.REJECT:
        print("version: expected a reject, got %r" % (top,))
        return 1
    reason = fbwire.fields(top[1]).get(1, [b""])[0].decode()
    print("version: rejected: %s" % reason)
    s.close()
    ctx.term()
    return 0


def hostile(endpoint, seconds, rng):
    """Admitted peers that send well-formed but wrong update traffic.

    Three identities, each selected into rounds like any worker:
    mallory-a sends stale and missized updates, mallory-b a NaN chunk,
    mallory-c its chunks out of order; all also send bogus fetches,
    chunks without a begun update and frames whose payload flag lies.
    """
    ctx = zmq.Context()
    socks = {}
    for k, who in enumerate("abc"):
        s = join(ctx, endpoint, "mallory-" + who, 10, rng.getrandbits(63),
                 index=100 + k)
        s.setsockopt(zmq.RCVTIMEO, 50)
        socks[who] = s
    # at least `seconds`, and on until each identity has had a round to
    # attack: they are selected from the next round on, which a slow round
    # may start late, and each sees its round start in its own time
    end = time.time() + seconds
    last = end + 60
    n = 0
    attacked = set()
    while time.time() < end or (len(attacked) < len(socks) and time.time() < last):
        for who, s in socks.items():
            try:
                frames = s.recv_multipart()
            except zmq.Again:
                continue
            top = fbwire.parse_top(frames[0])
            if not top or top[0] != fbwire.ROUND_START:
                continue
            f = fbwire.fields(top[1])
            rnd, params, chunks, cbytes = f[1][0], f[2][0], f[3][0], f[4][0]
            first = min(cbytes, params * 4)
            nan = struct.pack("<f", float("nan")) * (first // 4)
            msgs = [
                [fbwire.update_chunk(rnd, 0), b"\0" * 16],   # no begin yet
                [fbwire.model_fetch(rnd, 1 << 30)],           # out of range
                [fbwire.frame(fbwire.UPDATE_CHUNK,            # flag lies
                              fbwire.field_varint(1, rnd), payload_flag=0)],
            ]
            if who == "a":
                msgs += [[fbwire.update_begin(rnd + 7, 10, params, chunks)],
                         [fbwire.update_begin(rnd, 10, params + 1, chunks)]]
            elif who == "b":
                msgs += [[fbwire.update_begin(rnd, 10, params, chunks)],
                         [fbwire.update_chunk(rnd, 0), nan]]
            else:
                msgs += [[fbwire.update_begin(rnd, 10, params, chunks)],
                         [fbwire.update_chunk(rnd, 1), b"\0" * first]]
            for m in msgs:
                s.send_multipart(m)
                n += 1
            attacked.add(who)
        for s in socks.values():
            s.send(fbwire.heartbeat())
        time.sleep(0.05)
    print("hostile: sent %d bad messages from %d identities" % (n, len(attacked)))
    for s in socks.values():
        s.close()
    ctx.term()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("mode", choices=["garbage", "version", "hostile"])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    if a.mode == "garbage":
        return garbage(a.endpoint, a.seconds, rng)
    if a.mode == "version":
        return version(a.endpoint)
    return hostile(a.endpoint, a.seconds, rng)


if __name__ == "__main__":
    sys.exit(main())
