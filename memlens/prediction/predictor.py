"""`memlens.predict`: run a training step on fake `cuda` tensors and predict its GPU memory.

    import memlens                      # before torch, on a CPU-only build (see memlens.prediction.shim)
    import torch
    with memlens.predict(gpu="H100", capacity="80GiB") as p:
        model = Model().cuda(); opt = torch.optim.AdamW(model.parameters())
        loss = model(torch.randint(0, 1000, (8, 512), device="cuda")).sum(); loss.backward(); opt.step()
    p.peak_allocated, p.peak_reserved, p.fits("40GiB"), p.oom, p.trace

How a prediction is made:
1. The code runs under FakeTensorMode with a fake `cuda` device (`environment.fake_cuda`): shapes, dtypes
   and strides are computed, no memory is touched and nothing is computed.
2. memlens's recorder sees every ATen op and every storage's birth and death (`PredictSession`), which gives
   the blocks (sizes in bytes, lifetimes), accesses, ops, modules, categories and iterations of the step.
3. What fake tensors never see is added explicitly (`scratch.py`): one cuBLAS workspace per (thread, stream)
   at its first GEMM, never freed (its size per GPU in `gpus.py`); CUDA kernels' own temporaries as transient
   blocks inside their op (the sorted accumulate of ``index_put``, CUDA reductions' global staging buffers).
4. The blocks (sizes rounded as the caching allocator rounds them: `predicted_trace.py`) are replayed
   through memlens's caching-allocator simulator (`memlens.simulate`) under the run's
   ``PYTORCH_CUDA_ALLOC_CONF``: allocation rounding, pools, block splitting, segment sizes, the OOM path.
   That gives peak allocated (torch's ``max_memory_allocated``), peak reserved (``max_memory_reserved``)
   and, against a capacity, the first allocation that would fail (`oom.py`).
The CUDA context (outside the caching allocator) and NCCL buffers count against the capacity only.
`torch.compile` is out of scope: compiled regions are not traced by FakeTensorMode the same way and their
Inductor buffers are planned by Inductor, not requested op by op.
"""
from __future__ import annotations

import os
import threading
from time import perf_counter_ns
from typing import Any

from memlens.errors import InputError
from memlens.prediction.gpus import GPUMemoryFacts, gpu_facts
from memlens.prediction.oom import OOM, first_oom

_active = threading.local()


class PredictionFailed(RuntimeError):
    """The predicted code raised, so there is no prediction: a run that did not complete must not be said
    to fit. The message names the code's exception; `Prediction.trace` still holds what ran up to it."""


def _capacity_bytes(capacity) -> int | None:
    if capacity is None:
        return None
    from memlens.units import parse_bytes
    try:
        return int(parse_bytes(capacity))
    except Exception as exc:
        raise InputError(f"capacity {capacity!r} is not a size in bytes ({exc})") from None


class Prediction:
    """A predicted run. Use as a context manager (`memlens.predict`); read the results after the block.

    Results (bytes): `peak_allocated`, `peak_reserved`, `peak_allocated_since_reset` (after the last
    ``torch.cuda.reset_peak_memory_stats()`` the code called, as a real run reports it), `oom`, `fits()`,
    `trace` (a `memlens.Trace` with blocks on ``cuda:0``, sizes rounded as the caching allocator rounds
    them; `requested_size` holds the bytes asked for; on the modeled clock of the GPU via `memlens.retime`
    unless ``clock="host"``), `simulate()` (the allocator replay), `standin_lines` / `standin_note` (the
    lines whose ``.item()``, ``bool()`` or ``.tolist()`` got a stand-in value: `memlens.prediction.standins`).
    """

    def __init__(self, gpu: str | GPUMemoryFacts = "H100", capacity=None, *, conf: str | None = None,
                 model=None, stacks: bool = False, nccl_bytes: int = 0, cuda_context: int | None = None,
                 cublas_workspaces: bool = True, kernel_scratch: bool = True, cudnn_workspace=None,
                 clock: str = "modeled", fast_cache_key: bool = True, steps: int | None = None):
        if clock not in ("modeled", "host"):
            raise InputError(f"clock must be 'modeled' or 'host', not {clock!r}")
        self.clock = clock
        from memlens.prediction.steps import check_steps
        self.steps = check_steps(steps)   # calls of a step function (memlens.prediction.steps); None: until steady
        self._step_starts: list[int] = []   # op index at the start of each call of the step function
        self.first_step_left_bytes = 0      # new GPU blocks the first call left alive, bytes
        self._step_peaks: list[dict] | None = None
        self.gpu_name = gpu if isinstance(gpu, str) else None
        self.gpu = gpu_facts(gpu) if cuda_context is None else gpu_facts(gpu, cuda_context=int(cuda_context))
        self.capacity = _capacity_bytes(capacity)
        self.conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if conf is None else conf
        self.model = model
        self.stacks = stacks
        self.nccl_bytes = int(nccl_bytes)
        self.cublas_workspaces = bool(cublas_workspaces)
        self.kernel_scratch = bool(kernel_scratch)
        self.kernel_scratch_blocks = 0     # modelled kernel temporaries added to the trace (scratch.py)
        if cudnn_workspace is not None and not callable(cudnn_workspace):
            from memlens.units import parse_bytes
            try:
                cudnn_workspace = int(parse_bytes(cudnn_workspace))
            except Exception as exc:
                raise InputError(f"cudnn_workspace {cudnn_workspace!r} is not a size in bytes ({exc})") from None
            if cudnn_workspace < 0:
                raise InputError(f"cudnn_workspace {cudnn_workspace!r} is negative")
        self.cudnn_workspace = cudnn_workspace   # bytes per convolution call, a callable, or None (off)
        self.fast_cache_key = bool(fast_cache_key)
        self.trace = None
        self.simulation = None
        self._sims: dict[Any, Any] = {}
        self._env = None
        self._recorder = None
        self._reset_marks: list[int] = []
        self.failure: str | None = None   # "ValueError: ..." when the predicted code raised
        self.standin_lines: dict[str, int] = {}   # "file:line" -> reads of a tensor's value answered by a stand-in
        self.standin_note: str | None = None      # the sentence saying so (also in trace.metadata["notes"])
        self.steps_note: str | None = None        # which call of a step function the peaks come from (steps.py)
        self.wall_ns = 0
        self.process_note: str | None = None      # set when the prediction ran in a child process (firstuse.py)

    # ---- the block --------------------------------------------------------------------------
    def __enter__(self) -> "Prediction":
        if getattr(_active, "prediction", None) is not None:
            raise RuntimeError("memlens.predict blocks do not nest")
        from memlens.prediction import firstuse
        reason = firstuse.blocker()   # builds a missing shim before torch is imported (fresh environment)
        if reason is not None:        # e.g. a backward ran before memlens came: say so, not torch's assert
            raise firstuse.refuse_block(reason)
        from memlens.prediction.environment import fake_cuda
        from memlens.prediction.session import PredictSession
        from memlens.recording.recorder import Recorder
        self._t0 = perf_counter_ns()
        self._env = fake_cuda(self.gpu.name, self.gpu.capability, self.gpu.total_memory,
                              fast_cache_key=self.fast_cache_key)
        self.mode = self._env.__enter__()
        try:
            recorder = Recorder(self.model, stacks=self.stacks, allocator="none", kernel_times=False)
            recorder.session_class = PredictSession
            recorder.__enter__()
            self._recorder = recorder
            self._session = recorder._session
            self._patch_stats()
        except BaseException:
            self._env.__exit__(None, None, None)
            raise
        _active.prediction = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _active.prediction = None
        session = self._recorder._session
        t_start = session.t_start if session is not None else 0
        try:
            self._recorder.__exit__(exc_type, exc, tb)
        finally:
            self._env.__exit__(None, None, None)
        self._reset_marks = [m - t_start for m in self._reset_marks]
        if session is not None:
            from memlens.prediction.standins import note
            self.standin_lines = dict(session.standins.lines.most_common())
            self.standin_note = note(session.standins.lines)
        failed = exc is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None))
        if failed:
            self.failure = f"{exc_type.__name__}: {exc}"
            if isinstance(exc, Exception):
                exc.add_note("memlens.predict: the predicted code raised this, so no prediction was made")
        if self._recorder.trace is not None:
            try:
                self.trace = self._finish(self._recorder.trace, self._recorder)
            except Exception:
                if not failed:
                    raise
                # the partial trace of a failed run is for inspection only; the code's own error comes first
        self.wall_ns = perf_counter_ns() - self._t0
        return False

    def _patch_stats(self) -> None:
        """``torch.cuda.reset_peak_memory_stats`` marks the window `peak_allocated_since_reset` reports;
        ``memory_allocated`` / ``max_memory_allocated`` answer from the live fake blocks (unrounded)."""
        import torch
        session = self._recorder._session
        marks = self._reset_marks

        def reset_peak(device=None):
            marks.append(perf_counter_ns())

        def reset_and_mark(device=None):
            reset_peak(device)
            session.peak_cuda_bytes = session.live_cuda_bytes

        patches = self.mode.memlens_patches
        patches.set(torch.cuda, "reset_peak_memory_stats", reset_and_mark)
        patches.set(torch.cuda, "memory_allocated", lambda device=None: session.live_cuda_bytes)
        patches.set(torch.cuda, "max_memory_allocated", lambda device=None: session.peak_cuda_bytes)

    # ---- building the prediction ------------------------------------------------------------
    def _finish(self, trace, recorder):
        from memlens.prediction.corrections import apply_corrections
        from memlens.prediction.moved_in import categorise_moved_in
        from memlens.prediction.predicted_trace import allocator_sized, onto_gpu_clock
        from memlens.prediction.scratch.modelled import add_modelled_scratch
        from memlens.simulate.config import parse_conf, round_size
        config = parse_conf(self.conf or None)
        trace = apply_corrections(allocator_sized(trace, self._session.op_threads, config))
        categorise_moved_in(trace)
        trace, self.kernel_scratch_blocks = add_modelled_scratch(
            trace, self.gpu, lambda s: round_size(s, config), cublas_workspaces=self.cublas_workspaces,
            kernel_scratch=self.kernel_scratch, index_put_facts=self._session.index_put_facts,
            reduction_facts=self._session.reduce_facts, flash_facts=self._session.flash_facts,
            cudnn_workspace=self.cudnn_workspace)
        trace.metadata.update({
            "source_kind": "memlens_predict",
            "clock": {"kind": "host", "gpu": self.gpu.name,
                      "model": "fake-tensor execution on the CPU: op times are not GPU times"},
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": self.conf},
            "prediction": {
                "gpu": self.gpu.name, "capability": list(self.gpu.capability),
                "capacity": self.capacity, "conf": self.conf,
                "cuda_context_bytes": self.gpu.cuda_context, "nccl_bytes": self.nccl_bytes,
                "cublas_workspace_bytes": self.gpu.cublas_workspace if self.cublas_workspaces else 0,
                "kernel_scratch_blocks": self.kernel_scratch_blocks,
                "cudnn_workspace": (None if self.cudnn_workspace is None else
                                    "per-op callable" if callable(self.cudnn_workspace) else self.cudnn_workspace),
                "reset_peak_ns": self._reset_marks,
            },
        })
        if self.clock == "modeled":
            trace, self._reset_marks = onto_gpu_clock(trace, self.gpu_name or self.gpu.name, self._reset_marks)
        # the recorder's note about its allocator instrument does not apply: fake tensors have no allocator
        trace.metadata["notes"] = [n for n in trace.metadata.get("notes", []) if "allocator='none'" not in n]
        trace.metadata["notes"].append(
            "predicted with memlens.predict: fake tensors, no GPU; cuBLAS workspaces modelled "
            f"({self.gpu.cublas_workspace:,} bytes per thread and stream)")
        if self.standin_note is not None:
            trace.metadata["notes"].append(self.standin_note)
        return trace

    def __getstate__(self) -> dict:
        """A finished prediction pickles (it comes back from a child process: `memlens.prediction.firstuse`)
        without the run's live machinery (fake mode, recorder, session), the caller's `model` and the cached
        replays, which are recomputed from `trace` when read."""
        state = dict(self.__dict__)
        state.update({"_env": None, "_recorder": None, "_session": None, "mode": None, "model": None, "_sims": {}})
        return state

    # ---- results ----------------------------------------------------------------------------
    def _need_trace(self):
        if self.failure is not None:
            raise PredictionFailed(f"no prediction: the predicted code raised {self.failure} (a run that does "
                                   "not complete is not predicted to fit; `trace` holds what ran up to it)")
        if self.trace is None:
            raise RuntimeError("no prediction yet: read the results after the `with memlens.predict()` block")
        return self.trace

    def simulate(self, capacity=None):
        """The caching-allocator replay of the predicted trace on ``cuda:0`` (cached per capacity)."""
        from memlens.simulate import simulate
        trace = self._need_trace()
        cap = _capacity_bytes(capacity) if capacity is not None else None
        if cap is not None:
            cap = max(cap - self.gpu.cuda_context - self.nccl_bytes, 1)
        if cap not in self._sims:
            if not (trace.blocks["device"] == "cuda:0").any():
                self._sims[cap] = None
            else:
                self._sims[cap] = simulate(trace, conf=self.conf, capacity=cap if cap is not None else "unlimited",
                                           device="cuda:0", initial_state="empty").devices["cuda:0"]
        return self._sims[cap]

    @property
    def step_peaks(self) -> list[dict]:
        """Per call of the step function given to `memlens.predict`: ``{"step", "peak_allocated",
        "peak_reserved"}`` (bytes); the last is the steady state. [] for a ``with`` block."""
        if self._step_peaks is None:
            from memlens.prediction.steps import step_peaks
            self._need_trace()
            self._step_peaks = step_peaks(self)
        return self._step_peaks

    @property
    def peak_allocated(self) -> int:
        """Predicted ``torch.cuda.max_memory_allocated()`` over the whole block, bytes."""
        sim = self.simulate()
        return sim.peak_allocated if sim is not None else 0

    @property
    def peak_reserved(self) -> int:
        """Predicted ``torch.cuda.max_memory_reserved()`` over the whole block, bytes."""
        sim = self.simulate()
        return sim.peak_reserved if sim is not None else 0

    def _since_reset(self, column: str) -> int:
        sim = self.simulate()
        if sim is None:
            return 0
        tl = sim.timeline
        if not self._reset_marks:
            return int(tl[column].max())
        t = self._reset_marks[-1]
        before = tl[tl["t_ns"] <= t]
        start = int(before[column].iloc[-1]) if len(before) else 0
        after = tl.loc[tl["t_ns"] > t, column]
        return max(start, int(after.max()) if len(after) else start)

    @property
    def peak_allocated_since_reset(self) -> int:
        """Peak allocated after the last ``torch.cuda.reset_peak_memory_stats()`` in the block, bytes (what
        ``max_memory_allocated()`` reports at the end of a real run); the whole block when there was none."""
        return self._since_reset("allocated")

    @property
    def device_bytes_needed(self) -> int:
        """Peak reserved + CUDA context + NCCL buffers: the device memory the run needs, bytes."""
        return self.peak_reserved + self.gpu.cuda_context + self.nccl_bytes

    def fits(self, capacity=None) -> bool:
        """Whether the run completes within `capacity` (bytes or "80GiB"; default: the prediction's) of
        device memory, counting the CUDA context and NCCL buffers; the allocator's OOM path (freeing cached
        blocks and retrying) is simulated."""
        cap = self.capacity if capacity is None else _capacity_bytes(capacity)
        if cap is None:
            cap = self.gpu.total_memory
        sim = self.simulate(cap)
        return sim is None or not sim.ooms

    @property
    def oom(self) -> OOM | None:
        """The first allocation that would fail at the prediction's capacity (default: the GPU's memory)."""
        return self.oom_at(self.capacity if self.capacity is not None else self.gpu.total_memory)

    def oom_at(self, capacity) -> OOM | None:
        """The first allocation that would fail with `capacity` (bytes or "40GiB") of device memory, counting
        the CUDA context and NCCL buffers like `fits`; None when the run fits."""
        cap = _capacity_bytes(capacity)
        sim = self.simulate(cap)
        return first_oom(self._need_trace(), sim, cap)

    def summary(self) -> dict:
        """The headline figures (bytes, ns)."""
        self._need_trace()
        return {"gpu": self.gpu.name, "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "peak_allocated_since_reset": self.peak_allocated_since_reset,
                "device_bytes_needed": self.device_bytes_needed,
                "capacity": self.capacity, "fits": self.fits() if self.trace is not None else None,
                "blocks": int((self.trace.blocks["device"] == "cuda:0").sum()), "ops": int(len(self.trace.ops)),
                "predict_wall_ns": self.wall_ns, "standin_lines": self.standin_lines, "step_peaks": self.step_peaks,
                "clock": self.trace.metadata.get("clock", {}).get("kind", "host"),
                # modeled GPU busy time of everything in the block (memlens.retime's cost model), ns
                "device_busy_ns": self.trace.metadata.get("clock", {}).get("device_busy_ns")}


def active_prediction() -> Prediction | None:
    return getattr(_active, "prediction", None)
