"""`memlens mcp`: the server answers the official MCP client over stdio (tools/list, info, sites, ...), with
the numbers the CLI and a brute-force sweep give."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLE_TRACES
from memlens.trace import Trace

pytest.importorskip("mcp.client.stdio", reason="needs the mcp extra (pip install 'memlens[mcp]')")

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = SAMPLE_TRACES / "mlp_train_sgd_stacks.memlens"
TOOLS = {"info", "peak_cause", "sites", "diff", "simulate", "predict", "advise"}


def _env() -> dict:
    # the server child must import this tree's memlens (not another checkout's editable install)
    return {"PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def talk(calls, roots=()):
    """Start `python -m memlens mcp [--root R ...]` and run `calls` (a list of (tool, arguments)) through mcp's
    own client; returns (tool names listed, [(is_error, text)])."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def go():
        params = StdioServerParameters(command=sys.executable, args=["-m", "memlens", "mcp", *[a for r in roots for a in ("--root", str(r))]],
                                        env=_env())
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    out = []
                    for name, arguments in calls:
                        r = await session.call_tool(name, arguments)
                        text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
                        out.append((bool(r.is_error if hasattr(r, "is_error") else r.isError), text))
                    return [t.name for t in listed.tools], out
    return anyio.run(go)


def peak_by_sweep(blocks: pd.DataFrame) -> dict[str, int]:
    """Peak live bytes per device, brute force: +size at alloc, -size at free, frees first at equal times,
    blocks alive before recording counted from the start."""
    out = {}
    for dev, b in blocks.groupby("device"):
        events = []
        for r in b.itertuples():
            start = -np.inf if pd.isna(r.alloc_ns) else r.alloc_ns
            events.append((start, 1, int(r.size)))
            if not pd.isna(r.free_ns):
                events.append((r.free_ns, 0, -int(r.size)))
        live = best = 0
        for _, _, d in sorted(events):
            live += d
            best = max(best, live)
        out[str(dev)] = best
    return out


def _block(i, size, alloc, free):
    return {"block_id": i, "device": "cuda:0", "size": size, "alloc_ns": alloc, "free_ns": free}


def test_tools_list_and_info_agree_with_the_cli(tmp_path):
    bad = tmp_path / "not_a_trace.pickle"
    bad.write_bytes(b"nonsense")
    # the server reads source lines only inside its roots: name the directories of the sample's frames (where
    # it was recorded) as roots, so that it shows the same lines as the CLI
    frame_dirs = {os.path.dirname(f) for f in pd.read_parquet(SAMPLE / "stacks.parquet")["filename"]}
    roots = [tmp_path, SAMPLE_TRACES, *[d for d in frame_dirs if os.path.isdir(d)]]
    names, answers = talk([("info", {"path": str(SAMPLE)}), ("info", {"path": str(bad)}),
                           ("peak_cause", {"path": str(SAMPLE)}), ("sites", {"path": str(SAMPLE), "top": 3})],
                          roots=roots)
    assert set(names) == TOOLS
    (err, text), (bad_err, bad_text), (_, cause_text), (_, sites_text) = answers
    assert not err
    got = json.loads(text)
    cli = subprocess.run([sys.executable, "-m", "memlens", "info", "--json", str(SAMPLE)], capture_output=True,
                         text=True, env={**os.environ, **_env()}, check=True)
    want = json.loads(cli.stdout)
    assert got == want
    # and independently of memlens: the peak from a sweep over the saved blocks
    blocks = pd.read_parquet(SAMPLE / "blocks.parquet")
    assert got["peak_live_bytes"] == peak_by_sweep(blocks)
    assert got["blocks"] == len(blocks)
    dev = next(iter(got["peak_live_bytes"]))
    cause = json.loads(cause_text)[dev]
    assert cause["allocated_bytes"] == got["peak_live_bytes"][dev] == sum(cause["by_category"].values())
    top = json.loads(sites_text)[dev]
    assert [(s["site"], s["bytes"]) for s in top] == [(s["site"], s["bytes"]) for s in got["peak"][dev]["top_sites"][:3]]
    # bad input is the tool's error, one line naming the file, and the server keeps serving
    assert bad_err and str(bad) in bad_text and "Traceback" not in bad_text


def test_diff_and_simulate_on_hand_made_traces(tmp_path):
    # A: 1 KiB then 3 KiB overlapping (peak 4 KiB); B: the 3 KiB block grows to 5 KiB (peak 6 KiB); sizes are
    # multiples of 512 so that the caching allocator's rounding leaves them as they are
    a = Trace.from_tables(pd.DataFrame([_block(1, 1024, 0, 50), _block(2, 3072, 10, 40)]),
                          metadata={"source_kind": "synthetic"})
    b = Trace.from_tables(pd.DataFrame([_block(1, 1024, 0, 50), _block(2, 5120, 10, 40)]),
                          metadata={"source_kind": "synthetic"})
    pa, pb = tmp_path / "a.memlens", tmp_path / "b.memlens"
    a.save(pa)
    b.save(pb)
    _, answers = talk(roots=[tmp_path], calls=[("diff", {"path_a": str(pa), "path_b": str(pb)}),
                       ("simulate", {"path": str(pb), "allocator": "bump"}),
                       ("simulate", {"path": str(pb), "allocator": "nonsense"})])
    (derr, dtext), (serr, stext), (bad_err, bad_text) = answers
    assert not derr and not serr
    d = json.loads(dtext)
    assert [(r["peak_a"], r["peak_b"], r["delta"]) for r in d["peak"]] == [(4096, 6144, 2048)]
    sim = json.loads(stext)["cuda:0"]
    assert sim["peak_allocated"] == 6144
    assert bad_err and "nonsense" in bad_text


def test_missing_extra_is_one_line(monkeypatch, capsys):
    """Without the mcp package the verb says how to install it (exit 2), not a traceback."""
    import builtins

    from memlens.cli import main
    real_import = builtins.__import__

    def no_mcp(name, *args, **kwargs):
        if name == "mcp" or name.startswith("mcp."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_mcp)
    assert main(["mcp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    from memlens.install_hint import extra_install_command
    assert len(err) == 1 and extra_install_command("mcp") in err[0]


def test_predict_runs_the_script_in_a_child(tmp_path):
    """A script that holds 4 MiB and 2 MiB of float32 on fake CUDA at once: 6 MiB allocated at the peak (both
    multiples of 512 B, so the allocator's rounding keeps them); its print cannot corrupt the protocol."""
    script = tmp_path / "two_tensors.py"
    script.write_text("import torch\nprint('hello from the script')\n"
                      "a = torch.empty(1 << 20, device='cuda')\nb = torch.empty(1 << 19, device='cuda')\n")
    failing = tmp_path / "raises.py"
    failing.write_text("import torch\na = torch.empty(1 << 20, device='cuda')\nraise ValueError('bad batch')\n")
    _, answers = talk([("predict", {"script": str(script), "gpu": "H100"}),
                       ("predict", {"script": str(tmp_path / "missing.py")}),
                       ("predict", {"script": str(failing)})], roots=[tmp_path])
    (err, text), (bad_err, bad_text), (failed_err, failed_text) = answers
    assert not err, text
    got = json.loads(text)
    assert got["peak_allocated"] == 6 << 20 and got["fits"] is True
    assert bad_err and "missing.py" in bad_text and "no such script" in bad_text
    # a script that raises gets no verdict: the tool answers with the script's error, never "fits"
    assert failed_err and "raises.py" in failed_text and "ValueError" in failed_text and "fits" not in failed_text
