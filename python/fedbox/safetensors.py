# SPDX-License-Identifier: Apache-2.0
"""fedbox.safetensors -- a small reader and writer of the safetensors format.

Debian 12 packages PyTorch (python3-torch) but not the safetensors library;
this module reads the files fedbox writes (and any other safetensors file
of the common dtypes) with the standard library and numpy:

    from fedbox.safetensors import load_file, load_numpy, metadata
    sd = load_file("runs/demo/model.safetensors")    # name -> torch.Tensor
    arrays = load_numpy("runs/demo/model.safetensors")  # name -> ndarray
    meta = metadata("runs/demo/model.safetensors")   # the __metadata__ dict

The layout: an unsigned 64-bit little-endian header length N, N bytes of
UTF-8 JSON (an object of name -> {"dtype", "shape", "data_offsets":
[begin, end]} and an optional "__metadata__" of string -> string), then the
tensors' bytes, little-endian and row-major, with offsets relative to the
end of the header. The whole file is checked before any tensor is made:
the header's size and JSON, each entry's fields, that every tensor's bytes
are its shape times its dtype's size, and that the tensors cover the data
exactly once, without gaps or overlaps. Anything else raises
SafetensorsError (a ValueError) naming the file and, where one is at
fault, the tensor.

BF16 tensors come back as torch.bfloat16 from load_file and widened
(exactly) to float32 from load_numpy, which has no bfloat16.

save_file(tensors, path, metadata=None) writes such a file from torch
tensors or numpy arrays (their bytes in the mapping's order), atomically: a
temporary file in the same folder, fsync, rename.
"""
import json
import math
import mmap
import os

import numpy as np

HEADER_MAX = 100 << 20  # bytes of JSON header accepted

# dtype name -> (numpy dtype, little-endian, or None for BF16; size)
DTYPES = {
    "BOOL": (np.dtype("?"), 1),
    "U8": (np.dtype("u1"), 1),
    "I8": (np.dtype("i1"), 1),
    "U16": (np.dtype("<u2"), 2),
    "I16": (np.dtype("<i2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (None, 2),
    "U32": (np.dtype("<u4"), 4),
    "I32": (np.dtype("<i4"), 4),
    "F32": (np.dtype("<f4"), 4),
    "U64": (np.dtype("<u8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "F64": (np.dtype("<f8"), 8),
}


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file."""


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SafetensorsError("key %r appears twice" % k)
        d[k] = v
    return d


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read_header(path, f, size):
    """(entries sorted by offset, metadata, start of data) of an open
    file of `size` bytes."""
    def bad(msg, name=None):
        where = "%s: tensor %r" % (path, name) if name else path
        return SafetensorsError("%s: %s" % (where, msg))

    head = f.read(8)
    if len(head) < 8:
        raise bad("shorter than the 8-byte header length")
    n = int.from_bytes(head, "little")
    if n > HEADER_MAX:
        raise bad("header length %d is more than %d bytes" % (n, HEADER_MAX))
    if n > size - 8:
        raise bad("header length %d runs past the end of the file (%d "
                  "bytes)" % (n, size))
    raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except SafetensorsError as e:
        raise bad("header: %s" % e)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad("header is not UTF-8 JSON: %s" % e)
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise bad("__metadata__ is not an object of strings")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise bad("entry is not an object", name)
        missing = {"dtype", "shape", "data_offsets"} - set(info)
        if missing:
            raise bad("entry lacks %s" % ", ".join(sorted(missing)), name)
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise bad("dtype %r is not one of %s" % (
                dtype, ", ".join(sorted(DTYPES))), name)
        if not isinstance(shape, list) or not all(map(_is_count, shape)):
            raise bad("shape %r is not a list of counts" % (shape,), name)
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(map(_is_count, offs)) or offs[0] > offs[1]):
            raise bad("data_offsets %r is not [begin, end]" % (offs,), name)
        want = math.prod(shape) * DTYPES[dtype][1]
        if offs[1] - offs[0] != want:
            raise bad("data_offsets %r hold %d bytes; shape %r of %s needs "
                      "%d" % (offs, offs[1] - offs[0], shape, dtype, want),
                      name)
        entries.append((offs[0], offs[1], name, dtype, shape))
    entries.sort()
    at = 0
    for begin, end, name, _, _ in entries:
        if begin != at:
            raise bad("data_offsets start at %d, where %s" % (
                begin, "the previous tensor ends at %d" % at if at
                else "the data begin at 0"), name)
        at = end
    if 8 + n + at != size:
        raise bad("the tensors cover %d bytes of data, the file holds %d" %
                  (at, size - 8 - n))
    return entries, meta, 8 + n


def _load(path, make):
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        entries, meta, start = _read_header(path, f, size)
        out = {}
        if size == start:  # no tensor bytes (empty tensors only)
            for _, _, name, dtype, shape in entries:
                out[name] = make(b"", 0, dtype, shape)
            return out
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for begin, end, name, dtype, shape in entries:
                out[name] = make(mm, start + begin, dtype, shape)
    return out


def _numpy(buf, offset, dtype, shape):
    npd, _ = DTYPES[dtype]
    count = math.prod(shape)
    if npd is None:  # BF16: the high half of a float32
        bits = np.frombuffer(buf, "<u2", count, offset).astype("<u4") << 16
        return bits.view("<f4").reshape(shape).astype(np.float32)
    return np.frombuffer(buf, npd, count, offset).reshape(shape).astype(
        npd.newbyteorder("="))


def load_numpy(path):
    """Returns {name: numpy.ndarray} (native byte order, own memory) for
    the tensors of the safetensors file at `path`. Raises SafetensorsError
    for a malformed file and OSError when it cannot be read."""
    return _load(path, _numpy)


def load_file(path, device="cpu"):
    """Returns {name: torch.Tensor} on `device` for the tensors of the
    safetensors file at `path`, like safetensors.torch.load_file. Raises
    SafetensorsError for a malformed file, OSError when it cannot be read,
    and TypeError for U16/U32/U64 tensors on a PyTorch without unsigned
    types of that width (before 2.3; Debian 12 has 1.13)."""
    import torch

    def make(buf, offset, dtype, shape):
        a = _numpy(buf, offset, dtype, shape)
        if dtype in ("U16", "U32", "U64") and not hasattr(torch, "uint16"):
            raise TypeError("%s: dtype %s: this PyTorch (%s) has no "
                            "unsigned %d-bit tensors; use load_numpy" % (
                                path, dtype, torch.__version__,
                                8 * a.itemsize))
        t = torch.from_numpy(a)
        if dtype == "BF16":
            t = t.to(torch.bfloat16)  # exact: bf16 is a float32 prefix
        return t.to(device)

    return _load(path, make)


def metadata(path):
    """Returns the file's __metadata__ (string -> string; {} when it has
    none), after the same checks as the loaders."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return _read_header(path, f, size)[1]


# numpy dtype -> safetensors name, for the writer
_NAMES = {np.dtype(d).newbyteorder("<") if np.dtype(d).itemsize > 1
          else np.dtype(d): n for n, (d, _) in DTYPES.items() if d is not None}


def _as_bytes(name, t):
    """(dtype name, shape, little-endian bytes) of a tensor or array."""
    if not isinstance(t, np.ndarray):
        import torch
        if not isinstance(t, torch.Tensor):
            raise TypeError("tensor %r is a %s, not a torch.Tensor or "
                            "numpy array" % (name, type(t).__name__))
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:  # numpy has none: its high halves
            bits = t.contiguous().view(torch.int16).numpy()
            return "BF16", list(t.shape), bits.astype("<i2").tobytes()
        t = t.contiguous().numpy()
    le = t.dtype.newbyteorder("<") if t.dtype.itemsize > 1 else t.dtype
    if le not in _NAMES:
        raise TypeError("tensor %r: dtype %s has no safetensors name" % (
            name, t.dtype))
    return _NAMES[le], list(t.shape), np.ascontiguousarray(t, le).tobytes()


def save_file(tensors, path, metadata=None):
    """Writes `tensors` ({name: torch.Tensor or numpy.ndarray}) to the
    safetensors file `path`, with `metadata` ({str: str}) as __metadata__.
    The file is complete or absent: it is written to a temporary file in
    the same folder, flushed to disk and renamed over `path`. Raises
    TypeError for a value that is not a tensor or has no safetensors dtype,
    ValueError for a name that is not a non-empty string or is
    "__metadata__", and OSError when it cannot be written."""
    path = os.fspath(path)
    header = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str)
                   for k, v in metadata.items()):
            raise TypeError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    blobs = []
    at = 0
    for name in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError("bad tensor name %r" % (name,))
        dtype, shape, data = _as_bytes(name, tensors[name])
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # data 8-byte aligned, as is usual
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, ".%s.tmp%d" % (os.path.basename(path),
                                              os.getpid()))
    try:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
