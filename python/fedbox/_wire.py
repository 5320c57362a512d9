# SPDX-License-Identifier: Apache-2.0
"""fedbox._wire -- the messages between a fedbox worker and its trainer.

The other side of worker/proc/proc_impl.h, which documents the format: a
4-byte little-endian body length, then a body that starts with a 4-byte
type. Integers and doubles are little-endian; strings are a 2-byte length
and UTF-8 bytes. The parameters never travel here: they lie in shared
memory whose file descriptor comes with the welcome (SCM_RIGHTS).

Internal to the package (its names may change); tests use it to speak the
protocol wrongly on purpose.
"""
import array
import math
import socket
import struct

MAGIC = 0x50544246  # "FBTP"
VERSION = 2  # 2: EVAL
MSG_MAX = 16 << 20
TOKEN_LEN = 32

HELLO, WELCOME, TASK, RESULT, FAIL, BYE, EVAL = 1, 2, 3, 4, 5, 6, 7
F32, U8, I32 = 1, 2, 3
TRAIN, EVALUATE = 1, 2  # task kinds

DTYPE_NAMES = {F32: "float32", U8: "uint8", I32: "int32"}


class ProtocolError(ConnectionError):
    """The worker sent something this package cannot read."""


class _Reader:
    def __init__(self, body, at=0):
        self.body = body
        self.at = at

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.body):
            raise ProtocolError("message from the worker is truncated")
        v = struct.unpack_from(fmt, self.body, self.at)
        self.at += size
        return v if len(v) > 1 else v[0]

    def string(self):
        n = self.take("<H")
        if self.at + n > len(self.body):
            raise ProtocolError("message from the worker is truncated")
        s = bytes(self.body[self.at:self.at + n]).decode("utf-8")
        self.at += n
        return s

    def done(self):
        if self.at != len(self.body):
            raise ProtocolError("message from the worker has %d extra "
                                "bytes" % (len(self.body) - self.at))


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


def frame(type_, payload=b""):
    """One message: length, type, payload."""
    body = struct.pack("<I", type_) + payload
    return struct.pack("<I", len(body)) + body


def pack_layout(layout):
    """A layout table from (name, shape, offset) triples (all F32)."""
    out = [struct.pack("<I", len(layout))]
    for name, shape, offset in layout:
        out.append(_str(name))
        out.append(struct.pack("<BB", F32, len(shape)))
        out.append(struct.pack("<%dQ" % len(shape), *shape))
        out.append(struct.pack("<Q", offset))
    return b"".join(out)


def read_layout(r):
    """[(name, shape tuple, offset)] from a reader."""
    n = r.take("<I")
    out = []
    for _ in range(n):
        name = r.string()
        dtype, ndim = r.take("<BB")
        if dtype != F32 or not 1 <= ndim <= 4:
            raise ProtocolError("tensor %r in the worker's layout has "
                                "dtype %d, rank %d" % (name, dtype, ndim))
        shape = r.take("<%dQ" % ndim)
        shape = (shape,) if ndim == 1 else tuple(shape)
        out.append((name, shape, r.take("<Q")))
    return out


def hello(token, pid, world, examples=0):
    return frame(HELLO, struct.pack("<II", MAGIC, VERSION) + token +
                 struct.pack("<IIQ", pid, world, examples))


def result(task_id, examples, steps, loss, a_norm, seconds, param_count,
           layout):
    a = float("nan") if a_norm is None else float(a_norm)
    return frame(RESULT, struct.pack("<QQQdddQ", task_id, examples, steps,
                                     loss, a, seconds, param_count) +
                 pack_layout(layout))


def evaluation(task_id, examples, loss, accuracy, metrics):
    """EVAL: the task's global model on the trainer's validation data;
    metrics is [(name, value)]."""
    a = float("nan") if accuracy is None else float(accuracy)
    out = [struct.pack("<QQddI", task_id, examples, loss, a, len(metrics))]
    for name, value in metrics:
        out.append(_str(name) + struct.pack("<d", value))
    return frame(EVAL, b"".join(out))


def fail(task_id, fatal, reason):
    b = reason.encode("utf-8", "replace")[:4000]
    return frame(FAIL, struct.pack("<QBH", task_id, 1 if fatal else 0,
                                   len(b)) + b)


def parse_welcome(body):
    r = _Reader(body, 4)
    version, param_count = r.take("<IQ")
    if version != VERSION:
        raise ProtocolError("the worker speaks trainer protocol %d, this "
                            "package %d: use the python/fedbox of the same "
                            "fedbox" % (version, VERSION))
    layout = read_layout(r)
    params_len = r.take("<Q")
    device = r.string()
    shard = None
    if r.take("<B"):
        count, dim, classes, ydt = r.take("<IIIB")
        if ydt not in (U8, I32, F32):
            raise ProtocolError("shard labels of dtype %d" % ydt)
        shard = {"count": count, "dim": dim, "classes": classes,
                 "y_dtype": DTYPE_NAMES[ydt]}
    r.done()
    return {"param_count": param_count, "layout": layout,
            "params_len": params_len, "device": device, "shard": shard}


TASK_FIELDS = ("id", "kind", "round", "steps", "batch_size", "lr",
               "momentum", "weight_decay", "prox_mu", "seed",
               "worker_index")


def parse_task(body):
    r = _Reader(body, 4)
    v = r.take("<QIIQIddddQI")
    r.done()
    t = dict(zip(TASK_FIELDS, v))
    for k in ("lr", "momentum", "weight_decay", "prox_mu"):
        if not math.isfinite(t[k]):
            raise ProtocolError("task field %s is %r" % (k, t[k]))
    return t


def msg_type(body):
    if len(body) < 4:
        raise ProtocolError("empty message from the worker")
    return struct.unpack_from("<I", body)[0]


class Channel:
    """A connected socket that sends and receives whole messages."""

    def __init__(self, sock):
        self.sock = sock
        self.fds = []  # received with the last message

    def send(self, data):
        self.sock.sendall(data)

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            want = n - len(buf)
            fds = array.array("i")
            data, anc, _, _ = self.sock.recvmsg(
                want, socket.CMSG_SPACE(4 * fds.itemsize))
            for level, type_, cdata in anc:
                if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[:len(cdata) - len(cdata) %
                                        fds.itemsize])
                    self.fds.extend(fds)
            if not data:
                return None
            buf += data
        return bytes(buf)

    def recv(self):
        """The next message's body, or None when the worker closed."""
        self.fds = []
        head = self._recv_exact(4)
        if head is None:
            return None
        (n,) = struct.unpack("<I", head)
        if n > MSG_MAX or n < 4:
            raise ProtocolError("message of %d bytes from the worker" % n)
        body = self._recv_exact(n)
        if body is None:
            return None
        return body
