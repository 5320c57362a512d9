#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""zmtp_tap -- a transparent TCP relay that records ZeroMQ messages.

Sits between a worker and the coordinator like an on-path eavesdropper:
it forwards every byte unchanged and writes each ZMTP message it sees, per
direction, as one JSON line {"dir": "c2s"|"s2c", "t": seconds, "frames":
[hex, ...]} to the capture file. Tests replay (and tamper with) what it
captured from another connection.

usage: zmtp_tap.py LISTEN_PORT TARGET_PORT CAPTURE_FILE
"""
import json
import selectors
import socket
import sys
import time

GREETING = 64


class Parser:
    """Splits one direction's byte stream into ZMTP 3 messages."""

    def __init__(self, direction, out):
        self.dir, self.out = direction, out
        self.buf = bytearray()
        self.greeted = False
        self.frames = []

    def feed(self, data):
        self.buf += data
        if not self.greeted:
            if len(self.buf) < GREETING:
                return
            del self.buf[:GREETING]
            self.greeted = True
        while True:
            if len(self.buf) < 2:
                return
            flags = self.buf[0]
            if flags & 0x02:
                if len(self.buf) < 9:
                    return
                size, hdr = int.from_bytes(self.buf[1:9], "big"), 9
            else:
                size, hdr = self.buf[1], 2
            if len(self.buf) < hdr + size:
                return
            body = bytes(self.buf[hdr:hdr + size])
            del self.buf[:hdr + size]
            if flags & 0x04:  # a command (READY, PING, ...): not a message
                continue
            self.frames.append(body.hex())
            if not flags & 0x01:
                self.out.write(json.dumps({"dir": self.dir, "t": time.time(),
                                           "frames": self.frames}) + "\n")
                self.out.flush()
                self.frames = []


def main():
    import argparse
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:2]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("listen_port", type=int)
    ap.add_argument("target_port", type=int)
    ap.add_argument("capture_file")
    args = ap.parse_args()
    listen_port, target_port, path = args.listen_port, args.target_port, args.capture_file
    out = open(path, "w")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(8)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                cli, _ = srv.accept()
                up = socket.create_connection(("127.0.0.1", target_port))
                sel.register(cli, selectors.EVENT_READ, (up, Parser("c2s", out)))
                sel.register(up, selectors.EVENT_READ, (cli, Parser("s2c", out)))
                continue
            src = key.fileobj
            dst, parser = key.data
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        sel.unregister(s)
                    except (KeyError, ValueError):
                        pass
                    s.close()
                continue
            parser.feed(data)
            dst.sendall(data)


if __name__ == "__main__":
    main()
