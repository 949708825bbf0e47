"""Random numbers on sharded tensors under prediction: the fake device's CUDA generator and DTensor's RNG op.

Large-model code builds its model on the meta device, shards it (``fully_shard`` or ``parallelize_module``),
gives it memory with ``to_empty(device="cuda")`` and then initialises it in place with ``nn.init.normal_`` /
``trunc_normal_`` / ``uniform_``. On DTensors, a random op on CUDA runs through the higher-order operator
``run_dtensor_rng_op(start_offset_incr, end_offset_incr, op, *local_args)``: it moves the CUDA generator's
Philox offset to this rank's shard, runs the local op, and leaves the offset where every rank agrees (past
the whole tensor's numbers). A dispatch mode without a rule for that operator makes torch refuse it, so
`patch` gives the prediction's mode one (`_run_dtensor_rng_op`): the same offset bookkeeping, and the local
op run through the prediction's mode, so its output block is recorded as on a GPU (an in-place init
allocates nothing; ``trunc_normal_`` allocates nothing either, it works in place).

A CPU build has no CUDA generator, so `FakeCudaGenerator` stands for it on the predicted rank: a Philox
state (seed, offset) that ``torch.cuda.get_rng_state`` / ``set_rng_state`` / ``manual_seed`` /
``manual_seed_all`` / ``initial_seed`` read and write as on a GPU (16 bytes: the seed, then the offset, as
``uint8``). Fake tensors draw no numbers, so only DTensor's bookkeeping moves the offset.

DTensor's RNG tracker, made at the first random op, would check that every rank holds rank 0's state by
broadcasting it and comparing values, which fake tensors do not have; here every predicted rank starts from
the same seed (what that check enforces), so the tracker is made without it. The tracker torch keeps in a
module global is the predicted rank's own and is taken back on exit.
"""
from __future__ import annotations

import torch

# the CUDA default generator's seed before any manual_seed (c10::default_rng_seed_val)
DEFAULT_CUDA_SEED = 67280421310721


class FakeCudaGenerator:
    """The predicted rank's CUDA Philox state: `seed` and `offset` (Python ints, the offset in numbers)."""

    def __init__(self, seed: int = DEFAULT_CUDA_SEED):
        self.seed = int(seed)
        self.offset = 0

    def get_state(self) -> torch.Tensor:
        """The state as ``torch.cuda.get_rng_state`` gives it: 16 ``uint8`` on the CPU, the seed then the
        offset, each a little-endian unsigned 64-bit integer."""
        from torch.utils._python_dispatch import _disable_current_modes
        packed = (self.seed % 2**64).to_bytes(8, "little") + (self.offset % 2**64).to_bytes(8, "little")
        with _disable_current_modes():      # a real CPU tensor, whatever modes the prediction has on
            return torch.tensor(list(packed), dtype=torch.uint8)

    def set_state(self, state) -> None:
        """Take a state made by `get_state` (or its edited copy, as DTensor's ``_PhiloxState`` makes)."""
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import _disable_current_modes
        if isinstance(state, FakeTensor):     # made on the fake device: it has no values, so nothing to take
            return
        with _disable_current_modes():
            packed = bytes(state.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1).tolist())
        if len(packed) != 16:
            raise ValueError(f"a CUDA RNG state is 16 bytes (seed, offset), not {len(packed)}")
        self.seed, self.offset = int.from_bytes(packed[:8], "little"), int.from_bytes(packed[8:], "little")

    def manual_seed(self, seed) -> None:
        """``torch.cuda.manual_seed``: a new seed (taken modulo 2**64, as torch takes it), the offset back to 0."""
        self.seed, self.offset = int(seed) % 2**64, 0


def _run_dtensor_rng_op(generator: FakeCudaGenerator):
    """The rule for ``run_dtensor_rng_op`` under the prediction's dispatch mode (torch calls it with the mode
    popped): the offsets move as in torch's CUDA kernel for it, and the local op runs under the mode."""
    def rule(mode, start_offset_incr, end_offset_incr, op, *args, **kwargs):
        old = generator.offset
        generator.offset = old + int(start_offset_incr)     # this rank's shard's first number
        try:
            with mode:
                return op(*args, **kwargs)
        finally:
            generator.offset = old + int(end_offset_incr)   # past the whole tensor's numbers, on every rank
    return rule


def _unfaked_offsets(compute):
    """``_compute_rng_offsets`` with the dispatch modes off: on a 2-D mesh (FSDP2 over tensor parallel, a
    ``_StridedShard``) it finds the shard's first index with ``torch.arange(...).tolist()``, CPU index
    arithmetic that a fake tensor cannot answer and a GPU never sees."""
    def _compute_rng_offsets(self, spec):
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            return compute(self, spec)
    return _compute_rng_offsets


def _tracker_init(init):
    def __init__(self, device_mesh, run_state_sync: bool = True):
        init(self, device_mesh, run_state_sync=False)
    return __init__


def patch(patches, mode_class) -> FakeCudaGenerator:
    """Give the predicted rank a CUDA generator and `mode_class` (the prediction's dispatch mode) a rule for
    DTensor's RNG operator (see the module docstring); `patches` takes everything back. Returns the
    generator."""
    generator = FakeCudaGenerator()
    cuda = torch.cuda
    patches.set(cuda, "get_rng_state", lambda device="cuda": generator.get_state())
    patches.set(cuda, "set_rng_state", lambda new_state, device="cuda": generator.set_state(new_state))
    patches.set(cuda, "manual_seed", generator.manual_seed)
    patches.set(cuda, "manual_seed_all", generator.manual_seed)
    patches.set(cuda, "initial_seed", lambda: generator.seed)
    try:
        from torch._prims.rng_prims import run_dtensor_rng_op
        from torch.distributed.tensor import _random
    except ImportError:      # a torch without DTensor's RNG operator: random ops take the region path
        return generator
    table = dict(run_dtensor_rng_op.python_key_table)
    table[mode_class] = _run_dtensor_rng_op(generator)
    patches.set(run_dtensor_rng_op, "python_key_table", table)
    patches.set(_random, "_rng_tracker", None)
    tracker = _random.OffsetBasedRNGTracker
    patches.set(tracker, "__init__", _tracker_init(tracker.__dict__["__init__"]))
    if "_compute_rng_offsets" in tracker.__dict__:
        patches.set(tracker, "_compute_rng_offsets", _unfaked_offsets(tracker.__dict__["_compute_rng_offsets"]))
    return generator
