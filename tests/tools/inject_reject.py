#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""inject_reject -- an on-path attacker that forges a coordinator's REJECT.

A TCP relay between one worker and the coordinator, like zmtp_tap.py: it
forwards both directions, splitting the coordinator-to-worker stream into
ZMTP frames so that it can slip a frame of its own in between two
messages. The forged frame is a plaintext fedbox REJECT of a few dozen
bytes, written as an attacker who knows the format would (with fbwire's
independent encoder); no key signs it.

  before   one REJECT ahead of anything the coordinator sends: its messages
           are held back from the ZMTP handshake until the forgery has
           gone, 0.2 s later (no session can exist yet)
  session  --count REJECTs, one every --every seconds, starting once the
           coordinator has sent --after sealed messages (the first sealed
           one is the Welcome: the session exists and is in use)

Each injection is printed ("injected N at T") as it happens.

usage: inject_reject.py LISTEN_PORT TARGET_PORT MODE [--after N]
                        [--count N] [--every S] [--reason TEXT]
"""
import argparse
import os
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fbwire  # noqa: E402

GREETING = 64
REJECT = 3


def forged_reject(reason):
    body = fbwire.field_bytes(1, reason) + fbwire.field_varint(
        2, fbwire.PROTOCOL_VERSION)
    msg = fbwire.frame(REJECT, body)
    assert len(msg) < 256
    return bytes([0x00, len(msg)]) + msg  # one short, final ZMTP frame


class Downstream:
    """The coordinator-to-worker byte stream, forwarded frame by frame."""

    def __init__(self, args):
        self.a = args
        self.buf = bytearray()
        self.greeting = 0       # greeting bytes passed on (64 in all)
        self.ready = False      # the coordinator's READY command went by
        self.boundary = True    # the last frame ended a message
        self.first = True       # next frame is frame 0 of a message
        self.sealed = 0         # sealed messages seen
        self.injected = 0
        self.next_at = 0.0
        self.ready_at = 0.0
        self.held = bytearray() # mode before: messages not passed on yet

    def due(self):
        if not (self.ready and self.boundary) or self.injected >= self.a.count:
            return False
        if self.a.mode == "before":
            return time.time() >= self.ready_at + 0.2
        return self.sealed >= self.a.after and time.time() >= self.next_at

    def tick(self):
        """Returns the bytes to send on now: a forgery when one is due (at
        a message boundary: whole frames only are passed on), then in
        mode before what was held back."""
        out = bytearray()
        if self.due():
            out += forged_reject(self.a.reason)
            self.injected += 1
            self.next_at = time.time() + self.a.every
            print("injected %d at %.3f" % (self.injected, time.time()),
                  flush=True)
        if self.held and (self.a.mode != "before" or self.injected > 0):
            out += self.held
            self.held = bytearray()
        return bytes(out)

    def feed(self, data):
        """Returns the bytes to send on, with forged frames in between."""
        self.buf += data
        out = bytearray()
        if self.greeting < GREETING:
            # Passed on at once: the two sides exchange the greeting's
            # first bytes before they send the rest.
            n = min(GREETING - self.greeting, len(self.buf))
            out += self.buf[:n]
            del self.buf[:n]
            self.greeting += n
            if self.greeting < GREETING:
                return bytes(out)
        while len(self.buf) >= 2:
            flags = self.buf[0]
            if flags & 0x02:
                if len(self.buf) < 9:
                    break
                size, hdr = int.from_bytes(self.buf[1:9], "big"), 9
            else:
                size, hdr = self.buf[1], 2
            if len(self.buf) < hdr + size:
                break
            body = bytes(self.buf[hdr:hdr + size])
            frame = self.buf[:hdr + size]
            del self.buf[:hdr + size]
            if flags & 0x04:  # a command (READY, ...)
                out += frame
                if not self.ready:
                    self.ready, self.ready_at = True, time.time()
                continue
            if self.first and len(body) >= 4 and body[:2] == b"FB" \
                    and body[3] & 0x02:
                self.sealed += 1
            self.first = not flags & 0x01
            self.boundary = self.first
            if self.a.mode == "before" and self.injected == 0:
                self.held += frame
            else:
                out += frame
        return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen", type=int)
    ap.add_argument("target", type=int)
    ap.add_argument("mode", choices=("before", "session"))
    ap.add_argument("--after", type=int, default=1)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--every", type=float, default=0.0)
    ap.add_argument("--reason", default="this worker is not on the allowlist")
    a = ap.parse_args()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", a.listen))
    srv.listen(8)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    streams = {}  # worker socket -> its Downstream
    while True:
        for key, _ in sel.select(timeout=0.05):
            if key.data is None:
                cli, _ = srv.accept()
                up = socket.create_connection(("127.0.0.1", a.target))
                down = Downstream(a)
                streams[cli] = down
                sel.register(cli, selectors.EVENT_READ, (up, None))
                sel.register(up, selectors.EVENT_READ, (cli, down))
                continue
            src = key.fileobj
            dst, down = key.data
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    streams.pop(s, None)
                    try:
                        sel.unregister(s)
                    except (KeyError, ValueError):
                        pass
                    s.close()
                continue
            if down is not None:
                data = down.feed(data)
            try:
                dst.sendall(data)
            except OSError:
                pass
        # Forgeries go out on their own, between two messages (never in
        # the read that brings the coordinator's READY: libzmq may then
        # stall the connection).
        for cli, down in list(streams.items()):
            data = down.tick()
            if data:
                try:
                    cli.sendall(data)
                except OSError:
                    pass


if __name__ == "__main__":
    main()
