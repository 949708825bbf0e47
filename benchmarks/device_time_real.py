"""Device time on every shared real Kineto profile, each clock against the profile's own truth.

Truth: the GPU busy time the raw profile records, recomputed here from the JSON alone (no memlens): the union of
the kernel, memcpy and memset intervals whose launch (a runtime call with the same correlation id) is in the
trace. Against it, per profile (ratios; 1.00 is exact):

- measured / truth: `memlens.onto_kernel_clock(memlens.load(p))`, the measured kernel clock's busy time;
- modeled / truth: `memlens.retime(trace, gpu=G)`, the cost model on the profile's own shapes, G the built-in
  GPU its device name stands for;
- retimed / truth: for a model profiled on two GPUs, the OTHER GPU's measured profile scaled op by op onto G
  (`memlens.retime(measured_other, gpu=G)`, `memlens/devicetime/scaling.py`); no constant was fitted to the pair;
- calibrated / truth, leave-one-out: `memlens.calibrate` fitted on all the OTHER profiles of the same GPU (their
  ops pooled), applied to this one (`memlens.retime(trace, gpu=fitted)`); the profile itself is in no fit.

    PYTHONPATH=. .venv/bin/python benchmarks/device_time_real.py [--folder DIR]

The profiles are the developers' shared real traces (``$MEMLENS_SHARED_TRACES/kineto``, by default the
``shared/traces/kineto`` folder beside the checkout); without them the benchmark says so and exits 0.
Prints one markdown table (docs/measured.md holds the run of 2026-12-06) and each step's wall time.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("MEMLENS_SHARED_TRACES", ROOT.parent / "shared" / "traces")) / "kineto"
_GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime"}


def truth_busy_ns(path) -> float:
    """From the raw JSON alone: ns of the union of the kernel/memcpy/memset intervals whose launch is in the
    trace (both eras: 2021 files spell the categories ``Kernel``/``Runtime``)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    launched = {e["args"]["correlation"] for e in events
                if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() in _RUNTIME_CATEGORIES
                and "correlation" in (e.get("args") or {})}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                   if isinstance(e, dict) and e.get("ph") == "X"
                   and str(e.get("cat", "")).lower() in _GPU_CATEGORIES
                   and (e.get("args") or {}).get("correlation") in launched)
    busy, run_start, run_end = 0.0, None, None
    for start, end in spans:
        if run_end is None or start > run_end:
            busy += 0.0 if run_end is None else run_end - run_start
            run_start, run_end = start, end
        else:
            run_end = max(run_end, end)
    busy += 0.0 if run_end is None else run_end - run_start
    return busy * 1000.0          # us -> ns


def model_key(stem: str) -> str:
    """The model a profile ran, so that the same model on two GPUs pairs up: TraceLens names its files
    ``tracelens_<gpu>_<model>``; any other file is its own model."""
    parts = stem.split("_", 2)
    return parts[2] if parts[0] == "tracelens" and len(parts) == 3 else stem


def load_profiles(folder: Path) -> list[dict]:
    """Each profile: stem, model, path, truth ns, the imported trace, its measured clock, the GPU row."""
    import memlens
    from memlens.devicetime.gpus import gpu_of_device
    out = []
    for path in sorted(folder.glob("*.json.gz")):
        started = time.perf_counter()
        stem = path.name.replace(".json.gz", "").replace(".pt.trace", "")
        trace = memlens.load(path)
        measured = memlens.onto_kernel_clock(trace)
        device = measured.metadata["clock"].get("gpu") or ""
        out.append({"stem": stem, "model": model_key(stem), "path": path, "truth": truth_busy_ns(path),
                    "trace": trace, "measured": measured, "device": device, "gpu": gpu_of_device(device),
                    "has_facts": bool((trace.ops["flops"].fillna(0) > 0).any())})
        print(f"  loaded {stem}: {device or 'no device name'}, {len(trace.ops):,} ops "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    return out


def pooled_ops(profiles: list[dict]) -> pd.DataFrame:
    """The ops tables of `profiles` in one, op ids renumbered so each keeps its own nesting."""
    tables, offset = [], 0
    for p in profiles:
        ops = p["trace"].ops.copy()
        ops["op_id"] = ops["op_id"].astype("int64") + offset
        ops["parent_op_id"] = (ops["parent_op_id"].astype("Float64") + offset).astype("Int64")
        offset = int(ops["op_id"].max()) + 1
        tables.append(ops)
    return pd.concat(tables, ignore_index=True)


def busy(trace) -> float:
    return float(trace.metadata["clock"]["device_busy_ns"])


def _try(step):
    """(value, None) or (None, why) for one retime/calibrate step that may refuse its input."""
    from memlens.errors import InputError
    try:
        return step(), None
    except InputError as exc:
        return None, str(exc).split(";")[0][:80]


def evaluate(profiles: list[dict]) -> pd.DataFrame:
    """One row per profile: truth (ms) and the four ratios, with what each came from."""
    import memlens
    from memlens.devicetime.calibration import calibrate
    rows = []
    for p in profiles:
        g, truth = p["gpu"], p["truth"]
        row = {"profile": p["stem"], "gpu": g.name if g else f"unknown ({p['device']})", "truth_ms": truth / 1e6,
               "measured": busy(p["measured"]) / truth}
        started = time.perf_counter()
        if g is None or not p["has_facts"]:
            row["modeled_note"] = "no op shapes" if g else "GPU not in the table"
        else:
            value, why = _try(lambda: busy(memlens.retime(p["trace"], gpu=g)) / truth)
            row["modeled"], row["modeled_note"] = value, why
        others = [q for q in profiles if q is not p and q["model"] == p["model"] and q["gpu"] is not None
                  and g is not None and q["gpu"].name != g.name]
        if others:
            src = others[0]
            value, why = _try(lambda: busy(memlens.retime(src["measured"], gpu=g)) / truth)
            row["retimed"], row["retimed_from"] = value, why or f"from {src['gpu'].name}"
        fit_on = [q for q in profiles if q is not p and g is not None and q["gpu"] is not None
                  and q["gpu"].name == g.name and q["has_facts"]]
        if g is not None and p["has_facts"] and fit_on:
            def calibrated():
                fitted = calibrate(pooled_ops(fit_on), base=g)
                return busy(memlens.retime(p["trace"], gpu=fitted)) / truth
            value, why = _try(calibrated)
            row["calibrated"] = value
            row["fit_on"] = why or " + ".join(model_key(q["stem"]) for q in fit_on)
        else:
            row["fit_on"] = "no other profile of this GPU with op shapes"
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
        print(f"  evaluated {p['stem']} ({row['seconds']:.1f} s)", flush=True)
    return pd.DataFrame(rows)


def _ratio(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def markdown(table: pd.DataFrame) -> str:
    """The table as docs/measured.md shows it."""
    lines = ["| profile (GPU, truth busy) | measured / truth | modeled / truth | retimed from the other GPU / "
             "truth | calibrated, leave-one-out / truth (fitted on) |", "|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        note = f" ({r['modeled_note']})" if isinstance(r.get("modeled_note"), str) else ""
        retimed = (f"{_ratio(r.get('retimed'))} ({r['retimed_from']})" if isinstance(r.get("retimed_from"), str)
                   else "— (profiled on one GPU)")
        lines.append(f"| {r['profile']} ({r['gpu']}, {r['truth_ms']:.3f} ms) | {_ratio(r['measured'])} | "
                     f"{_ratio(r.get('modeled'))}{note} | {retimed} | {_ratio(r.get('calibrated'))} ({r['fit_on']}) |")
    return "\n".join(lines)


def summary(table: pd.DataFrame) -> str:
    """Per clock: profiles covered, median |log ratio| as a factor, the worst ratio."""
    out = []
    for col in ("measured", "modeled", "retimed", "calibrated"):
        values = pd.to_numeric(table.get(col, pd.Series(dtype="float64")), errors="coerce").dropna()
        if len(values):
            logs = np.abs(np.log(values.to_numpy()))
            worst = values.iloc[int(np.argmax(logs))]
            out.append(f"{col}: {len(values)} profiles, median error x{math.exp(float(np.median(logs))):.3f}, "
                       f"worst {worst:.3f}")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[argv.index("--folder") + 1]) if "--folder" in argv else FOLDER
    profiles_found = sorted(folder.glob("*.json.gz")) if folder.is_dir() else []
    if not profiles_found:
        print(f"no shared Kineto profiles in {folder} (they exist only in the developers' checkout): nothing to "
              "measure")
        return 0
    started = time.perf_counter()
    print(f"{len(profiles_found)} profiles in {folder}", flush=True)
    profiles = load_profiles(folder)
    table = evaluate(profiles)
    print()
    print(markdown(table))
    print()
    print(summary(table))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
