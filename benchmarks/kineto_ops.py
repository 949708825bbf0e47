"""Benchmark helper: each op of a real Kineto profile with the cost facts a memlens recording would
carry (flops, bytes_read, bytes_written, dtype, shapes) and the device time its own kernels measured.

This is benchmark glue, not the importer (memlens.io.kineto.importer* does that for users): it reads each CPU
op's ``Input Dims`` / ``Input type`` / ``Concrete Inputs``, runs the op on meta tensors to learn its
results' shapes, and feeds the signature through `memlens.recording.costs.op_costs`, as the recorder does.
Kernels, memcpys and memsets are given to the op whose ``External id`` they carry (both trace eras put
it on the GPU event). The ops kept are the ones a dispatch recorder would see: ops that own GPU work, and
leaf ops (no child op) that own none (views, metadata, CPU-side work).

2021-era traces (capitalised ``Operator``/``Kernel`` categories) carry no scalar arguments: their
convolutions and max-pools are rebuilt as the importer rebuilds them (`memlens.io.kineto.legacy`: the
output from the next op on the thread that takes it, stride and padding inferred from the sizes).
"""
from __future__ import annotations

import ast
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.io.kineto.legacy import LEGACY_OPS, LOOKAHEAD, legacy_call

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
                  "memset": "memset"}
_NOT_DTYPES = {"Scalar", "ScalarList", "GenericList", "TensorList", "Int", "Bool", "Double", "", "Device",
               "Layout", "ScalarType", "MemoryFormat", "String", "None"}


def load(path) -> dict:
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)


def device_name(doc: dict) -> str:
    """The GPU's name from deviceProperties (or the metadata of TraceLens files)."""
    props = doc.get("deviceProperties") or []
    if props:
        return str(props[0].get("name", ""))
    return ""


def _ops_and_activity(doc):
    ops, acts = [], []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = str(e.get("cat", ""))
        args = e.get("args") or {}
        if cat in ("cpu_op", "Operator"):
            ops.append({"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0)),
                        "tid": str(e.get("tid")), "ext": int(args.get("External id", -1)),
                        "dims": args.get("Input Dims"), "types": args.get("Input type"),
                        "concrete": args.get("Concrete Inputs"), "strides": args.get("Input Strides")})
        elif cat.lower() in GPU_CATEGORIES:
            ext = args.get("External id", args.get("external id", -1))
            acts.append({"name": e.get("name", ""), "kind": GPU_CATEGORIES[cat.lower()], "ts": float(e["ts"]),
                         "dur": float(e.get("dur", 0)), "ext": int(ext), "bytes": int(args.get("bytes", 0) or 0)})
    return pd.DataFrame(ops), pd.DataFrame(acts)


def _parents(ops: pd.DataFrame) -> np.ndarray:
    """Parent row (same thread, innermost enclosing op) of each op; -1 for top level."""
    parent = np.full(len(ops), -1, dtype=np.int64)
    for _, idx in ops.groupby("tid").indices.items():
        order = idx[np.lexsort((-ops["dur"].to_numpy()[idx], ops["ts"].to_numpy()[idx]))]
        stack = []
        for i in order:
            t0 = ops.at[i, "ts"]
            while stack and ops.at[stack[-1], "ts"] + ops.at[stack[-1], "dur"] < t0 + ops.at[i, "dur"] - 1e-3:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
    return parent


def _literal(text):
    if text in ("", None):
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _signature(row, default_dtype="float32"):
    """(args with tensors as (shape, dtype name), has concrete scalars)."""
    from memlens.opfacts.dtypes import dtype_name
    dims, types = row["dims"] or [], row["types"] or []
    concrete = row["concrete"]
    args = []
    for i, (d, t) in enumerate(zip(dims, types)):
        if t == "TensorList" or (t == "GenericList" and d and isinstance(d[0], list)):
            args.append(tuple((tuple(x), default_dtype) for x in d if isinstance(x, list)))
        elif t not in _NOT_DTYPES and dtype_name(t):
            args.append((tuple(d), dtype_name(t)))
        elif concrete is not None and i < len(concrete):
            args.append(_literal(concrete[i]))
        else:
            args.append(None)
    return args, concrete is not None


def _common_float_dtype(ops) -> str:
    """The floating dtype most tensor arguments of the profile have (for TensorList arguments, whose
    element dtypes Kineto does not write)."""
    from collections import Counter
    from memlens.opfacts.dtypes import dtype_name, is_floating
    counts = Counter(dtype_name(t) for types in ops["types"].dropna() for t in types
                     if t not in _NOT_DTYPES and is_floating(dtype_name(t)))
    return counts.most_common(1)[0][0] if counts else "float32"


def _meta_out(name, args, kwargs):
    """Results of the op run on meta tensors, as (shape, dtype name) / tuples of them; None if it fails."""
    import torch
    from memlens.opfacts.flops import resolve_op

    def to_meta(a):
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], tuple) and isinstance(a[1], str):
            return torch.empty(a[0], dtype=getattr(torch, a[1]), device="meta")
        if isinstance(a, tuple) and a and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str)
                                               for x in a):
            return [to_meta(x) for x in a]
        return a

    def back(o):
        if isinstance(o, torch.Tensor):
            return (tuple(o.shape), str(o.dtype).replace("torch.", ""))
        if isinstance(o, (list, tuple)):
            return tuple(back(x) for x in o)
        return None

    func = resolve_op(name)
    if func is None:
        return None
    try:
        return back(func(*[to_meta(a) for a in args], **{k: to_meta(v) for k, v in kwargs.items()}))
    except Exception:   # noqa: BLE001 (meta kernels are missing for some ops: handled by the caller)
        return None


def _legacy_record(ops, i, parent, name):
    """(name, args, out) of a 2021-era op logged without scalar arguments, rebuilt by the importer's
    `memlens.io.kineto.legacy.legacy_call` from its shapes and the ops after it on its thread; None if unknown."""
    end = ops.at[i, "ts"] + ops.at[i, "dur"]
    later = ops[(ops["tid"] == ops.at[i, "tid"]) & (ops["ts"] >= end)].sort_values("ts").head(LOOKAHEAD)["dims"]
    p = parent[i]
    around = (ops.at[p, "dims"] or [], ops.at[p, "types"] or []) if p >= 0 else None
    children = set(ops.loc[parent == i, "name"])
    return legacy_call(name, ops.at[i, "dims"] or [], ops.at[i, "types"] or [], list(later), around, children)


def _is_tensor(a) -> bool:
    return isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], tuple) and isinstance(a[1], str)


def _overload(name, args):
    """The overload of `name` whose schema takes exactly these arguments (tensors where tensors are),
    as its qualified name ("aten::mean.dim"); `name` when none fits."""
    import torch
    ns, _, op = name.partition("::")
    packet = getattr(getattr(torch.ops, ns, None), op, None)
    if packet is None:
        return name
    # out= overloads last: 2021-era traces record `clamp_min(self, min, out)` under the plain name
    for ov in sorted(packet.overloads(), key=lambda o: o.endswith("out")):
        schema = getattr(packet, ov)._schema
        if len(schema.arguments) != len(args):
            continue
        kinds = [str(a.type).startswith("Tensor") for a in schema.arguments]
        if all(k == _is_tensor(v) or v is None for k, v in zip(kinds, args)):
            return name if ov == "default" else f"{name}.{ov}"
    return name


def _keywords(name, args):
    """(qualified name, positional args, keyword args): Kineto lists every schema argument in order;
    keyword-only ones (addmm's beta/alpha, mean's dtype) go back to keywords, as a Python call passes them."""
    from memlens.opfacts.flops import resolve_op
    name = _overload(name, args)
    schema = getattr(resolve_op(name), "_schema", None)
    if schema is None or len(schema.arguments) < len(args):
        return name, args, {}
    positional, kwargs = [], {}
    for arg, value in zip(schema.arguments, args):
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            positional.append(value)
    return name, positional, kwargs


# the vendor convolution entry points as aten::convolution(input, weight, bias, stride, padding, dilation,
# transposed, output_padding, groups), the op a dispatch recorder sees
_CONV_ALIASES = {
    "aten::cudnn_convolution": lambda a: ("aten::convolution", [a[0], a[1], None, a[3], a[2], a[4], False,
                                                                [0] * len(a[2] or [0, 0]), a[5]]),
    "aten::miopen_convolution": lambda a: ("aten::convolution", [a[0], a[1], a[2], a[4], a[3], a[5], False,
                                                                 [0] * len(a[3] or [0, 0]), a[6]]),
}
# position of the is_causal argument in the schema of fused attention ops
_CAUSAL_ARG = {"aten::_flash_attention_forward": 8, "aten::_scaled_dot_product_flash_attention": 4,
               "aten::_scaled_dot_product_efficient_attention": 5, "aten::_efficient_attention_forward": 8,
               "aten::_scaled_dot_product_cudnn_attention": 5}


def profile_ops(path) -> tuple[pd.DataFrame, dict]:
    """(ops, info) of a Kineto profile. ops: name, flops, bytes_read, bytes_written, dtype, shapes,
    measured_ns (device ns of the op's own kernels, memcpys and memsets), kernels, memcpy_bytes.
    info: gpu (device name), gpu_busy_ns (all GPU activity), attributed_ns, ops_without_facts."""
    from memlens.recording.costs import op_costs
    doc = load(path)
    ops, acts = _ops_and_activity(doc)
    parent = _parents(ops)
    has_child = np.zeros(len(ops), dtype=bool)
    has_child[parent[parent >= 0]] = True
    by_ext = pd.Series(np.arange(len(ops)), index=ops["ext"]).groupby(level=0).last()
    owner = by_ext.reindex(acts["ext"]).to_numpy(dtype="float64")
    acts["op"] = np.where(np.isnan(owner), -1, owner).astype(np.int64)
    own = acts[acts["op"] >= 0].groupby("op").agg(measured_us=("dur", "sum"), kernels=("dur", "size"),
                                                 memcpy_bytes=("bytes", "sum"))
    memcpy = acts[(acts["kind"] == "memcpy") & (acts["op"] >= 0)]
    transfers = {int(o): ("h2d" if "HtoD" in nm else "d2h" if "DtoH" in nm else "")
                 for o, nm in zip(memcpy["op"], memcpy["name"])}
    keep = np.flatnonzero(~has_child | np.isin(np.arange(len(ops)), own.index.to_numpy()))
    rows, missing = [], 0
    common_dtype = _common_float_dtype(ops)
    for i in keep:
        name = ops.at[i, "name"]
        if not name.startswith("aten::"):
            if i in own.index:
                missing += 1
            continue
        args, concrete = _signature(ops.loc[i], common_dtype)
        record = None if concrete or name not in LEGACY_OPS else _legacy_record(ops, i, parent, name)
        if record is not None:
            rec_name, rec_args, out = record
            rec_name, rec_args, kwargs = _keywords(rec_name, rec_args)
        else:
            if name in _CONV_ALIASES:
                name, args = _CONV_ALIASES[name](args)
            rec_name, rec_args, kwargs = _keywords(name, args)
            out = _meta_out(rec_name, rec_args, kwargs)
            if out is None:     # no meta kernel (cudnn_batch_norm ...): the result is shaped like the input
                out = next((a for a in rec_args if isinstance(a, tuple) and len(a) == 2
                            and isinstance(a[1], str) and isinstance(a[0], tuple)), None)
        try:
            facts = op_costs(rec_name, tuple(rec_args), kwargs, out)
        except Exception:   # noqa: BLE001
            missing += 1
            continue
        m = own.loc[i] if i in own.index else None
        direction = transfers.get(i, "")
        concrete_args = ops.at[i, "concrete"] or []
        causal = name in _CAUSAL_ARG and len(concrete_args) > _CAUSAL_ARG[name] \
            and concrete_args[_CAUSAL_ARG[name]] == "True"
        rows.append({"op": int(i), "name": rec_name, "flops": facts.flops, "bytes_read": facts.bytes_read,
                     "bytes_written": facts.bytes_written, "dtype": facts.dtype, "shapes": facts.shapes,
                     "measured_ns": 0.0 if m is None else float(m["measured_us"]) * 1e3,
                     "kernels": 0 if m is None else int(m["kernels"]),
                     "memcpy_bytes": 0 if m is None else int(m["memcpy_bytes"]),
                     "start_ns": ops.at[i, "ts"] * 1e3, "causal": causal, "transfer": direction,
                     # an op that launched no GPU work ran on the host (a fact of the profile)
                     "device": "cpu" if m is None else "cuda",
                     "input_strides": json.dumps(ops.at[i, "strides"]) if ops.at[i, "strides"] else ""})
    table = pd.DataFrame(rows)
    info = {"gpu": device_name(doc), "gpu_busy_ns": float(acts["dur"].sum()) * 1e3,
            "attributed_ns": float(acts.loc[acts["op"] >= 0, "dur"].sum()) * 1e3,
            "modeled_ops_measured_ns": float(table["measured_ns"].sum()) if len(table) else 0.0,
            "ops_without_facts": missing}
    return table, info


if __name__ == "__main__":
    import sys
    t, info = profile_ops(sys.argv[1])
    print(info)
    print(t.groupby("name")["measured_ns"].agg(["sum", "size"]).sort_values("sum", ascending=False).head(30))
