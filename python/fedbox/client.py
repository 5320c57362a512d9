# SPDX-License-Identifier: Apache-2.0
"""fedbox.client -- the trainer's side of a fedbox worker.

A fedbox worker whose config sets ``train.command`` starts that program as
its *trainer* and hands it each round's local training. This module is what
the program uses to take the work::

    import fedbox

    client = fedbox.connect()               # from the worker's environment
    model = Net().to(client.device)
    for task in client.tasks():             # one per round; blocks between
        task.load_into(model)               # the global model, into yours
        task.report_eval(**fedbox.evaluate(model, val_x, val_y))  # optional
        if task.evaluate_only:              # the run's final evaluation
            continue
        opt = torch.optim.SGD(model.parameters(), lr=task.lr,
                              momentum=task.momentum)
        ... train task.steps steps of task.batch_size examples ...
        task.finish(model.state_dict(), samples=len(train_set),
                    steps=task.steps, loss=mean_loss)

The worker keeps everything that protects the update (its keys, signing,
encryption, clipping, secure-aggregation masks): the trainer gets the
global parameters and the task, and returns its parameters. The worker
forms the update (global minus yours), so return the parameters after
training, not a difference.

Federated evaluation: before training, evaluate the global model you just
loaded on this box's own validation data and hand the result to
``task.report_eval`` (examples, loss, accuracy, and any scalar metrics of
yours as keywords). The coordinator writes the sample-weighted means of
all workers' reports into each round's metrics line (``fed_eval``).

The parameters live in shared memory that the worker maps too: the task's
tensors are views of it (no copy, no pickle), and ``finish`` writes your
parameters back into it. The worker checks what comes back (layout, size,
NaN) and treats anything wrong as a failed local training for that round.

Only numpy is needed to import this module; torch is imported when a torch
method is first used.
"""
import ctypes
import faulthandler
import math
import mmap
import os
import signal
import socket
import sys
import time
import traceback
import warnings

import numpy as np

from . import _wire

__all__ = ["connect", "Client", "Task", "Shard", "LayoutError",
           "TrainerError", "layout_of", "evaluate"]

METRICS_MAX = 8       # named metrics in one report
METRIC_NAME_MAX = 31  # bytes of a metric's name (UTF-8)


class TrainerError(RuntimeError):
    """Something the trainer did that fedbox cannot go on with."""


class LayoutError(TrainerError):
    """Your model's tensors differ from the federation's model: a name, a
    shape, a tensor missing or one too many. The message names the first
    tensor that differs."""


def _torch():
    import torch
    return torch


def _dist_world():
    """(rank, world size) of torch.distributed, or (0, 1) without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    rank = int(os.environ.get("RANK", "0"))
    return rank, world


def _dist_ready():
    torch = _torch()
    return torch.distributed.is_available() and \
        torch.distributed.is_initialized()


def layout_of(model_or_state_dict):
    """The tensors fedbox federates for a model: ``[(name, shape, dtype)]``
    in ``state_dict()`` order.

    The rule for what is federated, the same on every side (this function,
    ``python -m fedbox init``, the coordinator reading the init file, and
    :meth:`Task.load_into` / :meth:`Task.finish`):

    * every floating-point entry of ``state_dict()`` is in the layout:
      parameters, and floating buffers such as BatchNorm's
      ``running_mean`` and ``running_var``, which are averaged across
      boxes like parameters (weighted by samples, as FedAvg does);
    * integer and bool entries (BatchNorm's ``num_batches_tracked``) are
      not: each box's trainer keeps its own, ``load_into`` leaves them as
      they are and ``finish`` ignores them;
    * every federated tensor travels as float32, whatever its dtype in
      your model (float16, bfloat16 and float64 are converted both ways).

    ``python -m fedbox init`` writes this layout, with the initial values,
    as a safetensors file."""
    sd = model_or_state_dict
    if hasattr(sd, "state_dict") and callable(sd.state_dict):
        sd = _unwrap(sd).state_dict()
    out = []
    for name, t in sd.items():
        if _is_float(t):
            out.append((name, tuple(t.shape), str(t.dtype).replace(
                "torch.", "")))
    return out


def _is_float(t):
    if isinstance(t, np.ndarray):
        return np.issubdtype(t.dtype, np.floating)
    return bool(getattr(t, "is_floating_point", lambda: False)())


def _unwrap(model):
    """The module inside DistributedDataParallel / DataParallel wrappers."""
    while hasattr(model, "module") and type(model).__name__ in (
            "DistributedDataParallel", "DataParallel"):
        model = model.module
    return model


def _shape_text(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


class Shard:
    """The worker's own shard of a shared data set, lent read-only.

    Only in simulations: when the worker's config sets
    ``train.share_shard: true`` (``scripts/fedbox-local`` does), the worker
    splits the data set as its ``data.*`` keys say (e.g. Dirichlet label
    skew) and lends its part here, so that every trainer of a simulated
    federation trains on the split the worker weighs its update by. On a
    real box your script loads the box's own data instead.

    Attributes:
        x: numpy float32 array ``[count, dim]``, preprocessed by the
            worker (Fashion-MNIST: ``(pixel / 255 - 0.2860) / 0.3530``,
            784 features per image, row-major 28 x 28). Read-only.
        y: numpy array ``[count]``: class labels (uint8 or int32), or
            float32 targets for regression.
        classes: number of classes (0 for regression).
    """

    def __init__(self, x, y, classes):
        self.x = x
        self.y = y
        self.classes = classes

    def __len__(self):
        return int(self.x.shape[0])

    def torch(self):
        """``(x, y)`` as torch tensors, x sharing the memory (read-only:
        do not write to it); class labels as int64, as cross_entropy
        wants (regression targets stay float32)."""
        torch = _torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only memory, on purpose
            x = torch.from_numpy(self.x)
        y = self.y.astype(np.float32 if self.y.dtype.kind == "f" else
                          np.int64)
        return x, torch.from_numpy(y)


class Task:
    """One round's local training, handed over by the worker.

    Attributes (the round's settings, from the coordinator's config):
        round: the round number (1, 2, ...).
        steps: optimizer steps to run. Under the coordinator's
            ``time_budget`` policy these are the steps it fitted to this
            box's measured speed.
        batch_size: examples per step for the whole box (under torchrun,
            split it across the ranks).
        lr, momentum, weight_decay: the SGD settings of the round.
        prox_mu: FedProx's proximal weight (0: off); add
            ``prox_mu / 2 * ||w - w_global||^2`` to your loss when > 0.
        seed: the federation's seed, for a reproducible batch order.
        worker_index: this box's data index (``data.index``).
        evaluate_only: True for the run's final evaluation (the
            coordinator's ``evaluation.federated_final``): load the model,
            call :meth:`report_eval` and go on; do not train. Reporting
            ends such a task (no :meth:`finish`); a script that ignores the
            flag and trains and finishes is accepted too (its parameters
            are not used).
        hparams: all of the above as a dict.

    Under torchrun every rank gets the task; only rank 0 holds the
    parameters, so read them with :meth:`load_into` (which broadcasts them
    to the other ranks) rather than :meth:`state_dict`.
    """

    def __init__(self, client, meta):
        self._client = client
        self.id = meta["id"]
        self.round = meta["round"]
        self.steps = meta["steps"]
        self.batch_size = meta["batch_size"]
        self.lr = meta["lr"]
        self.momentum = meta["momentum"]
        self.weight_decay = meta["weight_decay"]
        self.prox_mu = meta["prox_mu"]
        self.seed = meta["seed"]
        self.worker_index = meta["worker_index"]
        self.evaluate_only = meta["kind"] == _wire.EVALUATE
        self.hparams = {k: meta[k] for k in (
            "steps", "batch_size", "lr", "momentum", "weight_decay",
            "prox_mu", "seed", "worker_index")}
        self.done = False
        self.evaluated = False
        self._t0 = time.monotonic()

    def __repr__(self):
        return "<fedbox.Task round %d: %d steps of %d, lr %g>" % (
            self.round, self.steps, self.batch_size, self.lr)

    # ---- the global model ----

    def arrays(self):
        """The global model as ``{name: numpy float32 array}``: views of the
        shared memory (no copy), writable, valid until :meth:`finish`.
        Rank 0 only."""
        return self._client._views(numpy=True)

    def state_dict(self):
        """The global model as ``{name: torch.float32 CPU tensor}``: views
        of the shared memory (no copy), in the layout's order, valid until
        :meth:`finish`. ``model.load_state_dict(task.state_dict())`` works
        for a model whose ``state_dict()`` holds exactly these tensors
        (use :meth:`load_into` when it also has integer buffers). Rank 0
        only."""
        return self._client._views(numpy=False)

    def load_into(self, model):
        """Copies the global model into ``model`` (an ``nn.Module``, maybe
        wrapped in DistributedDataParallel) in place, on its device and in
        its dtypes, and returns it. Checks the layout first and raises
        :class:`LayoutError` naming the first tensor that differs. Integer
        buffers of the model are left as they are.

        Under torch.distributed (torchrun) call it on every rank: rank 0
        copies from the shared memory, then every tensor is broadcast from
        rank 0, so all ranks start the round from the global model."""
        torch = _torch()
        c = self._client
        inner = _unwrap(model)
        sd = inner.state_dict()
        c._check_model(sd)
        with torch.no_grad():
            if c.rank == 0:
                views = c._views(numpy=False)
                for name, _, _ in c.layout:
                    sd[name].copy_(views[name])
            if c.world > 1:
                if not _dist_ready():
                    raise TrainerError(
                        "WORLD_SIZE is %d but torch.distributed is not "
                        "initialised: call init_process_group first" %
                        c.world)
                for name, _, _ in c.layout:
                    torch.distributed.broadcast(sd[name], 0)
        return model

    # ---- the federated evaluation ----

    def report_eval(self, examples=None, loss=None, accuracy=None,
                    **metrics):
        """Reports how the round's *global* model does on this box's own
        validation data: call it after :meth:`load_into` and before you
        train (at most once per task, before :meth:`finish`). Optional: a
        task without it sends no evaluation.

        Args:
            examples: validation examples evaluated (a whole number >= 1):
                the report's weight in the federation's mean.
            loss: their mean loss (finite).
            accuracy: the fraction right, in [0, 1]; None for a task
                without one (regression).
            **metrics: up to 8 more scalars of yours, by name (1 to 31
                bytes, no quotes or backslashes), e.g. ``f1=0.91``. Each
                is averaged over the workers that report it, weighted by
                their examples, so report per-example means.

        The coordinator writes the sample-weighted means of all workers'
        reports into the round's metrics line as ``"fed_eval"``. Under
        secure aggregation it learns only the sums of examples, loss and
        accuracy (they travel in the masked update), and the named metrics
        are not sent at all.

        :func:`fedbox.evaluate` computes ``examples``, ``loss`` and
        ``accuracy`` of a classifier: ``task.report_eval(**fedbox.evaluate(
        model, x, y))``. Raises ValueError for a value out of range.

        Under torchrun call it on every rank, like :meth:`finish`: rank 0's
        values are sent; the other ranks may call it without arguments
        (``task.report_eval()``), so evaluate on rank 0 alone, or
        all-reduce the sums across ranks first."""
        if self.done:
            raise TrainerError("task of round %d is already finished" %
                               self.round)
        if self.evaluated:
            raise TrainerError("task of round %d already has its "
                               "evaluation" % self.round)
        if self._client.rank != 0:
            self.evaluated = True
            self.done = self.done or self.evaluate_only
            return
        if examples is None or loss is None:
            raise ValueError("report_eval: examples and loss are needed "
                             "(on rank 0)")
        if isinstance(examples, bool) or int(examples) != examples or \
                examples < 1:
            raise ValueError("report_eval: examples must be a whole number "
                             ">= 1, not %r" % (examples,))
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError("report_eval: the loss is %r" % loss)
        if accuracy is not None:
            accuracy = float(accuracy)
            if not 0.0 <= accuracy <= 1.0:
                raise ValueError("report_eval: accuracy must lie in [0, 1], "
                                 "not %r" % accuracy)
        if len(metrics) > METRICS_MAX:
            raise ValueError("report_eval: %d metrics, at most %d" %
                             (len(metrics), METRICS_MAX))
        items = []
        for name, value in metrics.items():
            raw = name.encode("utf-8")
            if not 1 <= len(raw) <= METRIC_NAME_MAX or '"' in name or \
                    "\\" in name or any(ord(ch) < 0x20 for ch in name):
                raise ValueError("report_eval: metric name %r: 1 to %d "
                                 "bytes, printable, no quotes or "
                                 "backslashes" % (name, METRIC_NAME_MAX))
            value = float(value)
            if not math.isfinite(value):
                raise ValueError("report_eval: metric %s is %r" %
                                 (name, value))
            items.append((name, value))
        self.evaluated = True
        if self.evaluate_only:
            self.done = True  # the task was only this
        if self._client.rank == 0:
            self._client._send(_wire.evaluation(self.id, int(examples), loss,
                                                accuracy, items))

    # ---- the answer ----

    def finish(self, state, samples, steps, loss, a_norm=None):
        """Returns this box's trained parameters to the worker; call it
        once per task, after training.

        Args:
            state: ``{name: tensor or numpy array}`` holding every tensor of
                the layout (``model.state_dict()`` does; integer buffers
                and other extra non-float entries are ignored). Tensors may
                be on any device and of any floating dtype: they are copied
                into the shared memory as float32. Tensors that already are
                its views (from :meth:`state_dict`) are not copied.
            samples: the number of training examples this box holds: its
                weight in the federated average (e.g. ``len(train_set)``,
                all ranks together).
            steps: optimizer steps done (>= 1).
            loss: mean training loss over those steps (finite).
            a_norm: FedNova's normaliser ``||a||_1`` for your optimizer;
                leave None for plain SGD or SGD with momentum, which the
                worker computes from ``steps``, ``lr`` and ``momentum``.

        Raises :class:`LayoutError` when ``state`` does not match the
        layout, ValueError for a bad count or loss; the worker then sees
        this round's training fail (the exception ends your script unless
        you catch it; see :meth:`fail`).

        Under torchrun call it on every rank: rank 0 answers with its
        values, the others return at once."""
        if self.done:
            raise TrainerError("task of round %d is already finished" %
                               self.round)
        c = self._client
        if c.rank != 0:
            self.done = True
            return
        for what, v in (("samples", samples), ("steps", steps)):
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError("finish: %s must be a whole number >= 1, "
                                 "not %r" % (what, v))
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError("finish: the loss is %r" % loss)
        if a_norm is not None:
            a_norm = float(a_norm)
            if not (math.isfinite(a_norm) and a_norm > 0):
                raise ValueError("finish: a_norm must be finite and > 0, "
                                 "not %r" % a_norm)
        c._check_state(state)
        c._write(state)
        self.done = True
        c._send(_wire.result(self.id, int(samples), int(steps), loss, a_norm,
                             time.monotonic() - self._t0, c.param_count,
                             [(n, s, o) for n, s, o in c.layout]))

    def fail(self, reason):
        """Tells the worker that this round's training failed (the reason
        goes to its log) and goes on to the next task: the trainer keeps
        running. Under torchrun, rank 0's call counts."""
        if self.done:
            raise TrainerError("task of round %d is already finished" %
                               self.round)
        self.done = True
        if self._client.rank == 0:
            self._client._send(_wire.fail(self.id, False, str(reason)))


class Client:
    """The connection to the worker; make it with :func:`connect`.

    Attributes:
        layout: ``[(name, shape, offset)]``: the federation's tensors in
            order, all float32, each at element ``offset`` of the shared
            parameter vector.
        param_count: parameters in all.
        device: a ``torch.device`` hint from the worker's ``train.device``
            (``cuda:LOCAL_RANK`` when it is cuda, or auto with a GPU
            visible; else cpu). The worker's ``train.gpus`` become
            ``CUDA_VISIBLE_DEVICES``.
        shard: a :class:`Shard` in simulations (``train.share_shard``),
            else None.
        rank, world: this process's torch.distributed rank and world size
            (from torchrun's ``RANK`` and ``WORLD_SIZE``; 0 and 1 without).

    Under torchrun, ``layout``, ``param_count``, ``shard`` and ``tasks()``
    are collective the first time any of them is used (rank 0 tells the
    others): use them on every rank, after ``init_process_group``.
    """

    def __init__(self, sock_path, token, examples=0):
        self.rank, self.world = _dist_world()
        self._task = None
        self._chan = None
        self._mm = None
        self._flat = None
        self._shard = None
        self._shard_meta = None
        if self.rank == 0:
            self._connect(sock_path, token, examples)
        self._device_hint = os.environ.get("FEDBOX_TRAINER_DEVICE", "auto")
        if self.world > 1:
            self._share_welcome()

    # ---- setup ----

    def _connect(self, sock_path, token, examples):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock_path)
        except OSError as e:
            s.close()
            raise TrainerError("cannot reach the worker at %s: %s" % (
                sock_path, e)) from None
        self._chan = _wire.Channel(s)
        self._chan.send(_wire.hello(token, os.getpid(), self.world,
                                    examples))
        body = self._chan.recv()
        if body is None:
            raise TrainerError("the worker refused this trainer (see its "
                               "log)")
        if _wire.msg_type(body) != _wire.WELCOME:
            raise _wire.ProtocolError("expected a welcome")
        w = _wire.parse_welcome(body)
        fds = self._chan.fds
        if len(fds) != (3 if w["shard"] else 1):
            raise _wire.ProtocolError("welcome came with %d descriptors" %
                                      len(fds))
        self._layout = w["layout"]
        self._param_count = w["param_count"]
        self._mm = mmap.mmap(fds[0], w["params_len"], mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fds[0])
        self._np = np.frombuffer(self._mm, dtype="<f4",
                                 count=self._param_count)
        if w["shard"]:
            self._shard_meta = dict(w["shard"], pid=os.getpid(),
                                    fds=(fds[1], fds[2]))

    def _share_welcome(self):
        """Rank 0 tells the other ranks the layout (and where the shard
        is); a collective on every rank."""
        if not _dist_ready():
            # Deferred: tasks() and shard need the process group anyway.
            self._shared = False
            return
        torch = _torch()
        box = [None]
        if self.rank == 0:
            box = [{"layout": self._layout,
                    "param_count": self._param_count,
                    "shard": self._shard_meta}]
        torch.distributed.broadcast_object_list(box, 0)
        if self.rank != 0:
            self._layout = box[0]["layout"]
            self._param_count = box[0]["param_count"]
            self._shard_meta = box[0]["shard"]
        self._shared = True

    def _need_shared(self):
        if self.world > 1 and not getattr(self, "_shared", False):
            if not _dist_ready():
                raise TrainerError(
                    "WORLD_SIZE is %d: call torch.distributed."
                    "init_process_group before using the client" % self.world)
            self._share_welcome()

    @property
    def layout(self):
        self._need_shared()
        return self._layout

    @property
    def param_count(self):
        self._need_shared()
        return self._param_count

    @property
    def device(self):
        torch = _torch()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if self._device_hint == "cpu":
            return torch.device("cpu")
        if self._device_hint == "cuda" or torch.cuda.is_available():
            if not torch.cuda.is_available():
                raise TrainerError("train.device is cuda but this PyTorch "
                                   "sees no GPU")
            return torch.device("cuda", local % torch.cuda.device_count())
        return torch.device("cpu")

    @property
    def shard(self):
        self._need_shared()
        if self._shard is None and self._shard_meta is not None:
            m = self._shard_meta
            fx, fy = m["fds"]
            if self.rank != 0:
                # The other ranks open rank 0's memory through /proc.
                fx = os.open("/proc/%d/fd/%d" % (m["pid"], fx), os.O_RDONLY)
                fy = os.open("/proc/%d/fd/%d" % (m["pid"], fy), os.O_RDONLY)
            ysize = 1 if m["y_dtype"] == "uint8" else 4  # int32, float32
            xs = m["count"] * m["dim"] * 4
            mx = mmap.mmap(fx, xs, mmap.MAP_SHARED, mmap.PROT_READ) if xs \
                else b""
            my = mmap.mmap(fy, m["count"] * ysize, mmap.MAP_SHARED,
                           mmap.PROT_READ) if m["count"] else b""
            if self.rank != 0:
                os.close(fx)
                os.close(fy)
            x = np.frombuffer(mx, dtype="<f4").reshape(m["count"], m["dim"])
            y = np.frombuffer(my, dtype=np.dtype(m["y_dtype"]).newbyteorder(
                "<"))
            self._shard = Shard(x, y, m["classes"])
        return self._shard

    # ---- the loop ----

    def tasks(self):
        """Yields one :class:`Task` per round, blocking until the worker
        hands over the next, and ends when the worker says it is done or
        goes away. Call ``task.finish(...)`` (or ``task.fail(...)``) before
        asking for the next one; a task with ``evaluate_only`` set ends
        with ``task.report_eval(...)`` instead.

        Under torchrun every rank iterates: rank 0 receives the task from
        the worker and broadcasts it (torch.distributed must be
        initialised)."""
        self._need_shared()
        while True:
            if self._task is not None and not self._task.done and \
                    self._task.evaluate_only:
                # a script that has no evaluation to give
                self._task.fail("the trainer reported no evaluation "
                                "(task.report_eval)")
            if self._task is not None and not self._task.done:
                raise TrainerError(
                    "the task of round %d was neither finished nor failed: "
                    "call task.finish(...) or task.fail(reason)" %
                    self._task.round)
            meta = self._next_task() if self.rank == 0 else None
            if self.world > 1:
                torch = _torch()
                box = [meta]
                torch.distributed.broadcast_object_list(box, 0)
                meta = box[0]
            if meta is None:
                self._task = None
                return
            self._task = Task(self, meta)
            yield self._task

    def _next_task(self):
        while True:
            body = self._chan.recv()
            if body is None:
                sys.stderr.write("fedbox: the worker closed the "
                                 "connection\n")
                return None
            t = _wire.msg_type(body)
            if t == _wire.BYE:
                return None
            if t == _wire.TASK:
                meta = _wire.parse_task(body)
                if meta["kind"] not in (_wire.TRAIN, _wire.EVALUATE):
                    self._send(_wire.fail(meta["id"], False,
                                          "task kind %d is not known to "
                                          "this fedbox package" %
                                          meta["kind"]))
                    continue
                return meta
            raise _wire.ProtocolError("unexpected message type %d" % t)

    # ---- helpers of Task ----

    def _send(self, data):
        self._chan.send(data)

    def _views(self, numpy):
        if self.rank != 0:
            raise TrainerError(
                "only rank 0 holds the parameters: use task.load_into(model), "
                "which broadcasts them")
        out = {}
        if numpy:
            for name, shape, off in self.layout:
                n = math.prod(shape)
                out[name] = self._np[off:off + n].reshape(shape)
            return out
        torch = _torch()
        if self._flat is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._flat = torch.from_numpy(self._np)
        for name, shape, off in self.layout:
            n = math.prod(shape)
            out[name] = self._flat[off:off + n].view(shape)
        return out

    def _check_model(self, sd):
        """LayoutError unless the model's float tensors are the layout."""
        want = {name: shape for name, shape, _ in self.layout}
        for name, shape, _ in self.layout:
            if name not in sd:
                raise LayoutError(
                    "tensor %r %s of the federation's model is not in "
                    "yours" % (name, _shape_text(shape)))
            t = sd[name]
            if tuple(t.shape) != tuple(shape):
                raise LayoutError(
                    "tensor %r is %s in the federation's model but %s in "
                    "yours" % (name, _shape_text(shape),
                               _shape_text(t.shape)))
            if not _is_float(t):
                raise LayoutError("tensor %r is %s in your model; the "
                                  "federation's is float" % (name, t.dtype))
        for name, t in sd.items():
            if name not in want and _is_float(t):
                raise LayoutError(
                    "your model has tensor %r %s, which the federation's "
                    "model does not" % (name, _shape_text(t.shape)))

    def _check_state(self, state):
        if not hasattr(state, "items"):
            raise TypeError("finish: state must map names to tensors (e.g. "
                            "model.state_dict()), not %s" %
                            type(state).__name__)
        self._check_model(state)

    def _write(self, state):
        torch = None
        views_np = None
        views_t = None
        for name, shape, off in self.layout:
            src = state[name]
            if isinstance(src, np.ndarray):
                if views_np is None:
                    views_np = self._views(numpy=True)
                np.copyto(views_np[name], src, casting="same_kind")
                continue
            if torch is None:
                torch = _torch()
                views_t = self._views(numpy=False)
            dst = views_t[name]
            if (src.device.type == "cpu" and src.dtype == torch.float32 and
                    src.data_ptr() == dst.data_ptr()):
                continue  # already there: the task's own view
            with torch.no_grad():
                dst.copy_(src.detach())

    def close(self):
        """Drops the connection; the worker then sees this trainer gone."""
        if self._chan is not None:
            self._chan.sock.close()
            self._chan = None


def _arm_process():
    """Die with the worker, and say where we were when it stops us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)  # it is already gone
    except (OSError, AttributeError):
        pass
    try:
        faulthandler.register(signal.SIGTERM, chain=True)
    except (ValueError, RuntimeError, AttributeError):
        pass


def _report_crashes(client):
    """An uncaught exception tells the worker why before the trainer ends,
    so that its log says more than "exited with status 1"."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            task = client._task
            tid = task.id if task is not None else 0
            text = "".join(traceback.format_exception_only(
                kind, value)).strip()
            client._send(_wire.fail(tid, True, text))
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        previous(kind, value, tb)

    sys.excepthook = hook


def evaluate(model, x, y, batch_size=1000, device=None):
    """Evaluates a classifier on ``x`` (features, a tensor or numpy array)
    and ``y`` (class labels) with cross-entropy, in batches, without
    gradients and in eval mode (restored after), and returns
    ``{"examples": n, "loss": mean loss, "accuracy": fraction right}``:
    what :meth:`Task.report_eval` takes. ``device`` defaults to the
    model's."""
    torch = _torch()
    import torch.nn.functional as F
    inner = _unwrap(model)
    if device is None:
        p = next(inner.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
    x = torch.as_tensor(x)
    y = torch.as_tensor(y).long()
    n = int(y.shape[0])
    if n < 1 or int(x.shape[0]) != n:
        raise ValueError("evaluate: %d examples and %d labels" %
                         (int(x.shape[0]), n))
    was = inner.training
    inner.eval()
    loss_sum, right = 0.0, 0
    try:
        with torch.no_grad():
            for i in range(0, n, batch_size):
                xb = x[i:i + batch_size].to(device)
                yb = y[i:i + batch_size].to(device)
                out = inner(xb)
                loss_sum += float(F.cross_entropy(out, yb, reduction="sum"))
                right += int((out.argmax(1) == yb).sum())
    finally:
        inner.train(was)
    return {"examples": n, "loss": loss_sum / n, "accuracy": right / n}


def connect(examples=0):
    """Connects to the worker that started this process and returns a
    :class:`Client`.

    The worker passes where and how in the environment
    (``FEDBOX_TRAINER_SOCKET``, ``FEDBOX_TRAINER_TOKEN``); this reads them
    and removes the token, which works once. Under torchrun call it on
    every rank: rank 0 connects, the other ranks learn the layout from it
    (call ``torch.distributed.init_process_group`` before or right after,
    and before :meth:`Client.tasks`).

    Args:
        examples: optional: the number of training examples this box
            holds, if known now (the same number you give
            ``Task.finish(samples=...)``).

    The process is tied to the worker: it is killed if the worker dies,
    and prints its threads' stacks if the worker stops it (SIGTERM), e.g.
    after ``train.task_timeout``. An uncaught exception is reported to the
    worker's log before the process ends.

    Raises TrainerError when the environment does not name a worker or the
    worker refuses the connection."""
    rank, _ = _dist_world()
    path = os.environ.get("FEDBOX_TRAINER_SOCKET")
    tok = os.environ.pop("FEDBOX_TRAINER_TOKEN", None)
    _arm_process()
    if rank == 0 and (not path or not tok):
        raise TrainerError(
            "FEDBOX_TRAINER_SOCKET / FEDBOX_TRAINER_TOKEN are not set: this "
            "program is meant to be started by fedbox-worker "
            "(train.command in its config)")
    token = b""
    if rank == 0:
        try:
            token = bytes.fromhex(tok)
        except ValueError:
            token = b""
        if len(token) != _wire.TOKEN_LEN:
            raise TrainerError("FEDBOX_TRAINER_TOKEN is malformed")
    client = Client(path, token, int(examples))
    if rank == 0:
        _report_crashes(client)
    return client
