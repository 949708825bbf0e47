"""Async point-to-point sends under prediction: the sent tensor stays alive until its work is waited.

A real ``ProcessGroupNCCL`` keeps a reference to an async send's tensor in the returned work (its "stashed"
tensors) so the caching allocator cannot hand the memory to another tensor while NCCL still reads it on its
stream; the reference goes when the work is waited (``work.wait()``, as the pipeline schedules do). torch's
fake process group returns works that hold nothing, so a sent tensor the program drops at once would be freed
at once in the prediction. Here ``ProcessGroup.send`` (what ``isend``, ``batch_isend_irecv`` and the pipeline
schedules' ``P2POp`` sends call) returns a `HeldWork`: the fake work plus the sent tensors, dropped at its first
``wait()``. Receives need nothing: the receiving tensor belongs to the program already.

Not modelled: a work dropped without a wait (a real NCCL work list keeps the tensors until the send
completes; here they go with the work), and coalesced sends on a backend that coalesces (the fake one does
not, so each send returns its own work).
"""
from __future__ import annotations


class HeldWork:
    """A process group's work plus the tensors it keeps alive until `wait` (the NCCL stash); every other
    attribute is the work's own."""

    def __init__(self, work, tensors):
        self._work = work
        self._tensors = list(tensors)

    def wait(self, *args, **kwargs):
        """Wait on the work, then drop the held tensors (their memory can be reused from here on)."""
        result = self._work.wait(*args, **kwargs)
        self._tensors = []
        return result

    def held_bytes(self) -> int:
        """Bytes of the tensors this work still holds (0 after `wait`)."""
        return sum(t.numel() * t.element_size() for t in self._tensors)

    def __getattr__(self, name):
        return getattr(self._work, name)


def patch(patches) -> None:
    """Make ``ProcessGroup.send`` return a `HeldWork` holding the sent tensors; `patches` restores it."""
    from torch.distributed import ProcessGroup
    real_send = ProcessGroup.send

    def send(self, tensors, *args, **kwargs):
        work = real_send(self, tensors, *args, **kwargs)
        return HeldWork(work, tensors) if work is not None else work
    patches.set(ProcessGroup, "send", send)
