"""Whether this process can run a prediction, and a child process that runs it where it cannot.

A fresh install followed by one `memlens.predict` call gives a prediction whatever was imported first. Where
memlens came first, or where torch came first and nothing had used autograd yet, the prediction runs in this
process (`memlens.prediction.shim` takes over torch's CPU-only CUDA hooks). Two cases cannot be mended in place:

- a backward pass ran before memlens's fake-CUDA device guard was in the process: autograd's engine counted its
  device threads then (none on a CPU build) and never counts again, so a backward on fake `cuda` tensors fails;
- torch's CUDA hooks are neither memlens's nor the plain CPU-only ones (another library installed its own).

There `memlens.predict(step_fn_or_script, ...)` runs the same call in a child Python process that imports
memlens before torch: the step function, its arguments and the options go by value (cloudpickle: a function
defined in ``__main__`` or a notebook, with what it refers to), the `Prediction` (or `DistributedPrediction`)
comes back, with a note saying it ran in a child process and why. An exception the prediction raised there
is raised here as the same exception, with the child's traceback in a note. The child inherits this process's
``sys.path``, working directory, environment, stdout and stderr.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from memlens.prediction.shim import CLI_ROUTE, ShimError

_engine = {"checked": False, "blocker": None}

CHILD_ENV = "MEMLENS_PREDICT_CHILD"   # set in the child: it never hands the prediction on again


def blocker() -> str | None:
    """Why a prediction cannot run in this process (a sentence), or None when it can. Raises `ShimError` when
    the shim cannot be built (no process can predict then)."""
    from memlens.prediction import shim
    if shim.torch_has_cuda_build():
        return None
    shim.prepare()   # memlens first and the shim missing: build it before torch is imported just below
    import torch  # noqa: F401  (as the prediction would: with memlens first, the import watcher loads the shim)
    try:
        shim.require()
    except ShimError as exc:
        if not shim.is_built():   # no shim to load (no compiler, say): a child process cannot help
            raise
        return str(exc)
    if shim.loaded_after_torch():
        return _engine_blocker()
    return None


def _engine_blocker() -> str | None:
    """Run one backward on a fake `cuda` tensor (once per process): it fails when autograd's engine counted
    its devices before the fake-CUDA guard was registered. When it had not counted yet, this backward makes it
    count now, with the guard in place: what the first prediction's backward would do anyway."""
    if _engine["checked"]:
        return _engine["blocker"]
    import torch

    from memlens.prediction.environment import fake_cuda
    try:
        with fake_cuda():
            x = torch.zeros(1, device="cuda", requires_grad=True)
            x.sum().backward()
    except RuntimeError as exc:
        if "device_ready_queues_" not in str(exc):
            raise
        _engine["blocker"] = ("a backward pass ran in this process before memlens was imported, so torch's "
                              "autograd engine has no thread for the fake GPU (it counts devices once, at the "
                              "first backward)")
    _engine["checked"] = True
    return _engine["blocker"]


def refuse_block(reason: str) -> ShimError:
    """The error for a ``with memlens.predict():`` block that cannot run here (a block cannot move to a child)."""
    return ShimError(f"memlens.predict cannot run in this process: {reason}. Give memlens.predict a step "
                     "function instead (it then runs in a child process), import memlens before torch, or run "
                     f"the script under prediction: `{CLI_ROUTE}`")


def child_note(reason: str) -> str:
    return f"predicted in a child Python process (memlens imported before torch there), because {reason}"


def predict_in_child(fn, gpu, capacity, options: dict, reason: str):
    """`memlens.predict(fn, gpu, capacity, **options)` in a child process; its result, or its exception."""
    if os.environ.get(CHILD_ENV) == "1":
        raise ShimError(f"memlens.predict cannot run in its child process either: {reason}")
    import cloudpickle
    with tempfile.TemporaryDirectory(prefix="memlens-predict-") as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.pkl"
        try:
            request.write_bytes(cloudpickle.dumps((fn, gpu, capacity, options)))
        except Exception as exc:
            raise ShimError(f"memlens.predict cannot run in this process ({reason}) and could not send the step "
                            f"function to a child process: {type(exc).__name__}: {exc}") from None
        env = {**os.environ, CHILD_ENV: "1",
               "PYTHONPATH": os.pathsep.join(p if p else os.getcwd() for p in sys.path)}
        # this very memlens first (not another checkout in the working directory), imported before torch
        here = str(Path(__file__).resolve().parents[2])
        code = (f"import sys; sys.path.insert(0, {here!r}); import memlens.prediction.child as c; "
                "c.serve(sys.argv[1], sys.argv[2])")
        proc = subprocess.run([sys.executable, "-c", code, str(request), str(answer)], env=env)
        if not answer.exists():
            raise ShimError(f"memlens.predict's child process (run because {reason}) ended with exit status "
                            f"{proc.returncode} and no answer (its output is above)")
        kind, value, child_tb = cloudpickle.loads(answer.read_bytes())
    if kind == "error":
        value.add_note(f"memlens.predict: raised in its child process (because {reason}); there:\n{child_tb}")
        raise value
    _add_note(value, child_note(reason))
    return value


def _add_note(result, note: str) -> None:
    result.process_note = note
    predictions = getattr(result, "predictions", None)
    if predictions is not None:      # a DistributedPrediction: its notes, and each rank's trace
        result.notes.append(note)
        for p in predictions.values():
            _add_note(p, note)
    elif getattr(result, "trace", None) is not None:
        result.trace.metadata.setdefault("notes", []).append(note)

