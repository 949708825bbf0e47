"""The child process's side of `memlens.prediction.firstuse.predict_in_child`: it imports memlens before torch
(the command that starts it does), runs the requested `memlens.predict` call and sends back its result or its
exception."""
from __future__ import annotations

from pathlib import Path

from memlens.prediction.shim import ShimError


def serve(request: str, answer: str) -> None:
    """The child's side: run the request, write ``(kind, result or exception, traceback text)``."""
    import traceback

    import cloudpickle

    from memlens.prediction.api import predict   # memlens came first (the child's command imports it)
    fn, gpu, capacity, options = cloudpickle.loads(Path(request).read_bytes())
    try:
        out = ("ok", predict(fn, gpu=gpu, capacity=capacity, **options), "")
    except BaseException as exc:   # handed to the caller, which raises it
        out = ("error", exc, traceback.format_exc())
    try:
        data = cloudpickle.dumps(out)
    except Exception as exc:
        kind, value, tb = out
        if kind == "ok":
            value = ShimError(f"the prediction made in a child process could not be sent back: "
                              f"{type(exc).__name__}: {exc}")
        else:
            value = RuntimeError(f"{type(value).__name__}: {value}")
        data = cloudpickle.dumps(("error", value, tb))
    Path(answer).write_bytes(data)
