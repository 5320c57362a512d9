# SPDX-License-Identifier: Apache-2.0
"""fedbox -- the Python side of fedbox (pure Python: numpy, and torch).

Bring your own PyTorch model to a federation: a fedbox worker whose config
sets ``train.command`` runs your script as its *trainer*, and the script
takes each round's local training from this package::

    import fedbox

    client = fedbox.connect()
    model = Net().to(client.device)
    for task in client.tasks():
        task.load_into(model)
        task.report_eval(**fedbox.evaluate(model, val_x, val_y))  # optional
        if task.evaluate_only:  # the run's final evaluation: no training
            continue
        ...  # train task.steps steps with task.lr, task.momentum, ...
        task.finish(model.state_dict(), samples=n, steps=s, loss=l)

See fedbox.client (connect, Client, Task) for the whole loop, torchrun and
the rules for layouts (fedbox.layout_of: float tensors, buffers included,
are federated; integer buffers stay with each box); ``python -m fedbox
init`` writes a model's initial parameters and layout as a safetensors
file, from which the coordinator knows the model without its code
(``model: {arch: init, init: FILE}``).

fedbox.safetensors reads and writes safetensors files (the exported
model.safetensors, initial models) without the safetensors package, which
Debian 12 does not ship.
"""
from .client import (Client, LayoutError, Shard, Task, TrainerError,
                     connect, evaluate, layout_of)

__all__ = ["connect", "Client", "Task", "Shard", "LayoutError",
           "TrainerError", "layout_of", "evaluate"]
