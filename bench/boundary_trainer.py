# SPDX-License-Identifier: Apache-2.0
"""boundary_trainer.py -- the trainer of build/bench/trainer_boundary: it
trains nothing and answers each task with the parameters it was given.

    boundary_trainer.py views    answer with the task's own tensors (views
                                 of the shared memory: no copy here)
    boundary_trainer.py module   copy them into a torch module
                                 (task.load_into) and answer from its
                                 state_dict (finish copies them back)
"""
import os
import sys

if len(sys.argv) != 2 or sys.argv[1] not in ("views", "module"):
    print(__doc__.strip())
    sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
import torch  # noqa: E402

import fedbox  # noqa: E402


class Holder(torch.nn.Module):
    """A module with the layout's tensors as parameters."""

    def __init__(self, layout):
        super().__init__()
        self.names = []
        for name, shape, _ in layout:
            self.register_parameter(name.replace(".", "_"),
                                    torch.nn.Parameter(torch.zeros(shape)))
            self.names.append(name)

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        return {n: sd[n.replace(".", "_")] for n in self.names}


def main():
    mode = sys.argv[1]
    client = fedbox.connect()
    holder = Holder(client.layout) if mode == "module" else None
    for task in client.tasks():
        if holder is None:
            task.finish(task.state_dict(), samples=1, steps=1, loss=0.0)
        else:
            task.load_into(holder)
            task.finish(holder.state_dict(), samples=1, steps=1, loss=0.0)


if __name__ == "__main__":
    main()
