"""The dispatch mode of the Python recorder: it sees every ATen op below autograd and hands it to the
session (`Session.on_op`), and the modes of recordings that another thread stopped, popped later by
their own thread (a dispatch-mode stack is per thread)."""
from __future__ import annotations

import threading
from time import perf_counter_ns

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
from torch.utils._python_dispatch import TorchDispatchMode

Tensor = torch.Tensor

# Ops that at::RecordFunction never reports (c10's ObservedOperators list), so that the compiled recorder
# and torch.profiler never see them: left out here too, so that both backends list the same ops (the
# optimizer's step and zero_grad annotations, record_function's own ops, reach a dispatch mode).
UNOBSERVED_OPS = frozenset({
    "aten::size", "aten::is_leaf", "aten::output_nr", "aten::_version", "aten::is_complex",
    "profiler::_record_function_enter", "profiler::_record_function_enter_new", "profiler::_record_function_exit"})

_orphaned_modes: list = []   # (thread ident, mode) of recordings stopped from another thread
_orphans_lock = threading.Lock()


def reap_orphaned_modes() -> int:
    """Pop, in the calling thread, the dispatch modes of its recordings that another thread stopped
    (while they are on top of this thread's mode stack); returns how many were popped."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    me = threading.get_ident()
    popped = 0
    with _orphans_lock:
        mine = [m for owner, m in _orphaned_modes if owner == me]
        if not mine:
            return 0
        while mine and _get_current_dispatch_mode() in mine:
            mode = _get_current_dispatch_mode()
            mode.__exit__(None, None, None)
            mine.remove(mode)
            popped += 1
        _orphaned_modes[:] = [(o, m) for o, m in _orphaned_modes if o != me or m in mine]
    from memlens.recording import hooks
    live = hooks.all_sessions()
    hooks.thread_sessions()[:] = [s for s in hooks.thread_sessions() if s in live]
    return popped



class _RecordingMode(TorchDispatchMode):
    """Sees every ATen op below autograd (forward, backward, optimizer) and reports it to the session."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch would wrap __torch_dispatch__ in torch._disable_dynamo (~1 us per op); we switch
        # Dynamo's frame evaluation off around our own frames directly, which is what it does.
        return False

    def __init__(self, session: "memlens.recording.session.Session"):
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t_in = perf_counter_ns()     # the recorder's own time starts here (memlens.recording.own_clock)
        if kwargs is None:
            kwargs = {}
        session = self.session
        if not session.active:
            return func(*args, **kwargs)
        entry = session.op_cache_get(id(func))   # by id: OpOverload.__hash__ is a Python method
        if entry is None:
            if func._schema.name in UNOBSERVED_OPS:   # never cached: each call takes this branch
                return func(*args, **kwargs)
            try:
                entry = session.learn_op(func)
            except Exception as exc:  # never raise into user code: stop recording, keep the trace so far
                session.fail(exc)
                return func(*args, **kwargs)
        prior = _set_eval_frame(None)
        end = 0
        try:
            if entry[7] and args and isinstance(args[0], Tensor):   # resize_/set_: rare, slow path
                return session.run_reallocating_op(entry, args, kwargs, t_in)
            start = perf_counter_ns()
            out = entry[5](*args, **kwargs)      # the C++ op behind the OpOverload: one frame less
            end = perf_counter_ns()
            # one op record at a time: autograd's device threads (one per GPU) share this session
            with session.lock:
                if not session.active:   # stopped while this op ran (by another thread): the trace is built
                    return out
                try:
                    session.on_op(entry, args, kwargs, out, start, end)
                except Exception:  # e.g. a sparse tensor has no storage: redo this op tensor by tensor
                    try:
                        session.on_op_carefully(entry, args, kwargs, out, start, end)
                    except Exception as exc:  # never raise into user code: stop, keep the trace so far
                        session.fail(exc)
            return out
        finally:
            _set_eval_frame(prior)
            if end:   # the op ran: the recorder's own time before it and after it
                session.own_extend((t_in, start, end, perf_counter_ns()))

