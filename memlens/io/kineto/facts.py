"""Cost facts of a Kineto trace's ops, from the shapes the profiler logged (``record_shapes=True``).

Each ``cpu_op`` carries ``Input Dims`` (a list per argument: the sizes of a tensor, a list of them for a
tensor list, ``[]`` otherwise), ``Input type`` (a dtype spelling such as ``"c10::BFloat16"`` / ``"float"``, or
``"Scalar"``, ``"ScalarList"``, ``"TensorList"``, ``"Int"``, ``"Bool"``, ``"GenericList"``, ``""`` for None),
since 2022 ``Input Strides`` and ``Concrete Inputs`` (the scalar arguments as text: ``"0"``, ``"False"``,
``"[1, 1]"``). Every argument of the schema is logged in order, keyword-only ones included; results are not.

From that, per distinct signature (`signature_facts`):
1. the overload: the first of the op's overloads whose argument count and tensor positions match;
2. the results: the overload run on ``meta`` tensors of the logged sizes and strides, with the concrete
   scalars (an argument the trace left blank takes its schema default, or None when optional); a result
   that cannot be computed (no meta kernel, a scalar the 2021 format did not log) stays unknown;
3. the facts, by the recorder's own function (`memlens.opfacts.costs.op_costs`): flops from torch's flop
   registry, bytes read and written, dominant dtype, shapes string.

Which ops carry the facts (`facts_columns`): the profiler logs nested ops (``aten::linear`` around ``aten::t``
and ``aten::addmm``; ``aten::conv2d`` > ``aten::convolution`` > ``aten::_convolution`` >
``aten::cudnn_convolution``), the recorder (a dispatch mode below autograd) logs the outermost op that is not
a composite of others (``CompositeImplicitAutograd``). The same op carries the facts here: on every path of
the nesting tree, the outermost op that has a kernel of its own; ops around it and inside it keep their
shapes and dtype with 0 flops and 0 bytes, so each column sums over the table to the work done once.
"""
from __future__ import annotations

import ast
import json

import numpy as np
import pandas as pd

from memlens.io.kineto.legacy import LEGACY_OPS, legacy_facts
from memlens.opfacts.costs import COLUMNS, CostFacts, op_costs
from memlens.opfacts.dtypes import SCALAR_TYPE_NAMES, dtype_name

ARG_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
_MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
_UNKNOWN = object()   # a scalar the trace did not log and the schema gives no default for
_CACHE: dict = {}
KNOWN_BY_RUNNING = 2    # results known: 2 by running the meta kernel, 1 inferred (a backend convolution), 0 not
_NO_FACTS = (CostFacts(0, 0, 0, "", ""), False, 0)


def signature_key(args) -> tuple:
    """A hashable key of an op's logged arguments (the four `ARG_KEYS`, as JSON text)."""
    if type(args) is not dict:
        return ("",) * len(ARG_KEYS)
    return tuple(json.dumps(args.get(k), separators=(",", ":")) for k in ARG_KEYS)


def _is_tensor(dims, kind) -> bool:
    return isinstance(dims, list) and all(type(d) is int for d in dims) and bool(dtype_name(kind)) \
        and kind not in ("Int", "Bool", "Double", "Scalar")


def _schema_kind(arg_type) -> str:
    """"tensor", "tensor?", "tensor_list" or "other" for a schema argument's type."""
    import torch
    inner = arg_type.getElementType() if isinstance(arg_type, torch._C.OptionalType) else None
    if isinstance(arg_type, torch._C.TensorType):
        return "tensor"
    if isinstance(inner, torch._C.TensorType):
        return "tensor?"
    if isinstance(arg_type, torch._C.ListType) and "Tensor" in str(arg_type.getElementType()):
        return "tensor_list"
    return "other"


def _matches(schema, dims, types) -> bool:
    """Whether a logged call fits `schema`: no more arguments than it has (a trace of an older torch may
    log fewer: the schema's extra ones must have defaults), tensors where it takes tensors."""
    args = schema.arguments
    if len(dims) > len(args) or any(not a.has_default_value() and not str(a.type).startswith("Optional")
                                    for a in args[len(dims):]):
        return False
    for a, d, t in zip(args, dims, types):
        kind = _schema_kind(a.type)
        logged_tensor = _is_tensor(d, t)
        if kind == "tensor" and not logged_tensor or logged_tensor and kind not in ("tensor", "tensor?"):
            return False
        if kind == "tensor_list" and t not in ("TensorList", "GenericList", ""):
            return False
    return True


def _overload(name: str, dims, types):
    import torch
    ns, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return None
    for ov in sorted(overloads, key=lambda o: (o != "default", o.endswith("out"), o)):
        func = getattr(packet, ov)
        if _matches(func._schema, dims, types):
            return func
    return None


def _scalar(arg, text, kind):
    """The value of a non-tensor argument from its logged text (`_UNKNOWN` when neither logged nor defaulted)."""
    import torch
    if text in (None, ""):
        if arg.has_default_value():
            return arg.default_value
        return None if str(arg.type).endswith("?") else _UNKNOWN
    t = str(arg.type).rstrip("?")
    try:
        value = ast.literal_eval(text) if text not in ("True", "False") else text == "True"
    except (ValueError, SyntaxError):
        value = text
    if t == "ScalarType" and type(value) is int and 0 <= value < len(SCALAR_TYPE_NAMES):
        return getattr(torch, SCALAR_TYPE_NAMES[value], _UNKNOWN)
    if t == "MemoryFormat" and type(value) is int and 0 <= value < len(_MEMORY_FORMATS):
        return getattr(torch, _MEMORY_FORMATS[value])
    if t == "Layout":
        return torch.strided
    if t == "Device":
        return torch.device("meta")
    if t == "bool" and type(value) is int:
        return bool(value)
    return value


def _meta_tensor(dims, kind, strides):
    import torch
    dtype = getattr(torch, dtype_name(kind))
    if isinstance(strides, list) and len(strides) == len(dims) and all(type(s) is int for s in strides):
        return torch.empty_strided(dims, strides, dtype=dtype, device="meta")
    return torch.empty(dims, dtype=dtype, device="meta")


def _results(value):
    """Results of a meta call as signature values ((shape, dtype) per tensor); None for non-tensors."""
    import torch
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_results(v) for v in value)
    return None


def signature_facts(name: str, args, list_dtype: str = "float32") -> tuple:
    """(`CostFacts`, has its own kernel (not a composite of other ops), results known) of one logged call;
    `list_dtype`: the dtype of tensor lists when the op has no other tensor. Cached per signature."""
    key = (name, signature_key(args), list_dtype)
    hit = _CACHE.get(key)
    if hit is None:
        try:
            hit = _signature_facts(name, args if type(args) is dict else {}, list_dtype)
        except Exception:   # logged arguments no tensor can have (negative sizes, odd nesting): no facts
            hit = _NO_FACTS
        _CACHE[key] = hit
    return hit


def _signature_facts(name: str, args: dict, list_dtype: str) -> tuple:
    import torch
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return op_costs(name, ()), False, False
    strides = args.get("Input Strides") if isinstance(args.get("Input Strides"), list) else []
    concrete = args.get("Concrete Inputs") if isinstance(args.get("Concrete Inputs"), list) else []
    func = _overload(name, dims, types)
    if func is None:   # not an op torch knows with this signature: no facts (nested ops may have them)
        return op_costs(name, ()), False, False
    own_kernel = not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    sig_args, sig_kwargs, meta_args, meta_kwargs, runnable = [], {}, [], {}, True
    for i, a in enumerate(func._schema.arguments[:len(dims)]):
        d, t = dims[i], types[i]
        s = strides[i] if i < len(strides) else None
        if _is_tensor(d, t):
            sig, meta = (tuple(d), dtype_name(t)), _meta_tensor(d, t, s)
        elif t == "TensorList" and isinstance(d, list) and all(isinstance(x, list) for x in d):
            # a list's dtypes are not logged: its tensors take the op's other tensors' dtype, else the
            # trace's most common one
            kind = next((tt for dd, tt in zip(dims, types) if _is_tensor(dd, tt)), list_dtype)
            sig = tuple((tuple(x), dtype_name(kind)) for x in d)
            meta = [_meta_tensor(x, kind, None) for x in d]
        else:
            meta = _scalar(a, concrete[i] if i < len(concrete) else "", t)
            if meta is _UNKNOWN:
                runnable, meta = False, None
            sig = meta if type(meta) in (int, float, bool, str, type(None), list) else str(meta)
        if a.kwarg_only:
            sig_kwargs[a.name], meta_kwargs[a.name] = sig, meta
        else:
            sig_args.append(sig)
            meta_args.append(meta)
    out = None
    if runnable:
        try:
            out = _results(func(*meta_args, **meta_kwargs))
        except Exception:   # no meta kernel, or arguments the trace could not give exactly
            runnable = False
    facts = op_costs(func, tuple(sig_args), sig_kwargs, out)
    # a backend convolution's result is worked out from its arguments when no meta kernel gives it: known, but
    # only by inference (1, not 2), so the 2021 format's rebuild, which reads the unlogged stride from the
    # ops around it, still takes precedence over the default stride
    known = KNOWN_BY_RUNNING if runnable else int(out is None and "->" in facts.shapes and facts.flops > 0)
    return facts, own_kernel, known


def _common_dtype(op_args) -> str:
    """The most common tensor dtype among the logged arguments (float32 when none)."""
    seen: dict = {}
    for a in op_args:
        for d, t in zip(*(a.get(k) or [] for k in ARG_KEYS[:2])) if type(a) is dict else ():
            if _is_tensor(d, t):
                seen[dtype_name(t)] = seen.get(dtype_name(t), 0) + 1
    return max(seen, key=seen.get) if seen else "float32"


def _logged(args) -> tuple:
    """The logged inputs of an op (`ARG_KEYS`) as one hashable text per op: cheap (one repr)."""
    return repr(tuple(args.get(k) for k in ARG_KEYS)) if type(args) is dict else ""


def _json_or_empty(args, key: str) -> str:
    value = args.get(key) if type(args) is dict else None
    return "" if value is None else json.dumps(value, separators=(",", ":"))


def facts_columns(names, op_args, parent: np.ndarray, depth: np.ndarray, thread=None, start=None,
                  end=None) -> tuple[dict, dict, np.ndarray]:
    """(the ops-table columns of `COLUMNS` plus ``input_strides`` and ``concrete_inputs`` (JSON text, "" when
    not logged), counts for the metadata, which ops carry the facts (bool per op)). `op_args` are the ops' ``args`` dicts; `parent` / `depth` their
    nesting (`memlens.io.kineto.attrib.nesting`). Facts are computed once per distinct (name, inputs), except
    for the 2021-era ops the signature cannot price (`memlens.io.kineto.legacy`), rebuilt per op from the
    ops around them: that needs each op's `thread` code and `start` / `end` times (skipped without them)."""
    n = len(names)
    codes, uniques = pd.factorize(pd.Series([(nm, _logged(a)) for nm, a in zip(names, op_args)], dtype=object)) \
        if n else (np.zeros(0, np.int64), [])
    first = np.full(len(uniques), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(n)[::-1]
    first_args = [op_args[i] for i in first]
    has_dims = np.array([type(a) is dict and a.get("Input Dims") is not None for a in first_args], dtype=bool)
    list_dtype = _common_dtype(first_args)
    # a trace without shapes needs no facts (and no torch)
    rows = [signature_facts(names[i], a, list_dtype) if dims else _NO_FACTS
            for i, a, dims in zip(first, first_args, has_dims)]
    facts = pd.DataFrame([r[0] for r in rows], columns=list(COLUMNS)) if rows else \
        pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})

    def per_op(values, dtype):
        return np.asarray(values, dtype=dtype)[codes] if rows else np.zeros(0, dtype)
    own, known, logged = (per_op([r[1] for r in rows], bool), per_op([r[2] for r in rows], bool),
                          per_op(has_dims, bool))
    ran = per_op([r[2] == KNOWN_BY_RUNNING for r in rows], bool)     # not merely inferred
    legacy = {}
    if thread is not None and n:
        unpriced = np.flatnonzero(~ran & np.isin(np.asarray(names, dtype=object), list(LEGACY_OPS)))
        legacy = legacy_facts(unpriced, names, op_args, parent, np.asarray(thread), np.asarray(start),
                              np.asarray(end))
    rebuilt = np.fromiter(legacy, np.int64, len(legacy))
    if len(rebuilt):
        own, known, ran = own.copy(), known.copy(), ran.copy()
        own[rebuilt] = known[rebuilt] = ran[rebuilt] = True
        # an op around a rebuilt one that has a kernel of its own but no result (2021's aten::convolution /
        # aten::_convolution, stride unlogged) would carry facts without flops or output bytes: it yields
        # them to the rebuilt op, which has the same call's complete facts
        for i in rebuilt:
            p = parent[i]
            while p >= 0:
                if own[p] and not ran[p]:
                    own[p] = False
                p = parent[p]
    # an op carries the facts when it has its own kernel and no op around it does
    covered = np.zeros(n, dtype=bool)              # some ancestor has its own kernel
    for d in range(1, int(depth.max()) + 1 if n else 0):
        at = np.flatnonzero(depth == d)
        p = parent[at]
        ok = p >= 0
        covered[at[ok]] = covered[p[ok]] | own[p[ok]]
    carries = own & ~covered
    out = {}
    for col in ("flops", "bytes_read", "bytes_written"):
        out[col] = np.where(carries, per_op(facts[col].to_numpy(np.int64), np.int64), 0).astype(np.int64)
    for col in ("dtype", "shapes"):
        out[col] = per_op(facts[col].to_numpy(object), object)
    for i, f in legacy.items():
        for col in COLUMNS:
            if col in ("dtype", "shapes") or carries[i]:
                out[col][i] = getattr(f, col)
    out["input_strides"] = per_op([_json_or_empty(a, "Input Strides") for a in first_args], object)
    out["concrete_inputs"] = per_op([_json_or_empty(a, "Concrete Inputs") for a in first_args], object)
    counts = {"ops_with_shapes": int(logged.sum()), "ops_carrying_facts": int(carries.sum()),
              "facts_results_unknown": int((carries & ~known).sum()), "facts_rebuilt_2021": len(legacy)}
    return out, counts, carries
