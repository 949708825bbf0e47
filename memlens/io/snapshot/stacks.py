"""What each stack of a CUDA snapshot says, one row per stack: the phase its frames name, whether it runs
under autograd's AccumulateGrad or a cuBLAS / cuDNN workspace, what model or optimizer construction made,
and which model-level forward call (and line in it) it sits in. `memlens.io.snapshot.phases` turns these
facts into the phases of the run, `memlens.io.snapshot.story` into every block's category.

Big snapshots have hundreds of thousands of stacks, so each distinct frame name and file is tested once,
by Arrow's compiled kernels where the answer is certainly that of the Python predicate (`_Distinct`).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

PHASE_NAMES = ("forward", "backward", "optimizer_step", "zero_grad")
_WORKSPACE = ("cublas", "cudnn", "CUDABlasHandle", "getCurrentCUDABlasHandle", "cublasLt", "workspace")
# a Python function named for a key/value cache: vLLM's CacheEngine._allocate_kv_cache, SGLang's / TensorRT-LLM's
# KVCache classes' methods, HF's past_key_values handling, a model's own init_kv_cache
KV_CACHE_NAMES = r"kv_?caches?|past_key_values"   # matched ignoring case


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def stack_facts(stacks: pd.DataFrame | None, codes=None) -> pd.DataFrame:
    """Per stack_id: ``phase`` (a name of `PHASE_NAMES` or ""), ``accumulate_grad``, ``workspace``,
    ``setup`` (what model / optimizer construction makes, outside backward / optimizer step / zero_grad:
    "parameter" for Module.to / _apply, a torch.nn module's constructor, a constructor run under
    ``with torch.device(...)``, weight init or loading; "optimizer_state" under a function that builds an
    optimizer; else ""), ``optimizer_code`` (frames of an optimizer's code, torch's or the user's, outside a
    forward / backward pass: `memlens.io.snapshot.optimizer`), ``model_key`` (outermost module forward function and its caller, "" outside a
    module call) and ``model_line`` (line executing in that forward, -1 when none).

    Vectorised: each distinct frame name / file name is tested once, and per-stack answers are reductions
    over the frames of each stack (big snapshots have hundreds of thousands of stacks). `codes` (a
    `memlens.io.snapshot.frames.StackCodes` of these rows, from the importer) saves factorizing the
    name and filename columns again."""
    cols = ("stack_id", "phase", "accumulate_grad", "workspace", "setup", "model_key", "model_line", "optimizer_code")
    if stacks is None or len(stacks) == 0:
        return pd.DataFrame({c: [] for c in cols})
    st = stacks if _sorted_by_stack_and_depth(stacks) else stacks.sort_values(["stack_id", "depth"], kind="stable")
    ids = st["stack_id"].to_numpy(dtype=np.int64)
    n = len(ids)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ids)) + 1])
    ends = np.append(starts[1:], n)
    if codes is not None and st is stacks:
        name_codes, name_u, file_codes, file_u = codes.name_codes, codes.names, codes.file_codes, codes.files
    else:
        name_codes, name_u = pd.factorize(_as_str_objects(st["name"]))
        file_codes, file_u = pd.factorize(_as_str_objects(st["filename"]))
    if codes is not None:  # all str already, and maybe with their Arrow array
        names = _Distinct(name_u, codes.plain_names)
    else:
        names = _Distinct([str(x) for x in name_u])
    files = _Distinct([_norm(str(f)) for f in file_u])
    name_u, file_u = names.values, files.values
    lines = st["line"].to_numpy(dtype=np.int64)

    def by_name(pred, kernel):
        return names.test(pred, kernel)[name_codes]

    def by_file(pred, kernel):
        return files.test(pred, kernel)[file_codes]

    def any_(mask):  # per stack: does any of its frames match
        return np.logical_or.reduceat(mask, starts)

    def has(text):
        return lambda a: pc.match_substring(a, text)

    def either(*kernels):
        return lambda a: _any_of(a, kernels)

    def equals(*values):
        return lambda a: pc.is_in(a, value_set=pa.array(values, pa.string()))

    def suffix(text):
        return lambda a: pc.ends_with(a, text)

    is_py = by_file(lambda f: f.endswith(".py"), suffix(".py"))
    module_py = by_file(lambda f: f.endswith("torch/nn/modules/module.py"), suffix("torch/nn/modules/module.py"))
    optim_file = by_file(lambda f: "/torch/optim/" in f or f.startswith("torch/optim/"),
                         either(has("/torch/optim/"), lambda a: pc.starts_with(a, "torch/optim/")))
    zero = by_name(lambda x: x == "zero_grad", equals("zero_grad"))
    call = by_name(lambda x: x in ("_call_impl", "_wrapped_call_impl"),
                   equals("_call_impl", "_wrapped_call_impl")) & module_py
    engine = by_name(lambda x: "torch::autograd::Engine::" in x or "AccumulateGrad" in x,
                     either(has("torch::autograd::Engine::"), has("AccumulateGrad")))
    py_backward = by_name(lambda x: x in ("backward", "_engine_run_backward"),
                          equals("backward", "_engine_run_backward")) & by_file(
        lambda f: "/torch/autograd/" in f or f.endswith("torch/_tensor.py"),
        either(has("/torch/autograd/"), suffix("torch/_tensor.py")))
    in_optim = any_(optim_file)
    phase = np.select(
        [in_optim & any_(zero & by_file(lambda f: "/optim/" in f, has("/optim/"))), in_optim, any_(zero),
         any_(engine) | any_(py_backward), any_(call)],
        ["zero_grad", "optimizer_step", "zero_grad", "backward", "forward"], "").astype(object)

    builds_optimizer = any_(is_py & by_name(
        lambda x: "optimizer" in x.lower() and x not in ("step", "zero_grad"),
        lambda a: pc.and_(pc.match_substring(pc.ascii_lower(a), "optimizer"),
                          pc.invert(equals("step", "zero_grad")(a)))))
    init = by_name(lambda x: x == "__init__", equals("__init__"))
    device_file = by_file(lambda f: f.endswith("torch/utils/_device.py"), suffix("torch/utils/_device.py"))
    under_device = any_(is_py & device_file) & any_(is_py & init)
    makes_weights = (any_(module_py & by_name(lambda x: x in ("_apply", "convert", "to", "cuda", "to_empty"),
                                              equals("_apply", "convert", "to", "cuda", "to_empty")))
                     | any_(by_file(lambda f: "/torch/nn/modules/" in f, has("/torch/nn/modules/")) & init)
                     | any_(by_file(lambda f: f.endswith("torch/nn/parameter.py"), suffix("torch/nn/parameter.py")))
                     | any_(is_py & by_name(lambda x: _WEIGHT_NAMES.search(x),
                                            lambda a: pc.match_substring_regex(a, _WEIGHT_NAMES.pattern))))
    from memlens.io.snapshot.optimizer import optimizer_code
    is_optimizer = optimizer_code(by_name, by_file, any_, phase)
    skip = np.isin(phase, ["backward", "optimizer_step", "zero_grad"])
    setup = np.select([skip, builds_optimizer, under_device | makes_weights], ["", "optimizer_state", "parameter"],
                      "").astype(object)

    # outermost module call: the last _call_impl frame (frames are innermost first); the model's forward is
    # the nearest Python frame inside it (not module.py), its caller the nearest Python frame outside it
    idx = np.arange(n, dtype=np.int64)
    outer = np.maximum.reduceat(np.where(call, idx, -1), starts)
    last_inner = np.maximum.accumulate(np.where(is_py & ~module_py, idx, -1))
    next_py = np.minimum.accumulate(np.where(is_py, idx, n)[::-1])[::-1]
    keys = np.full(len(starts), "", dtype=object)
    model_line = np.full(len(starts), -1, dtype=np.int64)
    for k in np.flatnonzero(outer > starts):
        o, a, b = int(outer[k]), int(starts[k]), int(ends[k])
        inner = int(last_inner[o - 1])
        if inner < a:
            continue
        caller = int(next_py[o + 1]) if o + 1 < b else n
        where = f"{file_u[file_codes[caller]]}:{lines[caller]}" if caller < b else ""
        keys[k] = f"{file_u[file_codes[inner]]}:{name_u[name_codes[inner]]}<-{where}"
        model_line[k] = lines[inner]
    return pd.DataFrame({
        "stack_id": ids[starts], "phase": phase, "accumulate_grad": any_(by_name(lambda x: "AccumulateGrad" in x, has("AccumulateGrad"))),
        "workspace": any_(by_name(lambda x: any(w in x for w in _WORKSPACE),
                                  lambda a: _any_of(a, [has(w) for w in _WORKSPACE]))), "setup": setup,
        "model_key": keys, "model_line": model_line, "optimizer_code": is_optimizer,
        "kv_cache": any_(is_py & by_name(lambda x: _KV_CACHE.search(x) is not None,
                                         lambda a: pc.match_substring_regex(a, KV_CACHE_NAMES, ignore_case=True)))})


def _sorted_by_stack_and_depth(stacks: pd.DataFrame) -> bool:
    """True when rows are already in (stack_id, depth) order with no repeated pair (as importers write
    them), so that the stable sort would only copy the same rows."""
    ids = stacks["stack_id"].to_numpy(dtype=np.int64)
    depth = stacks["depth"].to_numpy(dtype=np.int64)
    step_id, step_depth = np.diff(ids), np.diff(depth)
    return bool(np.all((step_id > 0) | ((step_id == 0) & (step_depth > 0))))


def _as_str_objects(column: pd.Series) -> np.ndarray:
    """The column as an object array of Python str. A column that already holds only str is used as it
    is: pandas' ``astype(str)`` would copy every string into Arrow and back (for a snapshot with
    millions of frames, seconds and hundreds of MB)."""
    values = column.to_numpy(dtype=object)
    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        return values
    return column.astype(str).to_numpy(dtype=object)


class _Distinct:
    """Distinct strings, each tested once per predicate: the plain ones (ASCII without a newline: nearly all
    frame names and files) by Arrow's compiled kernels, the rest (other characters, a lone surrogate Arrow
    cannot hold, a newline where Python's ``$`` and RE2's differ) by the same predicate in Python, so the
    answers are those of the Python predicate for every string."""

    def __init__(self, values, plain_arrow: tuple | None = None):
        """`values`: a list or object array of str; `plain_arrow`: (bool per value: plain, Arrow string array of
        the plain values in order), when the caller has them (the compiled snapshot reader builds them)."""
        self.values = values
        if plain_arrow is not None:
            plain, self._arrow = plain_arrow
        else:
            joined = "\0".join(values)  # one C-speed look at all of them first: usually every one is plain
            if joined.isascii() and "\n" not in joined:
                plain = np.ones(len(values), dtype=bool)
            else:
                plain = np.fromiter((v.isascii() and "\n" not in v for v in values), dtype=bool,
                                    count=len(values))
        self._plain_at = np.flatnonzero(plain)
        self._other_at = np.flatnonzero(~plain)
        if plain_arrow is None:
            self._arrow = pa.array(values if len(self._other_at) == 0 else [values[i] for i in self._plain_at],
                                   type=pa.string())

    def test(self, pred, kernel) -> np.ndarray:
        """bool per value: ``pred(value)``, computed by ``kernel`` (Arrow array -> bool array) where it can."""
        out = np.zeros(len(self.values), dtype=bool)
        if len(self._plain_at):
            out[self._plain_at] = np.asarray(kernel(self._arrow).to_numpy(zero_copy_only=False), dtype=bool)
        for i in self._other_at:
            out[i] = bool(pred(self.values[i]))
        return out


def _any_of(arrow_values, kernels):
    result = kernels[0](arrow_values)
    for k in kernels[1:]:
        result = pc.or_(result, k(arrow_values))
    return result


_KV_CACHE = re.compile(KV_CACHE_NAMES, re.IGNORECASE)
_WEIGHT_NAMES = re.compile(r"(^|_)(init_weights?|init_weight_list|create_weights|reset_parameters|"
                           r"load_state_dict|_load_from_state_dict|from_pretrained|load_checkpoint)($|_)")
