"""`memlens.predict_strategies`: a what-if table over sharding strategies and world sizes, predicted per rank.

The user gives `build_model()` (an ordinary ``nn.Module`` built on the CPU or ``cuda``; memlens moves it to
``cuda``, which inside the prediction is the fake device) and `step(model, optimizer)` (or
`step(model, optimizer, batch)` when `batch` is given). For each strategy memlens applies torch's own API
to the model, inside `memlens.predict(..., world_size=N)` (torch's fake process group):

- ``"ddp"``: ``DistributedDataParallel(model)``: a full replica per rank, DDP's gradient buckets modelled
  (`memlens.prediction.distributed.ddp`).
- ``"fsdp2"``: ``fully_shard`` on each repeated block (the children of the model's largest ``nn.ModuleList``,
  or what `layers(model)` returns), then on the root.
- ``"fsdp2+ac"``: as ``"fsdp2"`` with each block first wrapped for activation checkpointing by torch's
  ``apply_activation_checkpointing`` (``checkpoint_wrapper``, non-reentrant ``torch.utils.checkpoint``).
- ``"zero1"``: ``DistributedDataParallel`` plus ``ZeroRedundancyOptimizer`` (torch's ZeRO-1: optimizer state
  sharded by parameter, gradients and parameters replicated).
- ``"zero2"``: ZeRO stage 2 (`memlens.prediction.distributed.zero2`): parameters replicated in one flat buffer,
  each gradient reduced into this rank's shard as backward makes it, optimizer state for the shard only
  (torch has no ZeRO-2 of its own).
- ``"fsdp2+noreshard"``: FSDP2 with ``reshard_after_forward=False`` (FSDP1's ``SHARD_GRAD_OP``): the unsharded
  parameters kept from forward to backward, but between steps every state is sharded, as ZeRO-3's. Before this
  row had its own name it was offered as ``"zero2"``; ask for ``"fsdp2+noreshard"`` to get what that gave.

Not offered: tensor parallel (``parallelize_module`` needs a plan naming the model's own submodules,
which memlens cannot choose for an arbitrary model; predict such a script with ``memlens.predict(world_size=N)``),
and pipeline parallelism: a stage split needs the model's own forward cut into stage modules and a schedule
driving ``step`` (not ``step(model, optimizer)``); predict a ``torch.distributed.pipelining`` script with
``memlens.predict(world_size=N)``, where every stage rank runs (`memlens.prediction.distributed.pipeline`).
"""
from __future__ import annotations

from typing import Callable

from memlens.errors import InputError

STRATEGIES = ("ddp", "fsdp2", "fsdp2+ac", "zero1", "zero2", "fsdp2+noreshard")
DEFAULT_STRATEGIES = ("ddp", "fsdp2", "fsdp2+ac", "zero1")
# what each row keeps per rank, in the words a plan or table prints beside its name
STRATEGY_WORDS = {
    "ddp": "DDP: a full replica per rank",
    "fsdp2": "FSDP2, ZeRO-3: parameters, gradients and optimizer state sharded",
    "fsdp2+ac": "FSDP2 with every block checkpointed",
    "zero1": "ZeRO-1: optimizer state sharded",
    "zero2": "ZeRO-2: gradients and optimizer state sharded, parameters replicated",
    "fsdp2+noreshard": "FSDP2 without resharding after forward: parameters gathered from forward to backward",
}


def repeated_blocks(model) -> list:
    """The model's repeated blocks: the children of its ``nn.ModuleList`` holding the most parameters
    (``model.layers`` of a Llama-style model, ``encoder.layers`` of ``nn.TransformerEncoder``)."""
    import torch.nn as nn
    best, best_n = [], -1
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m):
            n = sum(p.numel() for p in m.parameters())
            if n > best_n:
                best, best_n = list(m), n
    return best


def _blocks(model, layers):
    blocks = list(layers(model)) if layers is not None else repeated_blocks(model)
    if not blocks:
        raise InputError("no repeated blocks to shard: the model has no nn.ModuleList; pass layers=fn(model) "
                         "returning the modules to shard one by one")
    return blocks


def apply_strategy(strategy: str, model, optimizer_class, optimizer_kwargs: dict, layers=None):
    """Apply `strategy` to `model` (already on ``cuda``) with torch's APIs; returns (module to call,
    optimizer). Must run inside a rank's world (torch.distributed initialised)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    if strategy == "ddp":
        wrapped = DDP(model)
        return wrapped, optimizer_class(wrapped.parameters(), **optimizer_kwargs)
    if strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        wrapped = DDP(model)
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=optimizer_class,
                                                **optimizer_kwargs)
    if strategy == "zero2":
        from memlens.prediction.distributed.zero2 import zero2_optimizer
        return model, zero2_optimizer(model, optimizer_class, optimizer_kwargs)
    if strategy in ("fsdp2", "fsdp2+ac", "fsdp2+noreshard"):
        from torch.distributed.fsdp import fully_shard
        blocks = _blocks(model, layers)
        if strategy == "fsdp2+ac":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointWrapper, apply_activation_checkpointing)
            chosen = {id(b) for b in blocks}
            apply_activation_checkpointing(model, check_fn=lambda m: id(m) in chosen)
            blocks = [m for m in model.modules()
                      if isinstance(m, CheckpointWrapper) and id(m._checkpoint_wrapped_module) in chosen]
        reshard = strategy != "fsdp2+noreshard"
        for b in blocks:
            fully_shard(b, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        return model, optimizer_class(model.parameters(), **optimizer_kwargs)
    raise InputError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")


def _strategy_step(build_model, step, strategy, optimizer_class, optimizer_kwargs, layers, keep):
    """The per-rank code of one strategy: build, apply, step; `keep` holds the model and optimizer alive
    after the step (a rank holds its parameters, gradients and optimizer state between steps)."""
    def run(*batch):
        model = build_model().cuda()
        module, opt = apply_strategy(strategy, model, optimizer_class, optimizer_kwargs, layers)
        step(module, opt, *batch)
        keep.append((module, opt))
    return run


def held_bytes(prediction, category: str) -> int:
    """Bytes of `category` blocks (``parameter``, ``gradient``, ``optimizer_state``) still allocated on the
    rank's GPU at the end of the prediction."""
    b = prediction.trace.blocks
    b = b[(b["device"] == "cuda:0") & (b["category"] == category) & b["free_ns"].isna()]
    return int(b["requested_size"].sum())


def predict_strategies(build_model: Callable[[], object], step: Callable, gpu="H100", capacity=None, *,
                       world_sizes=(8,), strategies=DEFAULT_STRATEGIES, optimizer=None,
                       optimizer_kwargs: dict | None = None, layers: Callable | None = None, batch: int | None = None,
                       max_batch: bool = False, ranks="auto", return_predictions: bool = False,
                       **options):
    """Predict every (strategy, world size) and return one row each as a ``pandas.DataFrame``.

    `build_model()` returns a fresh ``nn.Module``; `step(model, optimizer)` runs one training step (with
    `batch` given: `step(model, optimizer, batch)`). `optimizer`: an optimizer class (default
    ``torch.optim.AdamW``) made with `optimizer_kwargs`. `layers(model)`: the blocks FSDP2 shards one by one
    (default: `repeated_blocks`). `ranks` as `memlens.predict(world_size=N)` (default ``"auto"``: rank 0 and
    the last run, every rank when they differ; ``"first"``: rank 0 stands for all, unchecked, half the time). With `max_batch=True` (needs
    `batch`, the smallest size tried) each row also gets the largest batch that fits (`memlens.max_batch`).

    Columns: strategy, world_size, peak_allocated, peak_reserved, device_bytes_needed (bytes, max over the
    ranks), fits, oom (the first op that would not fit, on the first rank that does not), parameter_bytes,
    gradient_bytes, optimizer_state_bytes (held on rank 0 after the step), max_batch, error (a strategy that
    failed gives its error here, not an exception, and NaN bytes). With `return_predictions=True` returns ``(df, {(strategy,
    world size): DistributedPrediction})``.
    """
    import pandas as pd
    import torch

    from memlens.prediction.api import predict
    from memlens.prediction.sweep import max_batch as sweep_max_batch
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown strategies {unknown}: choose from {', '.join(STRATEGIES)} (tensor parallel: "
                         "predict your own script with memlens.predict(world_size=N))")
    if max_batch and batch is None:
        raise InputError("max_batch=True needs batch= (the smallest batch to try)")
    opt_class = optimizer or torch.optim.AdamW
    opt_kwargs = dict(optimizer_kwargs or {})
    rows, preds = [], {}
    for ws in world_sizes:
        for strategy in strategies:
            row = {"strategy": strategy, "world_size": int(ws), "peak_allocated": None, "peak_reserved": None,
                   "device_bytes_needed": None, "fits": None, "oom": None, "parameter_bytes": None,
                   "gradient_bytes": None, "optimizer_state_bytes": None, "max_batch": None, "error": None}
            keep: list = []
            run = _strategy_step(build_model, step, strategy, opt_class, opt_kwargs, layers, keep)
            try:
                args = () if batch is None else (batch,)
                d = predict(lambda: run(*args), gpu=gpu, capacity=capacity, world_size=int(ws), ranks=ranks,
                            **options)
                preds[(strategy, int(ws))] = d
                keep.clear()
                if d.errors:
                    row["error"] = "; ".join(f"rank {r}: {e}" for r, e in sorted(d.errors.items()))
                else:
                    row.update(peak_allocated=d.peak_allocated, peak_reserved=d.peak_reserved,
                               device_bytes_needed=d.device_bytes_needed, fits=d.fits(),
                               oom=next((r.oom for r in d.results if r.oom), None))
                    first = d.predictions[min(d.predictions)]
                    for c in ("parameter", "gradient", "optimizer_state"):
                        row[f"{c}_bytes"] = held_bytes(first, c)
                    if max_batch:
                        found = sweep_max_batch(lambda n: run(n), capacity=capacity,
                                                gpu=gpu, low=batch, world_size=int(ws), ranks=ranks, **options)
                        keep.clear()
                        row["max_batch"] = found["max"]
            except Exception as exc:     # one strategy failing must not lose the others' rows
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("oom", "error", "fits", "max_batch"):     # None stays None (not NaN) where nothing applies
        df[col] = pd.Series([row[col] for row in rows], dtype=object)
    return (df, preds) if return_predictions else df

