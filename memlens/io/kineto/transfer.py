"""Which ops of a Kineto trace copied over the host link, and which ran on the host only.

Memcpy activities name their direction: NVIDIA (CUPTI) ``"Memcpy HtoD (Pageable -> Device)"``,
``"Memcpy DtoH (Device -> Pinned)"``, ``"Memcpy DtoD (Device -> Device)"`` (2021 traces the same), ROCm
``"Memcpy HtoD (Host -> Device)"`` with ``args["kind"]`` ``"HtoD"`` / ``"DtoH"`` / ``"DtoD"`` (the real
real Kineto profiles), and roctracer's ``CopyHostToDevice`` / ``CopyDeviceToHost``. The
kind argument decides when present, else the name. Device-to-device, host-to-host and peer copies are not
host-link transfers.

Per op (`transfer_device_columns`), on the op that carries the cost facts
(`memlens.io.kineto.facts.facts_columns`: on each nesting path the outermost op with a kernel of its own):

- ``transfer``: "h2d" / "d2h" when a memcpy over the host link was launched by it or an op nested in it (both
  directions: the one with the longer summed copy time), else "";
- ``device``: "cpu" when the trace records GPU activity and neither it nor any op nested in it launched any
  (a host-side op: data loading, a CPU tensor's arithmetic), else "".

The cost model prices a "h2d" / "d2h" op at the host link's pageable rate and keeps "cpu" ops off the GPU
clock (`memlens.devicetime.costmodel.device_times`).
"""
from __future__ import annotations

import numpy as np

DIRECTIONS = ("", "h2d", "d2h")      # codes 0, 1, 2
_TOKENS = ((1, ("HtoD", "HostToDevice", "H2D")), (2, ("DtoH", "DeviceToHost", "D2H")))


def direction_code(name, args: dict) -> int:
    """0 (not a host-link copy), 1 (host to device) or 2 (device to host) of one memcpy activity, from
    ``args["kind"]`` (or ``"memcpy kind"``) when it is text, else from the activity's name."""
    kind = args.get("kind", args.get("memcpy kind"))
    text = kind if isinstance(kind, str) else str(name or "")
    for code, tokens in _TOKENS:
        if any(t in text for t in tokens):
            return code
    return 0


def fact_carrier(carries: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per op, the index of the op on its path to the top (itself included) that carries the facts, or -1.
    `parent` is -1 at top level; a carrier's descendants never carry (they are covered by it)."""
    n = len(carries)
    carrier = np.where(carries, np.arange(n), -1).astype(np.int64)
    for d in range(1, int(depth.max()) + 1 if n else 0):      # top down: a parent's carrier is final
        at = np.flatnonzero((depth == d) & (parent >= 0))
        above = carrier[parent[at]]
        carrier[at] = np.where(above >= 0, above, carrier[at])
    return carrier


def transfer_device_columns(act_op: np.ndarray, act_direction: np.ndarray, act_ns: np.ndarray,
                            carries: np.ndarray, parent: np.ndarray, depth: np.ndarray,
                            activity_count: np.ndarray) -> dict:
    """The ``transfer`` and ``device`` ops columns (object arrays of str).

    Per activity: `act_op` the op that launched it (-1 for none), `act_direction` its `direction_code`,
    `act_ns` its duration in ns. Per op: `carries` (bool) whether it carries the cost facts, `parent` /
    `depth` the nesting, `activity_count` the activities it and the ops nested in it launched."""
    n = len(carries)
    carrier = fact_carrier(np.asarray(carries, bool), parent, depth)
    ns = np.zeros((3, n), dtype=np.int64)           # summed copy ns (+1 each) per direction, per carrier
    copy = (act_op >= 0) & (act_direction > 0)
    owner = carrier[act_op[copy]] if n else np.zeros(0, np.int64)
    ok = owner >= 0
    np.add.at(ns, (act_direction[copy][ok].astype(np.int64), owner[ok]), np.maximum(act_ns[copy][ok], 0) + 1)
    code = np.where(ns[1] + ns[2] == 0, 0, np.where(ns[1] >= ns[2], 1, 2))
    transfer = np.asarray(DIRECTIONS, dtype=object)[code]
    host_only = np.asarray(carries, bool) & (activity_count == 0) & (len(act_op) > 0)
    device = np.where(host_only, "cpu", "").astype(object)
    return {"transfer": transfer, "device": device}
