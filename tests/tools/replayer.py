#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""replayer -- replays and tampers with captured worker traffic.

Reads a capture written by zmtp_tap.py and sends its worker-to-coordinator
messages again from a connection of its own, as an on-path attacker who
recorded a real worker's traffic would:

  replay        every captured message, unchanged (a replay)
  replay-recent the messages of the last --seconds only (same round)
  flip-header   one bit flipped in the sealed header (run id, sender, seq)
  flip-body     one bit flipped in the sealed ciphertext and in the MAC
  flip-payload  one bit flipped in each payload chunk
  flip-trailer  one bit flipped near the end of each message (signatures
                and stream trailers live there)
  truncate      payload chunks cut short, and a stream sent without its end
  hello         the captured handshake messages in clear (cookie requests
                and signed hellos), as if from that worker; then it
                listens a while and counts what comes back: cookies
                (anyone may ask for one), handshake replies (a hello
                answered: what a fresh coordinator cookie prevents) and
                refusals

usage: replayer.py ENDPOINT CAPTURE ATTACK [--seconds S]
Prints how many messages it sent (and, for hello, the answers).
"""
import argparse
import json
import sys
import time

import zmq

import fbwire

HANDSHAKE, REJECT = 12, 3


def load(path, since=None):
    msgs = []
    for line in open(path):
        d = json.loads(line)
        if d["dir"] != "c2s":
            continue
        if since is not None and d["t"] < since:
            continue
        msgs.append([bytes.fromhex(f) for f in d["frames"]])
    return msgs


def flip(b, i):
    b = bytearray(b)
    i = i % len(b)
    b[i] ^= 0x10
    return bytes(b)


def sealed(m):
    return len(m[0]) > 4 and m[0][:2] == b"FB" and m[0][3] & 0x02


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("capture")
    ap.add_argument("attack")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    since = time.time() - a.seconds if a.attack == "replay-recent" else None
    msgs = load(a.capture, since)
    out = []
    for m in msgs:
        if a.attack in ("replay", "replay-recent"):
            out.append(m)
        elif a.attack == "flip-header" and sealed(m):
            # prefix 4 bytes, then the sealed header: run id at 4..20,
            # sender at 24, sequence at 28.
            for off in (4 + 8, 4 + 24, 4 + 28):
                out.append([flip(m[0], off)] + m[1:])
        elif a.attack == "flip-body" and sealed(m):
            out.append([flip(m[0], 4 + 40)] + m[1:])
            out.append([flip(m[0], len(m[0]) - 1)] + m[1:])
        elif a.attack == "flip-payload" and len(m) == 2:
            out.append([m[0], flip(m[1], len(m[1]) // 2)])
        elif a.attack == "flip-trailer" and sealed(m):
            out.append([flip(m[0], len(m[0]) - 40)] + m[1:])
        elif a.attack == "truncate":
            if len(m) == 2:
                out.append([m[0], m[1][: len(m[1]) // 2]])
            else:
                out.append(m)
        elif a.attack == "hello" and not sealed(m):
            out.append(m)
    if a.attack == "truncate":
        # An update stream without its last chunk and its end.
        ends = [i for i, m in enumerate(msgs) if len(m) == 2]
        if ends:
            out += msgs[: ends[-1]]
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 500)
    s.setsockopt(zmq.SNDTIMEO, 2000)
    s.connect(a.endpoint)
    n = 0
    for m in out:
        try:
            s.send_multipart(m)
            n += 1
        except zmq.Again:
            break
    answers = {"cookies": 0, "replies": 0, "refusals": 0, "other": 0}
    end = time.time() + (1.5 if a.attack == "hello" else 0.3)
    while time.time() < end:
        if not s.poll(50):
            continue
        top = fbwire.parse_top(s.recv_multipart()[0])
        if top is not None and top[0] == HANDSHAKE:
            data = fbwire.fields(top[1]).get(1, [b""])[0]
            key = {32: "cookies", 152: "replies"}.get(len(data), "other")
            answers[key] += 1
        elif top is not None and top[0] == REJECT:
            answers["refusals"] += 1
        else:
            answers["other"] += 1
    s.close()
    ctx.term()
    print("%s: sent %d of %d captured messages" % (a.attack, n, len(msgs)))
    if a.attack == "hello":
        print("hello: %d sent in clear; answers: %d cookies, %d replies, "
              "%d refusals, %d other" % (len(out), answers["cookies"],
                                          answers["replies"],
                                          answers["refusals"],
                                          answers["other"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
