# SPDX-License-Identifier: Apache-2.0
"""layout_trainer.py -- a small PyTorch trainer for tests: the model is
Net of the file given (FILE.py), trained on the worker's lent shard
(train.share_shard) with SGD.

    layout_trainer.py MODEL.py
"""
import importlib.util
import sys

import torch
import torch.nn.functional as F

import fedbox

torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("user_model", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

client = fedbox.connect()
model = mod.Net()
shard = client.shard
x = torch.from_numpy(shard.x.copy())
y = torch.from_numpy(shard.y.astype("int64"))
for task in client.tasks():
    task.load_into(model)
    opt = torch.optim.SGD(model.parameters(), lr=task.lr,
                          momentum=task.momentum)
    g = torch.Generator().manual_seed(task.seed)
    total = 0.0
    model.train()
    for _ in range(task.steps):
        idx = torch.randint(len(x), (task.batch_size,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss)
    task.finish(model.state_dict(), samples=len(x), steps=task.steps,
                loss=total / task.steps)
