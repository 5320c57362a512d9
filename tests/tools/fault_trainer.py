# SPDX-License-Identifier: Apache-2.0
"""fault_trainer.py -- a trainer process for tests: numpy only (no torch,
so that it starts in a fraction of a second), which misbehaves on purpose
the first time it is started and trains properly once restarted.

    fault_trainer.py MODE STATE_DIR

The first trainer of a worker (no STATE_DIR/started file yet) does MODE in
its first task; the worker must count that round's training as failed,
stop it, and start a new one, which finds the file and behaves. A good
task moves every parameter by -lr * 0.01 (a visible, harmless update).

MODE:
  good         always behave
  crash        die of SIGSEGV in the middle of the task
  exit         exit with status 3 in the middle of the task
  hang         sleep far past any task timeout
  layout       answer with a layout whose first two tensors are swapped
               (same size), bypassing the package's own check
  size         answer with the last tensor one element short
  nan          write a NaN into the parameters, then answer normally
  api-layout   hand finish() a state missing a tensor: the package refuses
               (LayoutError) and the uncaught exception is reported
  stats        answer with 0 steps
  spy          write the socket path and token to STATE_DIR/env, wait for
               STATE_DIR/go, first letting a child of ours try the socket
               with a wrong token, then behave
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
import fedbox  # noqa: E402
from fedbox import _wire  # noqa: E402


def good(task):
    arrays = task.arrays()
    for a in arrays.values():
        a -= task.lr * 0.01  # in place, in the shared memory
    task.finish(arrays, samples=1000, steps=task.steps, loss=0.5)


def raw_result(client, task, layout, param_count=None, steps=None):
    client._send(_wire.result(task.id, 1000, task.steps if steps is None
                              else steps, 0.5, None, 0.1,
                              client.param_count if param_count is None
                              else param_count, layout))
    task.done = True


def misbehave(mode, client, task):
    layout = list(client.layout)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "exit":
        os._exit(3)
    elif mode == "hang":
        time.sleep(3600)
    elif mode == "layout":
        (n0, s0, o0), (n1, s1, o1) = layout[0], layout[1]
        layout[0], layout[1] = (n1, s0, o0), (n0, s1, o1)
        raw_result(client, task, layout)
    elif mode == "size":
        name, shape, off = layout[-1]
        layout[-1] = (name, (shape[0] - 1,) + tuple(shape[1:]), off)
        raw_result(client, task, layout, client.param_count - 1)
    elif mode == "nan":
        arrays = task.arrays()
        last = list(arrays)[-1]
        arrays[last].reshape(-1)[-1] = float("nan")
        task.finish(arrays, samples=1000, steps=task.steps, loss=0.5)
    elif mode == "api-layout":
        arrays = task.arrays()
        del arrays[list(arrays)[0]]
        task.finish(arrays, samples=1000, steps=task.steps, loss=0.5)
    elif mode == "stats":
        raw_result(client, task, layout, steps=0)
    else:
        raise SystemExit("fault_trainer: unknown mode %r" % mode)


def spy(state):
    """Leaks what an attacker would want, lets a descendant try the
    socket with a wrong token, and waits for the test's go."""
    path = os.environ["FEDBOX_TRAINER_SOCKET"]
    token = os.environ["FEDBOX_TRAINER_TOKEN"]
    with open(os.path.join(state, "env.tmp"), "w") as f:
        f.write("%s\n%s\n%d\n" % (path, token, os.getpid()))
    os.rename(os.path.join(state, "env.tmp"), os.path.join(state, "env"))
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run(
        [sys.executable, os.path.join(here, "trainer_outsider.py"), path,
         "00" * 32], capture_output=True, text=True)
    with open(os.path.join(state, "descendant"), "w") as f:
        f.write("%d\n%s" % (child.returncode, child.stdout))
    while not os.path.exists(os.path.join(state, "go")):
        time.sleep(0.05)


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mode, state = sys.argv[1], sys.argv[2]
    marker = os.path.join(state, "started")
    first = not os.path.exists(marker)
    with open(marker, "a") as f:
        f.write("%d\n" % os.getpid())
    if mode == "spy" and first:
        spy(state)
    client = fedbox.connect()
    for task in client.tasks():
        if first and mode not in ("good", "spy"):
            first = False
            misbehave(mode, client, task)
            continue
        good(task)


if __name__ == "__main__":
    sys.exit(main())
