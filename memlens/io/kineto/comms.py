"""The collectives of a Kineto / Chrome trace: which ops communicate, what kind of collective, how many bytes
and over how many ranks.

PyTorch's process groups wrap every collective they run (``c10d::allreduce_``, ``c10d::_allgather_base_``,
functional collectives ...) in a ``record_param_comms`` range whose arguments say what it moved:
``Collective name`` (``allreduce``, ``_allgather_base``, ``reduce_scatter_tensor_coalesced``, ``all_to_all``
...), ``In msg nelems`` / ``Out msg nelems`` (elements in and out, this rank), ``dtype`` (``Float``,
``BFloat16`` ...) and ``Group size`` (ranks in the process group). That op carries the collective
(`comms_columns`); the c10d op around it carries none, so each collective is priced once. The message
follows `memlens.devicetime.collectives`: all-gather the gathered output, reduce-scatter the unreduced input,
all-reduce / broadcast / all-to-all the tensor (the input). Without ``Group size`` the trace's
``distributedInfo`` ``world_size`` stands in.
"""
from __future__ import annotations

import numpy as np

from memlens.opfacts.dtypes import dtype_name, itemsize

COMMS_OP = "record_param_comms"
COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype")
# name fragment -> collective kind, most specific first ("reduce_scatter" before "all_reduce"'s "reduce")
_KINDS = (("all_to_all", "all_to_all"), ("alltoall", "all_to_all"), ("reduce_scatter", "reduce_scatter"),
          ("allgather", "all_gather"), ("all_gather", "all_gather"), ("allreduce", "all_reduce"),
          ("all_reduce", "all_reduce"), ("broadcast", "broadcast"))


def collective_kind(name) -> str:
    """The kind of a collective from its ``Collective name`` (or an op name): all_reduce, all_gather,
    reduce_scatter, broadcast, all_to_all, or "" for anything else (send / recv / barrier ...)."""
    low = str(name or "").lower()
    return next((kind for frag, kind in _KINDS if frag in low), "")


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return -1


def comms_columns(names: list, op_args: list, world_size=None) -> dict:
    """Per op: ``collective`` (kind, "" for an op that is not one), ``collective_bytes`` (the message, bytes)
    and ``group_size`` (ranks; 0 when unknown) from each ``record_param_comms`` op's arguments (module
    docstring). `world_size`: the trace's ``distributedInfo`` world size, for a collective without a group
    size."""
    n = len(names)
    kind = np.full(n, "", dtype=object)
    nbytes = np.zeros(n, dtype=np.int64)
    group = np.zeros(n, dtype=np.int64)
    fallback = max(_int(world_size), 0)
    for i in np.flatnonzero(np.asarray(names, dtype=object) == COMMS_OP) if n else ():
        args = op_args[i] if type(op_args[i]) is dict else {}
        k = collective_kind(args.get("Collective name"))
        if not k:
            continue
        dtype = dtype_name(str(args.get("dtype", "")))
        size = itemsize(dtype) if dtype else 0
        elements = _int(args.get("Out msg nelems" if k == "all_gather" else "In msg nelems"))
        ranks = _int(args.get("Group size"))
        if size <= 0 or elements < 0:
            continue
        kind[i], nbytes[i], group[i] = k, elements * size, ranks if ranks > 0 else fallback
    return {"collective": kind, "collective_bytes": nbytes, "group_size": group}
