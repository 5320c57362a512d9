# SPDX-License-Identifier: Apache-2.0
"""fedbox -- Python helpers for fedbox models and runs (pure Python).

fedbox.safetensors reads the model files the coordinator exports
(model.safetensors) into PyTorch tensors or numpy arrays without the
safetensors package, which Debian 12 does not ship.
"""
