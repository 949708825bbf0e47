"""`memlens.predict(step, gpu="H100", world_size=8)`: sharded training predicted per rank, on the CPU.

Each predicted rank is one ordinary `memlens.predict` run (fake `cuda` tensors, the recorder, the
caching-allocator replay on the modeled GPU) of the user's code inside `environment.rank_world`: torch's
fake process group as that rank of `world_size`. FSDP2 (``fully_shard``) runs its own code, so its sharded
parameters, all-gather outputs and reduce-scatter inputs are allocated as on a GPU, and so is
``ZeroRedundancyOptimizer``'s per-rank optimizer state; DDP's buckets are modelled (`ddp.py`); NCCL's own memory is a stated allowance per rank (`nccl.py`).

Which ranks run (`ranks`):
- ``"auto"`` (default): rank 0 and the last rank run; when they allocate the same sequence of block sizes
  the ranks are taken as symmetric and rank 0 stands for every rank not run (marked so in each result:
  ``stands_for``). Ranks in between are assumed, not checked, to match. When they differ, every rank runs.
- ``"all"``: every rank runs. ``"first"``: only rank 0 runs and stands for all (unchecked).
- a list of ranks: those run; the others are not predicted.

Pipeline parallelism (``torch.distributed.pipelining``, `pipeline`): each stage is a rank with its own
memory, so once a rank builds a ``PipelineStage`` every rank runs under ``"auto"`` and ``"first"`` too (no
rank stands for another), and each result says its stage (`RankResult.stages`).

``steps=N`` calls a step function N times on each rank (default: once, so that a step function that builds its
own model each call is predicted as one step); each rank's `Prediction.step_peaks` then has every call's peak,
the last being the steady state of a step function that keeps its model and optimizer between calls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from memlens.errors import InputError
from memlens.script_runner import run_script


@dataclass
class RankResult:
    """One rank's answer. `ran`: predicted by its own run; else `stands_for` names the rank whose run stands
    for it. Bytes: `peak_allocated`, `peak_reserved`, `device_bytes_needed` (reserved + CUDA context + NCCL)."""

    rank: int
    ran: bool
    stands_for: int
    peak_allocated: int | None
    peak_reserved: int | None
    device_bytes_needed: int | None
    fits: bool | None
    oom: str | None
    error: str | None = None
    stages: list = field(default_factory=list)   # pipeline stage indices this rank ran (torch.distributed.pipelining)


@dataclass
class DistributedPrediction:
    """A prediction of `world_size` ranks: `predictions` (rank -> `Prediction`, for the ranks that ran),
    `results` (one `RankResult` per rank), `symmetry` (how the ranks not run are covered), `nccl`
    (the NCCL allowance and its source), `notes`."""

    world_size: int
    gpu: str
    capacity: int | None
    predictions: dict = field(default_factory=dict)
    results: list = field(default_factory=list)
    symmetry: str = ""
    nccl: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    strategies: set = field(default_factory=set)   # what the code used: "fsdp2", "ddp", "zero", "pp"
    stages: dict = field(default_factory=dict)     # rank -> pipeline stage indices it built
    process_note: str | None = None   # set when it ran in a child process (memlens.prediction.firstuse)

    def fits(self) -> bool | None:
        """True when every predicted rank fits; None when a rank's code failed (no verdict)."""
        if self.errors:
            return None
        return all(r.fits for r in self.results if r.fits is not None)

    @property
    def peak_allocated(self) -> int:
        """The largest predicted peak allocated over the ranks, bytes."""
        return max((r.peak_allocated or 0 for r in self.results), default=0)

    @property
    def peak_reserved(self) -> int:
        """The largest predicted peak reserved over the ranks, bytes."""
        return max((r.peak_reserved or 0 for r in self.results), default=0)

    @property
    def device_bytes_needed(self) -> int:
        """The most device memory any rank needs (peak reserved + CUDA context + NCCL allowance), bytes;
        what `memlens.max_batch(..., world_size=N)` bisects on."""
        return max((r.device_bytes_needed or 0 for r in self.results), default=0)

    def _pipeline_timed(self) -> bool:
        """Whether the step time joins the ranks on one pipeline clock: pipeline stages ran on every rank and
        none failed."""
        return (bool(self.stages) and not self.errors and set(self.predictions) == set(range(self.world_size))
                and all(p.trace is not None for p in self.predictions.values()))

    def step_time(self) -> dict:
        """Per predicted rank (rank -> dict, ns on the modeled GPU clock): step time with collectives on their
        own streams overlapping compute (`steptime`): ``step_ns``, ``compute_ns``, ``comm_ns``,
        ``exposed_comm_ns``, the link and its assumptions, and the per-op ``schedule``. Pipeline runs
        (every stage rank predicted, none failed) join the stages on one clock (`pipeline_time`): ``step_ns``
        is then the rank's end with its waits for activations and gradients, and ``pipeline_step_ns`` (the
        whole step), ``busy_ns``, ``wait_ns``, ``bubble_ns``, ``p2p_ns``, ``own_step_ns`` and
        ``pipeline_actions`` are added."""
        if self._pipeline_timed():
            from memlens.prediction.distributed.pipeline_time import pipeline_step_time
            return pipeline_step_time({r: p.trace for r, p in self.predictions.items()}, self.world_size,
                                      self.gpu)
        from memlens.prediction.distributed.steptime import step_time
        return {r: step_time(p.trace, self.world_size, self.gpu) for r, p in self.predictions.items()
                if p.trace is not None and r not in self.errors}

    def timed_trace(self, rank: int = 0):
        """Rank `rank`'s predicted trace re-stamped onto the step schedule (collectives at their modeled
        start/end on their own streams; for a pipeline run, ops after each wait for a neighbour delayed by
        it): `steptime.onto_step_clock`."""
        from memlens.prediction.distributed.steptime import onto_step_clock
        if rank not in self.predictions or self.predictions[rank].trace is None or rank in self.errors:
            raise InputError(f"rank {rank} was not predicted (ranks run: {sorted(self.predictions)})")
        timing = self.step_time()[rank] if self._pipeline_timed() else None
        return onto_step_clock(self.predictions[rank].trace, self.world_size, self.gpu, timing=timing)

    def summary(self) -> dict:
        """The headline figures and the per-rank table (bytes)."""
        return {"world_size": self.world_size, "gpu": self.gpu, "capacity": self.capacity,
                "fits": self.fits(), "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "symmetry": self.symmetry, "strategies": sorted(self.strategies), "stages": self.stages,
                "nccl": self.nccl, "notes": self.notes, "errors": self.errors,
                "ranks": [vars(r) for r in self.results]}

    def table(self) -> str:
        """The per-rank table as text."""
        from memlens.units import format_bytes
        lines = [f"{'rank':>4}  {'predicted':<13} {'peak allocated':>15} {'peak reserved':>15} "
                 f"{'device need':>13}  fits"]
        for r in self.results:
            how = "ran" if r.ran else f"= rank {r.stands_for}"
            if r.stages:
                how += " stage " + ",".join(map(str, r.stages))
            if r.error:
                lines.append(f"{r.rank:>4}  {how:<13} failed: {r.error}")
                continue
            lines.append(f"{r.rank:>4}  {how:<13} {format_bytes(r.peak_allocated):>15} "
                         f"{format_bytes(r.peak_reserved):>15} {format_bytes(r.device_bytes_needed):>13}  "
                         f"{r.fits}" + (f"  ({r.oom})" if r.oom else ""))
        return "\n".join(lines)


def _runner(target, args):
    """A callable running `target`: a callable, or a script path (run as ``__main__`` with `args`)."""
    if callable(target):
        return target
    script = str(target)
    if not os.path.isfile(script):
        raise InputError(f"{script}: no such script")

    def run_rank_script():
        try:
            run_script(script, args or [])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise RuntimeError(f"the script exited with {exc.code}") from None
    return run_rank_script


def _allocation_signature(prediction) -> tuple:
    """The sequence of (requested bytes, op) of the rank's GPU blocks in allocation order."""
    if prediction.trace is None:
        return ()
    b = prediction.trace.blocks
    b = b[b["device"] == "cuda:0"].sort_values(["alloc_ns", "block_id"])
    return tuple(zip(b["requested_size"].tolist(), b["op"].tolist()))


def _run_rank(run, rank, world_size, gpu, capacity, nccl, options, notes, seen, stages):
    from memlens.prediction.distributed.environment import rank_world
    from memlens.prediction.predictor import Prediction
    from memlens.prediction.steps import run_steps
    from memlens.prediction.distributed.streams import apply_streams, track_allocation_streams
    p = Prediction(gpu, capacity, nccl_bytes=nccl["bytes"], **options)
    error = None
    streams: dict = {}
    try:
        with p:
            streams = track_allocation_streams(p._recorder._session)
            with rank_world(rank, world_size, p._recorder._session, notes, seen, stages):
                # `steps=N`: N calls, each call's peak in `step_peaks` (the last: the steady state); default one
                run_steps(p, run, p.steps or 1)
    except Exception as exc:   # the user's code failed on this rank: report it, no verdict
        error = f"{type(exc).__name__}: {exc}"
    if p.trace is not None:
        from memlens.prediction.distributed.ddp import communication_record
        from memlens.prediction.distributed.pipeline import timeline_record as pipeline_timeline
        moved = apply_streams(p.trace, streams)     # before any replay: results are computed lazily
        p.trace.metadata.setdefault("prediction", {}).update(
            {"rank": rank, "world_size": world_size, "blocks_on_side_streams": moved, "nccl_allowance": nccl,
             "ddp": communication_record(getattr(p, "_session", None)),   # DDP buckets' readiness, for the step time
             **({"pipeline_stages": list(stages),      # and what each stage did when, for the step time
                 "pipeline": pipeline_timeline(getattr(p, "_session", None))} if stages else {})})
    return p, error


def _result(rank, p, error, stands_for, stages=()) -> RankResult:
    if error is not None or p.trace is None:
        return RankResult(rank, stands_for == rank, stands_for, None, None, None, None, None,
                          error or "nothing was predicted", list(stages))
    oom = p.oom
    return RankResult(rank, stands_for == rank, stands_for, p.peak_allocated, p.peak_reserved,
                      p.device_bytes_needed, p.fits(), str(oom) if oom is not None else None, None, list(stages))


def predict_ranks(target, gpu="H100", capacity=None, *, world_size: int, ranks="auto", args=None,
                  nccl_channels: int | None = None, **options) -> DistributedPrediction:
    """Predict `target` (a callable, or a script path with `args`) on every rank of `world_size` (see the
    module docstring for `ranks`). `nccl_bytes` in `options` overrides the NCCL allowance (bytes per rank);
    `nccl_channels` changes its channel count. Other options go to each rank's `memlens.predict`."""
    from memlens.prediction.distributed.nccl import DEFAULT_CHANNELS, nccl_allowance
    from memlens.prediction.predictor import _capacity_bytes
    if not isinstance(world_size, int) or world_size < 1:
        raise InputError(f"world_size must be a positive integer, not {world_size!r}")
    run = _runner(target, args)
    nccl = nccl_allowance(world_size, nccl_channels or DEFAULT_CHANNELS)
    if "nccl_bytes" in options:
        nccl = {"bytes": int(options.pop("nccl_bytes")), "source": "given by the caller (nccl_bytes)"}
    if ranks == "auto":
        first = [0] if world_size == 1 else [0, world_size - 1]
    elif ranks == "all":
        first = list(range(world_size))
    elif ranks == "first":
        first = [0]
    elif isinstance(ranks, str):
        raise InputError(f"ranks must be 'auto', 'all', 'first' or a list of ranks, not {ranks!r}")
    else:
        first = sorted({int(r) for r in ranks})
        if not first or first[0] < 0 or first[-1] >= world_size:
            raise InputError(f"ranks {ranks!r} must be within 0..{world_size - 1}")
    out = DistributedPrediction(world_size, str(gpu), _capacity_bytes(capacity), nccl=nccl)

    def run_ranks(rs):
        for r in rs:
            stages: list = []
            out.predictions[r], err = _run_rank(run, r, world_size, gpu, capacity, nccl, options, out.notes,
                                                out.strategies, stages)
            if stages:
                out.stages[r] = stages
            if err:
                out.errors[r] = err

    run_ranks(first)
    ran = list(first)
    if "pp" in out.strategies and ranks in ("auto", "first") and world_size > 1:
        run_ranks([r for r in range(world_size) if r not in out.predictions])
        ran = list(range(world_size))
        out.symmetry = ("pipeline stages (torch.distributed.pipelining): every rank ran, each stage's memory "
                        "differs" + (" (ranks='first' overridden)" if ranks == "first" else ""))
    elif ranks == "auto" and world_size > 1 and not out.errors:
        if _allocation_signature(out.predictions[0]) == _allocation_signature(out.predictions[world_size - 1]):
            out.symmetry = (f"symmetric: rank 0 and rank {world_size - 1} allocate the same sequence of blocks; "
                            f"rank 0 stands for ranks 1..{world_size - 2} (assumed, not run)"
                            if world_size > 2 else "symmetric: both ranks ran and allocate the same blocks")
        else:
            out.symmetry = "asymmetric: rank 0 and the last rank differ, so every rank ran"
            run_ranks(range(1, world_size - 1))
            ran = list(range(world_size))
    elif ranks == "auto" and world_size > 1:
        out.symmetry = "not checked: the code failed on a rank that ran (no verdict)"
    elif ranks == "first" and world_size > 1:
        out.symmetry = "assumed symmetric (ranks='first'): rank 0 stands for every rank, not checked"
    elif ranks == "all" or world_size == 1:
        out.symmetry = "every rank ran"
    elif ranks != "auto":
        out.symmetry = f"only ranks {ran} ran; the others are not predicted"
    for r in range(world_size):
        if r in out.predictions:
            out.results.append(_result(r, out.predictions[r], out.errors.get(r), r, out.stages.get(r, ())))
        elif ranks in ("auto", "first"):
            out.results.append(_result(r, out.predictions[0], out.errors.get(0), 0))
    out.notes = sorted(set(out.notes))
    return out
