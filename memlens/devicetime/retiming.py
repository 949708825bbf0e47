"""`retime(trace, gpu="H100")`: the same trace on the modeled clock of a GPU.

What changes (and why it stays a consistent trace):
- Ops keep their recorded order and run back to back on one device stream, each for its modeled
  duration (`memlens.devicetime.costmodel`): a device that is never starved by its host. Ops that launch
  no kernel take 0 ns. An op nested in another (an imported profile's ``aten::addmm`` inside
  ``aten::linear``) runs inside it: each op spans its own time and its children's. New columns:
  ``device_self_ns`` (the op's own modeled time), ``device_ns`` (inclusive: its children's summed in, the
  clock contract of `memlens.clock`), ``op_class``, ``kernels``, and the old interval as
  ``recorded_start_ns`` / ``recorded_end_ns`` (the recorded clock, for side-by-side views).
- Accesses are re-stamped inside their op: reads at its start, writes at its end.
- Every other time (block alloc/free, allocator events, accesses without an op) goes through one
  monotone map from the old clock to the new: a time inside an op keeps its relative position in the
  op, a time between ops lands at the boundary between them. Because the map never reverses order and
  op boundaries map exactly, every access stays inside its block's lifetime when it was inside before.
- ``trace.metadata["clock"] = {"kind": "modeled", "gpu": ..., "model": ..., "from": <old clock kind>}``.
- A trace on the measured kernel clock (kind "cuda") is not re-modeled from shapes: each op's measured own
  time is scaled onto the target GPU by its compute- or memory-bound ratio (`memlens.devicetime.scaling`),
  so ops the rules do not price keep a time; the clock's model reads "scaled from measured <GPU>".

What the model cannot know: it times the ops that were recorded. A CPU recording runs what PyTorch runs
on the CPU, which is not always what it would launch on a GPU: optimizers default to their per-parameter
loop on CPU tensors (``foreach`` is picked only for CUDA tensors), so a retimed CPU training step pays one
small kernel per parameter and per update term where CUDA would run a few multi-tensor kernels; pass
``foreach=True`` to the optimizer when recording on CPU to model the CUDA default. Likewise SDPA that
falls back to its math path on CPU is timed as its bmm/softmax ops, not as one fused kernel.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.clock import clock_label, device_time_columns, op_parents, restamp, self_ns_of
from memlens.devicetime.costmodel import MODEL_NAME, device_times, has_cost_facts
from memlens.devicetime.gpus import gpu as resolve_gpu
from memlens.devicetime.gpus import gpu_of_device
from memlens.devicetime.scaling import scale_factors, scaled_ns
from memlens.devicetime.tf32 import tf32_setting
from memlens.errors import InputError
from memlens.trace import Trace, clock_of


def retime(trace: Trace, gpu="H100", *, tf32=None, source_gpu=None) -> Trace:
    """A new Trace on the modeled clock of `gpu` (a name from `memlens.gpus()` or a `memlens.GPU`).

    `tf32`: whether fp32 matmuls (``torch.backends.cuda.matmul.allow_tf32``) and convolutions
    (``torch.backends.cudnn.allow_tf32``) run at the TF32 tensor-core rate: True / False for both,
    ``{"matmul": bool, "conv": bool}`` for each, None (default) for what the trace says
    (``metadata["torch_settings"]``), else PyTorch's defaults (matmul off, cuDNN convolutions on; neither on
    ROCm). The clock's ``tf32`` entry records the settings used and their source
    (`memlens.devicetime.tf32`). Needs the ops table's cost facts (recorded by memlens); raises
    `InputError` for a trace without them. The input trace is not modified.

    A trace on the measured kernel clock is scaled from its measured times instead (module docstring);
    `source_gpu` names the GPU that measured them when the clock's device name is not in the GPU table.
    """
    g = resolve_gpu(gpu)
    if not isinstance(trace, Trace):
        raise InputError(f"retime needs a memlens.Trace, not {type(trace).__name__}")
    tf32 = tf32_setting(tf32, trace.metadata, g.vendor)
    ops = trace.ops
    if len(ops) == 0:
        raise InputError("the trace has no ops (an allocation-only source such as a snapshot, a profiler "
                         "memory timeline or a buffer list), so there is nothing to put on a device clock; "
                         "record the run with memlens.record")
    if clock_of(trace).get("kind") == "cuda":
        return _scale_measured(trace, g, source_gpu, tf32=tf32)
    if not has_cost_facts(ops):
        raise InputError("the trace has no per-op cost facts (flops/bytes per op), so it cannot be put on a "
                         "device clock; record it with memlens.record, or import a torch.profiler trace recorded "
                         "with record_shapes=True (snapshots and memory timelines carry no op shapes)")
    dt = device_times(ops, g, tf32=tf32)
    if "phase" in ops.columns:
        # optimizer step counters stay on the host in PyTorch (unless capturable/fused): their .item()
        # reads host memory and launches nothing on the device
        host_scalar = ((dt["op_class"] == "transfer") & (ops["phase"] == "optimizer")).to_numpy()
        if host_scalar.any():
            dt.loc[host_scalar, ["device_ns", "kernels"]] = 0
            dt.loc[host_scalar, "op_class"] = "none"
    times, busy = device_time_columns(ops, self_ns=dt["device_ns"].to_numpy())
    start, end = op_schedule(ops, times["device_self_ns"], times["device_ns"])
    old = clock_of(trace)
    clock = {"kind": "modeled", "gpu": g.name, "model": MODEL_NAME, "tf32": tf32,
             "device_busy_ns": busy, "kernels": int(dt["kernels"].sum())}
    out = restamp(trace, start, end, clock,
                  op_columns={**times, "op_class": dt["op_class"].to_numpy(), "kernels": dt["kernels"].to_numpy()},
                  drop_columns=("kernel_start_ns", "kernel_end_ns", "kernel_busy_ns", "kernels", "device_ns",
                                "device_self_ns", "op_class"),
                  note=f"times are on the {clock_label(clock)} (retimed from the {old.get('kind', 'host')} "
                       "clock: ops back to back in recorded order, durations from the per-op cost model)")
    out.metadata["gpu"] = g.to_dict()
    return out


def _measured_gpu(trace: Trace, source_gpu):
    if source_gpu is not None:
        return resolve_gpu(source_gpu)
    name = clock_of(trace).get("gpu")
    found = gpu_of_device(name) if name else None
    if found is None:
        raise InputError(f"the trace's kernels were measured on '{name or 'an unnamed GPU'}', which is not in the "
                         "GPU table; pass source_gpu= (a name from memlens.gpus() or a memlens.GPU; on the command "
                         "line --source-gpu NAME)")
    return found


def _scale_measured(trace: Trace, g, source_gpu, *, tf32: dict) -> Trace:
    """`trace` (on the measured kernel clock) on `g`'s clock: measured own times scaled op by op."""
    src = _measured_gpu(trace, source_gpu)
    ops = trace.ops
    if "device_self_ns" in ops.columns:
        measured = ops["device_self_ns"].to_numpy(dtype="float64", na_value=0)
    else:
        measured = device_time_columns(ops, inclusive=ops["device_ns"].to_numpy(dtype="float64", na_value=0)
                                       )[0]["device_self_ns"].astype("float64")
    factor, priced, classes = scale_factors(ops, src, g, tf32=bool(tf32["matmul"]))
    kernels = ops["kernels"].to_numpy(dtype="float64", na_value=0) if "kernels" in ops.columns else np.zeros(len(ops))
    own_kernels = self_ns_of(kernels.astype(np.int64), op_parents(ops))    # the column counts nested ops' too
    new_self = scaled_ns(measured, own_kernels, factor, classes, src, g)
    times, busy = device_time_columns(ops, self_ns=np.rint(new_self).astype(np.int64))
    start, end = op_schedule(ops, times["device_self_ns"], times["device_ns"])
    clock = {"kind": "modeled", "gpu": g.name, "model": f"scaled from measured {src.name}", "tf32": tf32,
             "device_busy_ns": busy, "kernels": clock_of(trace).get("kernels"), "measured_gpu": src.name}
    out = restamp(trace, start, end, clock,
                  op_columns={**times, "measured_self_ns": measured.astype(np.int64), "scale": factor,
                              "scale_priced": priced, "op_class": classes},
                  drop_columns=("kernel_start_ns", "kernel_end_ns", "device_ns", "device_self_ns", "op_class"),
                  note=f"times are on the {clock_label(clock)} (each op's measured {src.name} kernel time scaled "
                       "by its compute- or memory-bound ratio; ops back to back in recorded order)")
    out.metadata["gpu"] = g.to_dict()
    return out


def op_schedule(ops: pd.DataFrame, durations: np.ndarray, inclusive: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Back-to-back (start, end) ns, aligned with `ops` rows, for ops whose own time is `durations`, run in
    their recorded order (by start, then op_id) from t = 0: each op starts when the own times of the ops
    before it are spent and lasts its `inclusive` time (default: its own), so a parent, recorded before
    its children, spans them."""
    n = len(ops)
    order = np.lexsort((ops["op_id"].to_numpy(), ops["start_ns"].to_numpy()))
    dur = np.asarray(durations, dtype=np.int64)[order]
    span = dur if inclusive is None else np.asarray(inclusive, dtype=np.int64)[order]
    before = np.cumsum(dur) - dur
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    start[order] = before
    end[order] = before + span
    return start, end
