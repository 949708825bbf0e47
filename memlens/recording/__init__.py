"""memlens's own recorder: every block's alloc, access (read/write) and free, with attribution.

    import memlens
    with memlens.record(model) as rec:
        for batch in data:
            loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
            memlens.step()
    rec.trace.save("run.memlens")

See `memlens.recording.recorder` for the behaviour in nested use, threads and failures.
"""
from memlens.recording.recorder import Recorder, record, step

__all__ = ["Recorder", "record", "step"]
