"""memlens's own recorder: every block's alloc, access (read/write) and free, with attribution.

    import memlens
    with memlens.record(model) as rec:
        for batch in data:
            loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
            memlens.step()
    rec.trace.save("run.memlens")

See `memlens.record.recorder` for the behaviour in nested use, threads and failures.
"""
import sys
import types

from memlens.record.recorder import Recorder, record, step

__all__ = ["Recorder", "record", "step"]


class _CallableModule(types.ModuleType):
    """Importing ``memlens.record.<anything>`` binds the package to ``memlens.record``, shadowing the
    function of the same name; calling the package forwards to `record` so both spellings work."""

    def __call__(self, *args, **kwargs):
        return record(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
