# SPDX-License-Identifier: Apache-2.0
"""fedbox_py_test.py -- tests of python/fedbox that need no worker: the
safetensors writer against the reader, `python -m fedbox init` and
`layout`, which tensors a model federates, the layout checks' messages,
the wire format's own checks, and the torchrun mend.

    PYTHONPATH=python python3 tests/tools/fedbox_py_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import fedbox  # noqa: E402
from fedbox import _wire, safetensors  # noqa: E402

try:
    import torch
except ImportError:  # numpy-only parts still run
    torch = None


class SafetensorsWriter(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_numpy_round_trip_in_given_order(self):
        d = {"b": np.arange(6, dtype=np.float32).reshape(2, 3),
             "a": np.array([1, -2], dtype=np.int64),
             "c": np.array([True, False])}
        safetensors.save_file(d, self.path("x"), {"k": "v"})
        back = safetensors.load_numpy(self.path("x"))
        self.assertEqual(list(d), ["b", "a", "c"])
        for k in d:
            np.testing.assert_array_equal(back[k], d[k])
            self.assertEqual(back[k].dtype, d[k].dtype)
        self.assertEqual(safetensors.metadata(self.path("x")), {"k": "v"})
        with open(self.path("x"), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        # The bytes follow the mapping's order, and start 8-aligned.
        self.assertEqual(n % 8, 0)
        self.assertEqual(header["b"]["data_offsets"], [0, 24])
        self.assertEqual(header["a"]["data_offsets"], [24, 40])

    @unittest.skipIf(torch is None, "no torch")
    def test_torch_bf16_round_trip(self):
        t = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
        safetensors.save_file({"t": t}, self.path("y"))
        back = safetensors.load_file(self.path("y"))["t"]
        self.assertEqual(back.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(back, t))

    def test_refusals_leave_no_file(self):
        for bad, err in (({"": np.zeros(1)}, ValueError),
                         ({"__metadata__": np.zeros(1)}, ValueError),
                         ({"x": [1.0, 2.0]}, TypeError),
                         ({"x": np.zeros(1, dtype=np.complex64)}, TypeError)):
            with self.assertRaises(err):
                safetensors.save_file(bad, self.path("z"))
        self.assertEqual(os.listdir(self.dir), [])


@unittest.skipIf(torch is None, "no torch")
class InitAndLayout(unittest.TestCase):
    def test_init_writes_the_cnn_layout(self):
        out = os.path.join(tempfile.mkdtemp(), "cnn.init")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        model = os.path.join(ROOT, "examples", "pytorch-cnn", "model.py")
        subprocess.run([sys.executable, "-m", "fedbox", "init",
                        model + ":Net", "-o", out, "--seed", "3"],
                       check=True, env=env, capture_output=True)
        with open(out, "rb") as f:  # the layout: the tensors' data order
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        header.pop("__metadata__", None)
        names = sorted(header, key=lambda k: header[k]["data_offsets"])
        self.assertEqual(names, [
            "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
            "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
        sd = safetensors.load_file(out)
        self.assertEqual(tuple(sd["fc1.weight"].shape), (256, 3136))
        # The values are the model's own initialisation for that seed.
        sys.path.insert(0, os.path.dirname(model))
        from model import Net
        torch.manual_seed(3)
        ref = Net().state_dict()
        for n in names:
            self.assertTrue(torch.equal(sd[n], ref[n]), n)
        text = subprocess.run([sys.executable, "-m", "fedbox", "layout", out],
                              check=True, env=env, capture_output=True,
                              text=True).stdout.split("\n")
        self.assertTrue(text[0].startswith("conv1.weight"))
        self.assertIn("[32, 1, 5, 5]", text[0])

    def test_integer_buffers_are_not_federated(self):
        m = torch.nn.Sequential(torch.nn.Linear(3, 4),
                                torch.nn.BatchNorm1d(4))
        names = [n for n, _, _ in fedbox.layout_of(m)]
        self.assertEqual(names, ["0.weight", "0.bias", "1.weight", "1.bias",
                                 "1.running_mean", "1.running_var"])

    def test_init_leaves_integer_buffers_out(self):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "bn.py"), "w") as f:
            f.write("import torch\n"
                    "def Net():\n"
                    "    return torch.nn.Sequential(torch.nn.Linear(3, 4),"
                    " torch.nn.BatchNorm1d(4))\n")
        out = os.path.join(d, "bn.init")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        subprocess.run([sys.executable, "-m", "fedbox", "init",
                        os.path.join(d, "bn.py") + ":Net", "-o", out],
                       check=True, env=env, capture_output=True)
        sd = safetensors.load_file(out)
        self.assertEqual(sorted(sd), ["0.bias", "0.weight", "1.bias",
                                      "1.running_mean", "1.running_var",
                                      "1.weight"])


class FakeClient(fedbox.Client):
    """A Client with a layout and no worker, for the checks."""

    def __init__(self, layout):  # noqa: D107 - no connection on purpose
        self.rank, self.world = 0, 1
        self._layout = layout


class LayoutChecks(unittest.TestCase):
    LAYOUT = [("fc1.weight", (4, 6), 0), ("fc1.bias", (4,), 24)]

    def check(self, state):
        FakeClient(self.LAYOUT)._check_model(state)

    def test_messages_name_the_tensor(self):
        ok = {"fc1.weight": np.zeros((4, 6), np.float32),
              "fc1.bias": np.zeros(4, np.float32)}
        self.check(ok)
        cases = [
            ({"fc1.weight": ok["fc1.weight"]},
             "tensor 'fc1.bias' [4] of the federation's model is not in "
             "yours"),
            (dict(ok, **{"fc1.weight": np.zeros((6, 4), np.float32)}),
             "tensor 'fc1.weight' is [4, 6] in the federation's model but "
             "[6, 4] in yours"),
            (dict(ok, **{"fc2.weight": np.zeros(3, np.float32)}),
             "your model has tensor 'fc2.weight' [3]"),
            (dict(ok, **{"fc1.bias": np.zeros(4, np.int32)}),
             "tensor 'fc1.bias' is int32 in your model"),
        ]
        for state, text in cases:
            with self.assertRaises(fedbox.LayoutError) as e:
                self.check(state)
            self.assertIn(text, str(e.exception))
        # Extra integer entries (kept local) are fine.
        self.check(dict(ok, steps=np.zeros(1, np.int64)))


class Wire(unittest.TestCase):
    def test_task_round_trip_and_refusals(self):
        body = _wire.frame(_wire.TASK, __import__("struct").pack(
            "<QIIQIddddQI", 9, 1, 4, 100, 64, 0.1, 0.9, 0.0, 0.0, 7, 2))[4:]
        t = _wire.parse_task(body)
        self.assertEqual((t["id"], t["round"], t["steps"], t["batch_size"],
                          t["worker_index"]), (9, 4, 100, 64, 2))
        with self.assertRaises(_wire.ProtocolError):
            _wire.parse_task(body[:-1])
        with self.assertRaises(_wire.ProtocolError):
            _wire.parse_task(body + b"\0")

    def test_fail_reason_is_bounded(self):
        f = _wire.fail(1, True, "x" * 10000)
        self.assertLess(len(f), 4100)


class SentClient(FakeClient):
    """A FakeClient that keeps what it would send."""

    def __init__(self):  # noqa: D107
        super().__init__([])
        self.sent = []

    def _send(self, data):
        self.sent.append(data)


def _task(client, kind=1):
    return fedbox.Task(client, dict(
        id=5, kind=kind, round=3, steps=10, batch_size=8, lr=0.1,
        momentum=0.0, weight_decay=0.0, prox_mu=0.0, seed=1,
        worker_index=0))


class ReportEval(unittest.TestCase):
    def test_report_goes_out_as_the_worker_reads_it(self):
        import struct
        c = SentClient()
        t = _task(c)
        t.report_eval(examples=250, loss=0.5, accuracy=0.75, f1=0.6)
        self.assertEqual(len(c.sent), 1)
        body = c.sent[0][4:]
        self.assertEqual(_wire.msg_type(body), _wire.EVAL)
        r = _wire._Reader(body, 4)
        self.assertEqual(r.take("<QQddI"), (5, 250, 0.5, 0.75, 1))
        self.assertEqual((r.string(), r.take("<d")), ("f1", 0.6))
        r.done()
        self.assertFalse(t.done)  # a training task: finish still due
        with self.assertRaises(fedbox.TrainerError):
            t.report_eval(examples=1, loss=0.5)  # once per task
        # no accuracy (regression) travels as NaN
        c2 = SentClient()
        _task(c2).report_eval(examples=3, loss=1.0)
        v = struct.unpack_from("<QQddI", c2.sent[0], 8)
        self.assertTrue(v[3] != v[3])

    def test_bad_reports_are_refused_before_sending(self):
        bad = [dict(examples=0, loss=1.0), dict(examples=2.5, loss=1.0),
               dict(examples=True, loss=1.0),
               dict(examples=3, loss=float("nan")),
               dict(examples=3, loss=1.0, accuracy=1.5),
               dict(examples=3, loss=1.0, **{"a" * 32: 1.0}),
               dict(examples=3, loss=1.0, **{'q"': 1.0}),
               dict(examples=3, loss=1.0, m=float("inf")),
               dict(examples=3, loss=1.0,
                    **{"m%d" % i: 0.0 for i in range(9)}),
               dict(loss=1.0)]
        for kw in bad:
            c = SentClient()
            with self.assertRaises(ValueError, msg=str(kw)):
                _task(c).report_eval(**kw)
            self.assertEqual(c.sent, [])

    def test_an_evaluate_only_task_ends_with_its_report(self):
        c = SentClient()
        t = _task(c, kind=_wire.EVALUATE)
        self.assertTrue(t.evaluate_only)
        t.report_eval(examples=10, loss=0.1, accuracy=0.9)
        self.assertTrue(t.done)

    @unittest.skipIf(torch is None, "no torch")
    def test_evaluate_is_the_plain_computation(self):
        import torch.nn.functional as F
        torch.manual_seed(0)
        net = torch.nn.Linear(6, 3)
        x, y = torch.randn(2500, 6), torch.randint(0, 3, (2500,))
        got = fedbox.evaluate(net, x, y, batch_size=700)
        with torch.no_grad():
            out = net(x)
        self.assertEqual(got["examples"], 2500)
        self.assertAlmostEqual(got["loss"], float(F.cross_entropy(out, y)),
                               places=5)
        self.assertEqual(got["accuracy"],
                         int((out.argmax(1) == y).sum()) / 2500)
        self.assertTrue(net.training)  # left as it was


@unittest.skipIf(torch is None, "no torch")
class Torchrun(unittest.TestCase):
    def test_redirects_parse(self):
        from fedbox import torchrun
        torchrun._mend_std()
        from torch.distributed.elastic.multiprocessing import api
        self.assertEqual(api.Std.from_str("0"), api.Std.NONE)
        self.assertEqual(api.Std.from_str("3"), api.Std.ALL)
        self.assertEqual(api.Std.from_str("0:1,1:3"),
                         {0: api.Std.OUT, 1: api.Std.ALL})


if __name__ == "__main__":
    unittest.main(verbosity=2)
