"""Global PyTorch hooks shared by all active recording sessions.

PyTorch offers process-wide module hooks (forward pre/post) and optimizer step hooks. They are
installed once when the first session starts and removed when the last one stops. Each hook forwards
to the sessions active *in the calling thread* (dispatch modes are thread-local too), so two threads
recording at once each see only their own modules and optimizers.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_tls = threading.local()
_all_sessions: list = []          # every active session, any thread (guarded by _lock)
_handles: list = []               # optimizer hook handles while any session is active
_module_handles: list = []        # module hook handles while any session with Python module hooks is active


def thread_sessions() -> list:
    """Sessions active in the calling thread, outermost first."""
    sessions = getattr(_tls, "sessions", None)
    if sessions is None:
        sessions = _tls.sessions = []
    return sessions


def all_sessions() -> list:
    """A snapshot of every active session in the process."""
    with _lock:
        return list(_all_sessions)


def _forward_pre(module, args):
    for session in thread_sessions():
        if session.python_module_hooks:
            session.enter_module(module, args)


def _forward_post(module, args, output):
    for session in thread_sessions():
        if session.python_module_hooks:
            session.exit_module(module)


def _optimizer_pre(optimizer, args, kwargs):
    for session in thread_sessions():
        session.optimizer_pre(optimizer)


def _optimizer_post(optimizer, args, kwargs):
    for session in thread_sessions():
        session.optimizer_post(optimizer)


def _install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    _handles.append(register_optimizer_step_pre_hook(_optimizer_pre))
    _handles.append(register_optimizer_step_post_hook(_optimizer_post))


def _install_module_hooks() -> None:
    import torch.nn.modules.module as mm
    _module_handles.append(mm.register_module_forward_pre_hook(_forward_pre))
    _module_handles.append(mm.register_module_forward_hook(_forward_post, always_call=True))


def activate(session) -> None:
    """Register `session` as active in this thread (installing the global hooks if first).

    The module hooks here serve the sessions whose module tracking is in Python
    (`session.python_module_hooks`); the compiled recorder registers its own C++ module hooks, so a
    model recorded only by it runs no Python per module call.
    """
    with _lock:
        if not _all_sessions:
            _install()
        if session.python_module_hooks and not any(s.python_module_hooks for s in _all_sessions):
            _install_module_hooks()
        _all_sessions.append(session)
    thread_sessions().append(session)


def deactivate(session) -> None:
    """Remove `session` (from any position: exits need not be perfectly nested across threads)."""
    stack = thread_sessions()
    if session in stack:
        stack.remove(session)
    with _lock:
        if session in _all_sessions:
            _all_sessions.remove(session)
        if not any(s.python_module_hooks for s in _all_sessions):
            while _module_handles:
                _module_handles.pop().remove()
        if not _all_sessions:
            while _handles:
                _handles.pop().remove()


def step() -> None:
    """Mark the start of a new iteration in the active recordings (a no-op when nothing records).

    Applies to the sessions active in the calling thread, or to every active session when the calling
    thread records nothing (e.g. a training loop that steps from a helper thread).
    """
    sessions = list(thread_sessions()) or all_sessions()
    for session in sessions:
        session.mark_step()
