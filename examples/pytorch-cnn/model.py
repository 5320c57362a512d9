# SPDX-License-Identifier: Apache-2.0
"""model.py -- the pytorch-cnn example's network: a small CNN for 28 x 28
grey images in 10 classes (Fashion-MNIST).

conv 5x5 (32) - ReLU - max-pool 2 - conv 5x5 (64) - ReLU - max-pool 2 -
dropout - linear 3136 -> 256 - ReLU - dropout - linear 256 -> 10.
857,738 parameters in 8 tensors. Its inputs are the worker's preprocessed
rows of 784 floats, (pixel / 255 - 0.2860) / 0.3530, row-major.

The coordinator knows it by its layout and initial values alone, from
`python -m fedbox init examples/pytorch-cnn/model.py:Net -o FILE`; fedbox
checks the trainer's tensors against that layout every round.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # the worker's Fashion-MNIST preprocessing


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 256)
        self.fc2 = nn.Linear(256, 10)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.drop(torch.flatten(x, 1))
        x = self.drop(F.relu(self.fc1(x)))
        return self.fc2(x)
