# SPDX-License-Identifier: Apache-2.0
"""python -m fedbox.torchrun -- torchrun, working on Debian 12 as well.

Takes torchrun's arguments and runs torch.distributed.run. On PyTorch
before 2.0 under Python 3.11 and later (Debian 12's python3-torch 1.13),
torchrun fails at start with "AttributeError: 'NoneType' object has no
attribute 'get'": its --redirects and --tee parser looks for the enum
member 0 by iterating the Std flag enum, which Python 3.11 no longer
yields. This module mends that parser first, and changes nothing on a
PyTorch that does not need it.

    python3 -m fedbox.torchrun --standalone --nproc_per_node 2 train.py
"""
import sys


def _mend_std():
    from torch.distributed.elastic.multiprocessing import api
    std = api.Std
    if std.from_str("0") is not None:
        return  # this PyTorch parses it fine
    by_value = {0: std.NONE, 1: std.OUT, 2: std.ERR, 3: std.ALL}

    def one(v):
        if not v.strip().isdigit() or int(v) not in by_value:
            raise ValueError("%r is not 0, 1, 2 or 3" % v)
        return by_value[int(v)]

    def from_str(cls, vm):
        """"N" -> a Std for every rank; "R:N,R:N" -> {rank: Std}."""
        if ":" not in vm:
            return one(vm)
        out = {}
        for item in vm.split(","):
            rank, _, v = item.partition(":")
            out[int(rank)] = one(v)
        return out

    std.from_str = classmethod(from_str)


def main():
    _mend_std()
    from torch.distributed import run
    sys.argv[0] = "torchrun"
    run.main()


if __name__ == "__main__":
    main()
