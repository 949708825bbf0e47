"""One advised plan: the changes (`checkpoint`, `conf`, `strategy`), their verified prediction, how to apply
them to a model (`apply`) and the same changes as code (`snippet`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Plan:
    """A set of changes and what the prediction with them applied says (bytes, ns on the modeled clock).

    `checkpoint`: ``named_modules`` name -> ``"full"`` | ``"selective"`` | ``"offload"``; `conf`: the
    ``PYTORCH_CUDA_ALLOC_CONF`` it runs under ("" = torch's defaults); `strategy`: the sharding strategy of
    `memlens.predict_strategies` (None on one GPU); `offload`: the planned saved tensors
    (`memlens.advice.offload.OffloadTensor` rows) of the ``"offload"`` modules; `autocast`: ``"bfloat16"`` |
    ``"float16"`` runs the model's forward under ``torch.autocast("cuda", dtype)``; `optimizer_kwargs`: arguments the optimizer is made with
    (``foreach=False``: no foreach temporaries); `micro_batch` and `accumulate`: the step runs on
    `micro_batch` samples `accumulate` times, the optimizer stepping once (the global batch kept).
    `peak_allocated` / `peak_reserved` are per rank (the largest over the ranks), `device_bytes_needed` adds
    the CUDA context and NCCL buffers; `fits`: the allocator replay at the capacity raises no OOM;
    `step_ns` is the modeled step time and `baseline_step_ns` the baseline's; `recompute_ns` the solver's
    estimate of the time checkpointing or offloading adds; `freed` names what each change
    takes off the peak; `verified` is True once the prediction was re-run with the plan applied; `trace` is
    that prediction's trace (of the rank needing the most memory), kept only for the baseline and the plans
    on the memory / time frontier (`memlens.advice.timelines`), else None."""

    checkpoint: dict = field(default_factory=dict)
    offload: tuple = ()
    conf: str = ""
    strategy: str | None = None
    autocast: str | None = None
    optimizer_kwargs: dict = field(default_factory=dict)
    micro_batch: int | None = None
    accumulate: int = 1
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    device_bytes_needed: int | None = None
    fits: bool | None = None
    step_ns: int | None = None
    baseline_step_ns: int | None = None
    recompute_ns: int = 0
    freed: list = field(default_factory=list)
    verified: bool = False
    error: str | None = None
    trace: object = field(default=None, repr=False, compare=False)

    @property
    def changes(self) -> str:
        """The changes in words ("no change" for the baseline)."""
        words = []
        if self.strategy:
            from memlens.prediction.distributed.strategies import STRATEGY_WORDS
            what = STRATEGY_WORDS.get(self.strategy)
            words.append(f"shard with {self.strategy}" + (f" ({what})" if what else ""))
        full = sorted(n for n, m in self.checkpoint.items() if m == "full")
        selective = sorted(n for n, m in self.checkpoint.items() if m == "selective")
        offload = sorted(n for n, m in self.checkpoint.items() if m == "offload")
        if full:
            words.append(f"checkpoint {_names(full)} (full)")
        if selective:
            words.append(f"checkpoint {_names(selective)} (selective: GEMM and attention outputs kept)")
        if offload:
            moved = sum(t.size for t in self.offload)
            words.append(f"offload {len(self.offload)} planned saved activations ({moved:,} bytes) of "
                         f"{_names(offload)} to host memory, each prefetched at a planned module's backward")
        if self.micro_batch is not None:
            words.append(f"micro-batch {self.micro_batch} x {self.accumulate} accumulation steps")
        if self.autocast:
            words.append(f"autocast {self.autocast} (changes the numerics)")
        if self.optimizer_kwargs:
            words.append("optimizer " + ", ".join(f"{k}={v}" for k, v in sorted(self.optimizer_kwargs.items())))
        if self.conf:
            words.append(f"PYTORCH_CUDA_ALLOC_CONF={self.conf}")
        return "; ".join(words) or "no change"

    @property
    def delta_ns(self) -> int | None:
        """Modeled step time minus the baseline's, ns (positive: slower)."""
        if self.step_ns is None or self.baseline_step_ns is None:
            return None
        return self.step_ns - self.baseline_step_ns

    def apply(self, model):
        """Apply the plan to `model` in place and return it: wrap the chosen modules for checkpointing
        (`memlens.advice.checkpoint.wrap`; raises `CannotWrap` naming a module it cannot wrap), install the
        offload of the planned tensors (`memlens.advice.offload.install`; an ``"offload"`` module without
        planned tensors raises `CannotWrap`) and set the
        allocator settings (`apply_conf`); with `autocast`, run its forward under ``torch.autocast``. The
        optimizer is the caller's: make it with `optimizer_kwargs`. Sharding is not applied here: call
        ``memlens.prediction.distributed.strategies.apply_strategy`` inside the initialised process group."""
        from memlens.advice.checkpoint import CannotWrap, wrap
        from memlens.advice.offload import install
        planned = {t.module for t in self.offload}
        bare = sorted(n for n, m in self.checkpoint.items() if m == "offload" and n not in planned)
        if bare:
            raise CannotWrap(f"module {bare[0]!r} is to be offloaded but the plan names none of its saved tensors "
                             "(make offload plans with memlens.advise or memlens.advice.offload_plan)")
        wrap(model, self.checkpoint)
        if self.offload:
            install(model, self.offload)
        if self.autocast:
            autocast_forward(model, self.autocast)
        if self.conf:
            apply_conf(self.conf)
        return model

    @property
    def snippet(self) -> str:
        """The plan as code to paste into the training script."""
        lines = []
        if self.conf:
            lines += ["import os", f"os.environ['PYTORCH_CUDA_ALLOC_CONF'] = {self.conf!r}  # before torch uses CUDA"]
        if self.offload:
            lines += ["from memlens.advice.offload import OffloadHooks, OffloadTensor",
                      "# the planned saved tensors: moved to host memory at the save, back at prefetch_at's backward",
                      "offload = OffloadHooks(["]
            lines += [f"    {t!r}," for t in self.offload]
            lines += ["])"]
            install = ["offload.install(model)"]
        else:
            install = []
        if any(m != "offload" for m in self.checkpoint.values()):
            lines += ["import functools",
                      "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
                      "    CheckpointImpl, checkpoint_wrapper)",
                      "from torch.utils.checkpoint import checkpoint"]
            if "selective" in self.checkpoint.values():
                lines += ["from memlens.advice.checkpoint import selective_context  # keeps GEMM/attention outputs"]
            lines += ["", "def _wrap(model, name, **kw):",
                      "    parent_name, _, child = name.rpartition('.')",
                      "    parent = model.get_submodule(parent_name)",
                      "    fn = functools.partial(checkpoint, use_reentrant=False, **kw)",
                      "    setattr(parent, child, checkpoint_wrapper(getattr(parent, child),",
                      "            checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=fn))", ""]
            for name, mode in sorted(self.checkpoint.items(), key=lambda kv: (-kv[0].count("."), kv[0])):
                if mode == "offload":
                    continue
                kw = ", context_fn=selective_context" if mode == "selective" else ""
                lines.append(f"_wrap(model, {name!r}{kw})")
        lines += install
        if self.autocast or self.optimizer_kwargs or self.strategy:
            lines.insert(0, "import torch")
        if self.autocast:
            lines += [f"model.forward = torch.autocast('cuda', dtype=torch.{self.autocast})(model.forward)"]
        kwargs = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in sorted(self.optimizer_kwargs.items())) + "}"
        if self.strategy:
            lines += ["from memlens.prediction.distributed.strategies import apply_strategy",
                      "# inside the initialised process group; torch.optim.AdamW stands for your optimizer class",
                      f"model, optimizer = apply_strategy({self.strategy!r}, model.cuda(), torch.optim.AdamW, "
                      f"{kwargs})"]
        elif self.optimizer_kwargs:
            lines += [f"optimizer = torch.optim.AdamW(model.parameters(), **{kwargs})  # your optimizer, with these"]
        if self.micro_batch is not None:
            lines += [f"# gradient accumulation: {self.accumulate} micro-batches of {self.micro_batch}, one optimizer "
                      "step (compute_loss and next_micro_batch stand for your code)",
                      f"for i in range({self.accumulate}):",
                      f"    loss = compute_loss(model, next_micro_batch({self.micro_batch})) / {self.accumulate}",
                      "    loss.backward()",
                      "optimizer.step(); optimizer.zero_grad()"]
        return "\n".join(lines) or "# no change"


def _names(names: list[str]) -> str:
    """A list of module names, runs of numbered siblings shortened (layers.0-3)."""
    groups: dict[str, list] = {}
    out = []
    for n in names:
        head, _, tail = n.rpartition(".")
        if tail.isdigit():
            groups.setdefault(head, []).append(int(tail))
        else:
            out.append(n)
    for head, idx in groups.items():
        idx.sort()
        runs, start = [], idx[0]
        for a, b in zip(idx, idx[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        out.append(f"{head}.{','.join(runs)}" if head else ",".join(runs))
    return ", ".join(out)


def autocast_forward(model, dtype: str):
    """Run `model`'s forward under ``torch.autocast("cuda", dtype=torch.<dtype>)`` (in place)."""
    import torch
    model.forward = torch.autocast("cuda", dtype=getattr(torch, dtype))(model.forward)
    return model


def apply_conf(conf: str) -> str:
    """Set the allocator settings `conf` where they can still take effect and say what happened: before
    CUDA is initialised, ``PYTORCH_CUDA_ALLOC_CONF`` (read at initialisation); after, torch's
    ``torch.cuda.memory._set_allocator_settings`` (settings apply to segments reserved from then on)."""
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
        return "set PYTORCH_CUDA_ALLOC_CONF (read when CUDA initialises)"
    torch.cuda.memory._set_allocator_settings(conf)
    return ("CUDA was already initialised: set through torch.cuda.memory._set_allocator_settings; "
            "segments reserved before keep their old settings")


def apply(plan: Plan, model):
    """`plan.apply(model)`: `memlens.apply(plan, model)`."""
    return plan.apply(model)
