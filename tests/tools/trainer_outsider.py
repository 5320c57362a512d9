# SPDX-License-Identifier: Apache-2.0
"""trainer_outsider.py -- tries to talk to a fedbox worker as its trainer.

    trainer_outsider.py SOCKET TOKEN_HEX

Connects to SOCKET, sends a trainer's hello with TOKEN_HEX, and prints what
happened, one word first:
  refused      the worker closed the connection without a welcome (exit 0)
  welcomed     the worker took us for its trainer (exit 1)
  unreachable  the socket could not be reached, with the error (exit 2)
"""
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
from fedbox import _wire  # noqa: E402


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, token = sys.argv[1], bytes.fromhex(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    try:
        s.connect(path)
    except OSError as e:
        print("unreachable %s (pid %d)" % (e.strerror or e, os.getpid()))
        return 2
    try:
        s.sendall(_wire.hello(token, os.getpid(), 1))
        body = _wire.Channel(s).recv()
    except OSError as e:
        body = None
        print("refused (%s; pid %d)" % (e, os.getpid()))
        return 0
    if body is None:
        print("refused (pid %d)" % os.getpid())
        return 0
    print("welcomed (message type %d; pid %d)" % (_wire.msg_type(body),
                                                 os.getpid()))
    return 1


if __name__ == "__main__":
    sys.exit(main())
