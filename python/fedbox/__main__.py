# SPDX-License-Identifier: Apache-2.0
"""python -m fedbox -- tools for a model you bring to fedbox.

  python -m fedbox init MODEL -o FILE [--seed S]
      builds the model MODEL names and writes its initial parameters, with
      their names, shapes and dtypes, as a safetensors file: the layout of
      the federation's model, which the coordinator reads with
      `model: {arch: init, init: FILE}` (fedbox.layout_of says which
      tensors: the floating-point entries of state_dict(), parameters and
      floating buffers alike, in state_dict() order, which is also the
      order of their data in the file; integer buffers such as
      num_batches_tracked are left out: each trainer keeps its own).
      MODEL is FILE.py:NAME or MODULE:NAME, NAME a class or function that
      takes no arguments and returns an nn.Module.
  python -m fedbox layout FILE
      prints a safetensors file's tensors in the order of their data (the
      layout's order): name, dtype, shape.
"""
import argparse
import importlib
import importlib.util
import math
import os
import sys

from . import safetensors
from .client import layout_of


def _load_factory(spec):
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise SystemExit("fedbox init: MODEL must be FILE.py:NAME or "
                         "MODULE:NAME, not %r" % spec)
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise SystemExit("fedbox init: no file %s" % where)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        mod_spec = importlib.util.spec_from_file_location(
            "fedbox_user_model", where)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    if not hasattr(mod, name):
        raise SystemExit("fedbox init: %s has no %s" % (where, name))
    return getattr(mod, name)


def _init(args):
    import torch
    torch.manual_seed(args.seed)
    model = _load_factory(args.model)()
    if not isinstance(model, torch.nn.Module):
        raise SystemExit("fedbox init: %s returned a %s, not an nn.Module" %
                         (args.model, type(model).__name__))
    sd = model.state_dict()
    names = [n for n, _, _ in layout_of(sd)]
    if not names:
        raise SystemExit("fedbox init: the model has no floating-point "
                         "tensors")
    tensors = {n: sd[n] for n in names}  # data in this order: the layout's
    safetensors.save_file(tensors, args.output, {
        "fedbox.seed": str(args.seed),
        "fedbox.model": args.model,
    })
    count = sum(math.prod(t.shape) for t in tensors.values())
    print("%s: %d tensors, %d parameters" % (args.output, len(names),
                                             count))


def _layout(args):
    safetensors.metadata(args.file)  # the whole file's checks first
    with open(args.file, "rb") as f:
        import json
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    for name in sorted(header, key=lambda k: header[k]["data_offsets"]):
        h = header[name]
        print("%-40s %-5s %s" % (name, h["dtype"], h["shape"]))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m fedbox", description="tools for a model you bring "
        "to fedbox")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init", help="write a model's initial parameters "
                       "and layout as a safetensors file")
    i.add_argument("model", help="FILE.py:NAME or MODULE:NAME")
    i.add_argument("-o", "--output", required=True, help="file to write")
    i.add_argument("--seed", type=int, default=0,
                   help="torch.manual_seed before building (default 0)")
    i.set_defaults(fn=_init)
    lay = sub.add_parser("layout", help="print a safetensors file's "
                         "tensors")
    lay.add_argument("file")
    lay.set_defaults(fn=_layout)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
