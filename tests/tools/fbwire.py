# SPDX-License-Identifier: Apache-2.0
"""fbwire -- a tiny, independent encoder of fedbox wire frames for tests.

It writes protobuf by hand (varints and length-delimited fields) from the
field numbers in proto/fedbox.proto, so tests can build valid, subtly wrong
and random frames without the product's code.
"""
import os
import re
import struct

# The protocol version the C code speaks (proto/proto.h), so that a bump
# there does not turn these tools' hellos into version mismatches.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                       "proto", "proto.h")) as _f:
    PROTOCOL_VERSION = int(re.search(r"#define FB_PROTOCOL_VERSION (\d+)",
                                     _f.read()).group(1))

PREFIX = b"FB\x01"

# Envelope body field numbers (proto/fedbox.proto).
HELLO, WELCOME, REJECT, ROUND_START, MODEL_FETCH, MODEL_CHUNK = 1, 2, 3, 4, 5, 6
UPDATE_BEGIN, UPDATE_CHUNK, HEARTBEAT, ROUND_CANCEL, SHUTDOWN = 7, 8, 9, 10, 11
REDIRECT, UPDATE_CREDIT = 15, 16
WITH_PAYLOAD = {MODEL_CHUNK, UPDATE_CHUNK}


def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint((num << 3) | 2) + varint(len(b)) + b


def field_double(num, v):
    return varint((num << 3) | 1) + struct.pack("<d", v)


def frame(body_field, body, payload_flag=None):
    """Frame 0: prefix, flags byte, Envelope{body_field: body}."""
    flag = payload_flag if payload_flag is not None else int(body_field in WITH_PAYLOAD)
    return PREFIX + bytes([flag]) + field_bytes(body_field, body)


def hello(name, samples=1000, version=PROTOCOL_VERSION, index=0, session=1,
          lane=0, partitions=0):
    b = (field_varint(1, version) + field_bytes(2, name) + field_varint(3, index)
         + field_varint(4, samples) + field_bytes(5, "test") + field_bytes(6, "fbwire")
         + field_varint(7, session) + (field_varint(8, lane) if lane else b"")
         + (field_varint(9, partitions) if partitions else b""))
    return frame(HELLO, b)


def with_port(endpoint, port):
    """tcp://HOST:PORT with another port."""
    return endpoint.rsplit(":", 1)[0] + ":%d" % port


def model_fetch(rnd, chunk):
    return frame(MODEL_FETCH, field_varint(1, rnd) + field_varint(2, chunk))


def update_begin(rnd, samples, params, chunks, steps=1, loss=1.0):
    b = (field_varint(1, rnd) + field_varint(2, samples) + field_varint(3, params)
         + field_varint(4, chunks) + field_varint(5, steps) + field_double(6, loss)
         + field_double(7, 0.1) + field_bytes(8, "attacker"))
    return frame(UPDATE_BEGIN, b)


def update_chunk(rnd, chunk):
    return frame(UPDATE_CHUNK, field_varint(1, rnd) + field_varint(2, chunk))


def heartbeat(rnd=0):
    return frame(HEARTBEAT, field_varint(1, rnd))


def parse_top(data):
    """Returns (body_field, body_bytes) of a frame 0, or None."""
    if len(data) < 4 or data[:3] != PREFIX:
        return None
    i, d = 0, data[4:]
    key, i = _read_varint(d, i)
    if key & 7 != 2:
        return None
    ln, i = _read_varint(d, i)
    return key >> 3, d[i:i + ln]


def fields(body):
    """Decodes one protobuf message into {field: [values]} (varints, bytes)."""
    out, i = {}, 0
    while i < len(body):
        key, i = _read_varint(body, i)
        wt = key & 7
        if wt == 0:
            v, i = _read_varint(body, i)
        elif wt == 2:
            ln, i = _read_varint(body, i)
            v, i = body[i:i + ln], i + ln
        elif wt == 1:
            v, i = body[i:i + 8], i + 8
        elif wt == 5:
            v, i = body[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(key >> 3, []).append(v)
    return out


def _read_varint(d, i):
    v = shift = 0
    while True:
        b = d[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i
