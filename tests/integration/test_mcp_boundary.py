"""`memlens mcp`'s trust boundary and every tool argument: the tools read and run only inside the server's roots,
arguments are bounded, malformed lines get JSON-RPC errors, and each argument (device, conf, capacity, top, the
diff default) changes the answer exactly as a hand-computed reference says."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from memlens.trace import Trace

pytest.importorskip("mcp.client.stdio", reason="needs the mcp extra (pip install 'memlens[mcp]')")

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _env() -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def talk(calls, cwd, roots=(), client_roots=None):
    """Start `memlens mcp --root R...` in `cwd` and run `calls` [(tool, arguments)] through mcp's client;
    `client_roots`: directories the client announces as its roots. Returns [(is_error, text)]."""
    import anyio
    import mcp_types as types
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def list_roots(_context):
        return types.ListRootsResult(roots=[types.Root(uri=Path(d).resolve().as_uri()) for d in client_roots])

    async def go():
        args = ["-m", "memlens", "mcp", *[a for r in roots for a in ("--root", str(r))]]
        params = StdioServerParameters(command=sys.executable, args=args, env=_env(), cwd=str(cwd))
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                kw = {"list_roots_callback": list_roots} if client_roots is not None else {}
                async with ClientSession(read, write, **kw) as session:
                    await session.initialize()
                    out = []
                    for name, arguments in calls:
                        r = await session.call_tool(name, arguments)
                        out.append((bool(r.is_error), "".join(c.text for c in r.content if c.type == "text")))
                    return out
    return anyio.run(go)


def _block(i, dev, size, alloc, free, stack=None):
    return {"block_id": i, "device": dev, "size": size, "alloc_ns": alloc, "free_ns": free, "stack_id": stack}


def two_device_trace(source_file: str) -> Trace:
    """cuda:0: 1 KiB [0, 50) and 3 KiB [10, 40): peak 4 KiB. cuda:1: 11 MiB [0, 100) from `source_file` line 2,
    1 MiB [20, 30) from line 3: peak 12 MiB, the 11 MiB site first."""
    stacks = pd.DataFrame([{"stack_id": 0, "depth": 0, "name": "big", "filename": source_file, "line": 2},
                           {"stack_id": 1, "depth": 0, "name": "small", "filename": source_file, "line": 3}])
    blocks = pd.DataFrame([_block(1, "cuda:0", 1024, 0, 50), _block(2, "cuda:0", 3072, 10, 40),
                           _block(3, "cuda:1", 11 * MiB, 0, 100, 0), _block(4, "cuda:1", MiB, 20, 30, 1)])
    return Trace.from_tables(blocks, metadata={"source_kind": "synthetic"}, stacks=stacks)


@pytest.fixture
def places(tmp_path):
    """`work/` (the server's working directory, holding the traces), `outside/` (a secret script and source)."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "model.py").write_text("# outside\nsecret_line = 1\nother = 2\n")
    (work / "model.py").write_text("# inside\nbig = alloc(3)\nsmall = alloc(1)\n")
    two_device_trace(str(outside / "model.py")).save(work / "far.memlens")
    two_device_trace(str(work / "model.py")).save(work / "near.memlens")
    return work, outside


def test_every_argument_against_a_reference(places):
    work, _ = places
    near = str(work / "near.memlens")
    # B: cuda:0 as in A plus 12 new blocks of distinct sizes, so that `appeared` has 12 rows
    extra = [_block(10 + k, "cuda:0", 512 * (k + 1), 60, 70) for k in range(12)]
    a = Trace.from_tables(pd.DataFrame([_block(1, "cuda:0", 1024, 0, 50)]), metadata={"source_kind": "synthetic"})
    b = Trace.from_tables(pd.DataFrame([_block(1, "cuda:0", 1024, 0, 50), *extra]),
                          metadata={"source_kind": "synthetic"})
    a.save(work / "a.memlens")
    b.save(work / "b.memlens")
    answers = talk([
        ("peak_cause", {"path": near, "device": "cuda:1"}),
        ("peak_cause", {"path": near, "device": "cuda:7"}),
        ("sites", {"path": near, "device": "cuda:1", "top": 1}),
        ("sites", {"path": near, "device": "cuda:1"}),
        ("simulate", {"path": near, "device": "cuda:1"}),
        ("simulate", {"path": near, "device": "cuda:1", "conf": "expandable_segments:True"}),
        ("simulate", {"path": near, "device": "cuda:1", "capacity": "1MiB"}),
        ("simulate", {"path": near}),
        ("diff", {"path_a": "a.memlens", "path_b": "b.memlens"}),
        ("diff", {"path_a": "a.memlens", "path_b": "b.memlens", "top": 3}),
    ], cwd=work)
    assert not any(err for err, _ in answers[:1] + answers[2:]), answers
    texts = [json.loads(t) if not e else t for e, t in answers]
    cause, missing, site1, sites_all, sim, sim_exp, sim_cap, sim_all, diff_default, diff_top3 = texts
    assert list(cause) == ["cuda:1"] and cause["cuda:1"]["allocated_bytes"] == 12 * MiB
    assert answers[1][0] and "cuda:7" in missing and "cuda:0" in missing
    # top cut: the largest site only; without top both sites, largest first
    assert [(r["site"], r["bytes"]) for r in site1["cuda:1"]] == [("model.py:2 big", 11 * MiB)]
    assert [(r["site"], r["bytes"]) for r in sites_all["cuda:1"]] == [("model.py:2 big", 11 * MiB),
                                                                     ("model.py:3 small", MiB)]
    assert list(site1) == ["cuda:1"]
    # the caching allocator by hand: an 11 MiB request (10 MiB or more) gets its size rounded up to 2 MiB, a
    # 12 MiB segment, and the 1 MiB one a 2 MiB small-pool segment; expandable segments map the large pool in
    # 20 MiB pages instead: 20 MiB + 2 MiB
    assert list(sim) == ["cuda:1"]
    assert (sim["cuda:1"]["peak_reserved"], sim["cuda:1"]["segment_alloc_bytes"]) == (14 * MiB, 14 * MiB)
    assert (sim_exp["cuda:1"]["peak_reserved"], sim_exp["cuda:1"]["segment_allocs"]) == (22 * MiB, 2)
    assert sim["cuda:1"]["ooms"] == [] and len(sim_cap["cuda:1"]["ooms"]) == 2  # no segment fits in 1 MiB
    assert sorted(sim_all) == ["cuda:0", "cuda:1"] and sim_all["cuda:0"]["peak_allocated"] == 4096
    assert len(diff_default["appeared"]) == 10 and len(diff_top3["appeared"]) == 3  # the default cut is 10


def test_reads_and_runs_only_inside_the_roots(places, tmp_path):
    work, outside = places
    marker = tmp_path / "ran"
    stdlib_timeit = Path(subprocess.__file__).with_name("timeit.py")
    (work / "notes.txt").write_text("import os\n")
    answers = talk([
        ("predict", {"script": str(stdlib_timeit), "args": ["-s", f"open({str(marker)!r}, 'w')", "pass"]}),
        ("predict", {"script": str(work / "notes.txt")}),
        ("predict", {"script": str(work / "model.py"), "gpu": str(outside / "gpu.json")}),
        ("info", {"path": str(outside / "model.py")}),
        ("sites", {"path": "far.memlens", "device": "cuda:1"}),
        ("info", {"path": "far.memlens"}),
        ("sites", {"path": "near.memlens", "device": "cuda:1"}),
        ("sites", {"path": "near.memlens", "source_root": str(outside)}),
        ("info", {"path": "x" * 100_000}),  # under the 1 MiB message limit, over the argument one
    ], cwd=work)
    (e1, t1), (e2, t2), (e3, t3), (e4, t4), (_, far_sites), (_, far_info), (_, near_sites), (e8, t8), (e9, t9) = answers
    assert not marker.exists()
    assert e1 and "outside the directories" in t1
    assert e2 and "not a .py file" in t2
    assert e3 and "gpu" in t3 and "outside" in t3
    assert e4 and "outside the directories" in t4
    assert [r["source"] for r in json.loads(far_sites)["cuda:1"]] == [None, None]
    assert "secret_line" not in far_info
    assert [r["source"] for r in json.loads(near_sites)["cuda:1"]] == ["big = alloc(3)", "small = alloc(1)"]
    assert e8 and "source_root" in t8
    assert e9 and len(t9) < 1000 and "more characters" in t9


def test_start_roots_and_client_roots(places, tmp_path):
    work, outside = places
    other = tmp_path / "elsewhere"
    other.mkdir()
    two_device_trace("x.py").save(other / "here.memlens")
    # a root named at start: its files may be read even though it is not the working directory
    (e1, t1), = talk([("sites", {"path": str(work / "far.memlens"), "device": "cuda:1"})], cwd=other,
                     roots=[work, outside])
    assert not e1 and [r["source"] for r in json.loads(t1)["cuda:1"]] == ["secret_line = 1", "other = 2"]
    # the client's roots replace the working directory
    (e2, t2), (e3, t3) = talk([("info", {"path": str(work / "near.memlens")}),
                              ("info", {"path": str(other / "here.memlens")})], cwd=other, client_roots=[work])
    assert not e2 and json.loads(t2)["blocks"] == 4
    assert e3 and "outside the directories" in t3


def test_malformed_lines_get_json_rpc_errors(tmp_path):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    lines = [json.dumps(init), "not json", json.dumps({"id": 7}), "x" * (2 * MiB),
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})]
    # stdin stays open until the ping is answered: at EOF a client abandons what is in flight, and so may the server
    proc = subprocess.Popen([sys.executable, "-m", "memlens", "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, env={**os.environ, **_env()})
    out: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [out.put(ln) for ln in proc.stdout], daemon=True).start()
    proc.stdin.write("\n".join(lines) + "\n")
    proc.stdin.flush()
    replies = []
    try:
        while not any(r.get("id") == 2 for r in replies):
            replies.append(json.loads(out.get(timeout=60)))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    errors = [(r["id"], r["error"]["code"]) for r in replies if "error" in r]
    assert errors == [(None, -32700), (7, -32600), (None, -32600)]
    # the reader answers bad lines at once and the server answers requests in its own task: order across them varies
    assert [r for r in replies if r.get("id") == 1 and "result" in r]
    assert {"id": 2, "jsonrpc": "2.0", "result": {}} in replies


def test_guard_by_hand(tmp_path):
    """The checks without a server: the limits' exact edges."""
    from memlens.errors import InputError
    from memlens.mcp_guard import MAX_ARG_CHARS, Roots, check_arguments, clip, roots_from_uris

    roots = Roots([tmp_path])
    (tmp_path / "in.memlens").mkdir()
    (tmp_path / "link").symlink_to("/")
    check_arguments("info", {"path": str(tmp_path / "in.memlens")}, roots)
    check_arguments("info", {"path": str(tmp_path)}, roots)  # the root itself
    for bad in (str(tmp_path / "link" / "etc"), str(tmp_path / ".." / "x"), str(tmp_path) + "x"):
        with pytest.raises(InputError, match="outside"):
            check_arguments("info", {"path": bad}, roots)
    check_arguments("simulate", {"conf": "c" * MAX_ARG_CHARS, "path": str(tmp_path)}, roots)
    with pytest.raises(InputError, match="at most 4096"):
        check_arguments("simulate", {"conf": "c" * (MAX_ARG_CHARS + 1), "path": str(tmp_path)}, roots)
    with pytest.raises(InputError, match="args"):
        check_arguments("predict", {"args": ["a"] * 257, "script": "x.py"}, roots)
    assert clip("abc", 3) == "abc" and clip("abcd", 3) == "abc... (1 more characters)"
    assert roots_from_uris(["file:///home/me/p%20q", "https://x/y", "file://host/z"]) == ["/home/me/p q"]


def test_guard_edges_of_script_args_and_start_roots(tmp_path):
    """Exactly `MAX_SCRIPT_ARGS` (256) arguments pass the args check (257 are refused above); a string with a
    NUL is refused whatever its length; a predict timeout of exactly 3600 s is allowed, 0 and 3600.5 s are
    not; a GPU file outside the roots is refused before it is read; ``--root`` must name a directory: a
    regular file is refused, as is a path that does not exist.
    Mutants killed: ``len(args) >= MAX_SCRIPT_ARGS``; the NUL check dropped; ``timeout_s < 3600``; the GPU
    file's root check dropped; ``os.path.exists`` for ``os.path.isdir``."""
    from memlens.errors import InputError
    from memlens.mcp_guard import MAX_SCRIPT_ARGS, Roots, check_arguments, start_roots

    assert MAX_SCRIPT_ARGS == 256
    check_arguments("info", {"args": ["a"] * 256, "path": str(tmp_path)}, Roots([tmp_path]))
    with pytest.raises(InputError) as err:  # a NUL in a short string: refused like an overlong one
        check_arguments("simulate", {"conf": "a\x00b", "path": str(tmp_path)}, Roots([tmp_path]))
    assert str(err.value) == "conf: at most 4096 characters and no NUL, got 'a\\x00b'"
    (tmp_path / "file.txt").write_text("x")
    script = tmp_path / "step.py"
    script.write_text("pass\n")
    check_arguments("predict", {"script": str(script), "timeout_s": 3600}, Roots([tmp_path]))  # an hour: allowed
    for bad in (0, 3600.5):
        with pytest.raises(InputError, match=r"timeout_s must be in \(0, 3600\] seconds"):
            check_arguments("predict", {"script": str(script), "timeout_s": bad}, Roots([tmp_path]))
    outside = tmp_path.parent / "gpu.json"
    with pytest.raises(InputError, match=r"^gpu '.*gpu\.json' is outside the directories"):
        check_arguments("predict", {"script": str(script), "gpu": str(outside)}, Roots([tmp_path]))
    assert start_roots([str(tmp_path)]) == [str(tmp_path)]
    for bad in (tmp_path / "file.txt", tmp_path / "missing"):
        with pytest.raises(InputError) as err:
            start_roots([str(bad)])
        assert str(err.value) == f"--root {bad}: not a directory"


@pytest.mark.slow  # three predictions, each a child process importing torch
def test_predict_arguments_against_a_hand_reference(places):
    """A script holding `argv[1]` x 1 MiB of float32 on fake CUDA, 44 MiB here: the caching allocator rounds a
    request of 10 MiB or more up to a 2 MiB multiple (44 MiB reserved); expandable segments map the large pool
    in 20 MiB pages (3 pages, 60 MiB). `args` reach the script, `gpu`, `conf` and `capacity` the prediction."""
    work, _ = places
    (work / "holds.py").write_text("import sys, torch\na = torch.empty(int(sys.argv[1]) << 18, device='cuda')\n")
    answers = talk([("predict", {"script": "holds.py", "args": ["44"]}),
                    ("predict", {"script": "holds.py", "args": ["44"], "gpu": "A100",
                                 "conf": "expandable_segments:True"}),
                    ("predict", {"script": "holds.py", "args": ["44"], "capacity": "8MiB"})], cwd=work)
    assert not any(err for err, _ in answers), answers
    plain, expandable, small = (json.loads(t) for _, t in answers)
    assert (plain["peak_allocated"], plain["peak_reserved"], plain["fits"]) == (44 * MiB, 44 * MiB, True)
    assert "H100" in plain["gpu"] and "A100" in expandable["gpu"]
    assert (expandable["peak_allocated"], expandable["peak_reserved"]) == (44 * MiB, 60 * MiB)
    assert (small["capacity"], small["fits"]) == (8 * MiB, False)


ADVISE_SCRIPT = """
import sys, torch, torch.nn as nn
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4      # blocks: the script's argument
class Block(nn.Module):
    def __init__(self, d=256):
        super().__init__(); self.ln = nn.LayerNorm(d); self.fc1 = nn.Linear(d, 4 * d); self.fc2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
class Net(nn.Module):
    def __init__(self, n=4, d=256):
        super().__init__(); self.layers = nn.ModuleList(Block(d) for _ in range(n)); self.head = nn.Linear(d, 10)
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()
def build_model():
    return Net(N)
def step(model, opt):
    model(torch.randn(32, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
if __name__ == "__main__":
    print("the training loop would run here")
"""


@pytest.mark.slow  # six advice searches through the server, each a child process, and their references
def test_advise_every_argument_against_memlens_advise(places):
    """The advise tool against `memlens.advise` called directly with the same arguments: the script's args,
    gpu, capacity (and the GPU's own memory without one), world_size, objective, and a recorded trace."""
    from _predict_cases import run_child
    from memlens.io import load
    work, outside = places
    script = work / "train.py"
    script.write_text(ADVISE_SCRIPT)
    (outside / "train.py").write_text(ADVISE_SCRIPT)
    cases = [({"capacity": "900MiB"}, dict(args=[], capacity="900MiB")),
             ({"args": ["2"], "capacity": "900MiB", "objective": "fastest_fit"},
              dict(args=["2"], capacity="900MiB", objective="fastest_fit")),
             ({"gpu": "A100", "capacity": "700MiB", "objective": "pareto"},
              dict(args=[], gpu="A100", capacity="700MiB", objective="pareto")),
             ({"world_size": 2, "capacity": "900MiB"}, dict(args=[], capacity="900MiB", world_size=2)),
             ({}, dict(args=[], capacity=None))]
    answers = talk([("advise", {"script": "train.py", **tool}) for tool, _ in cases] + [
        ("advise", {"path": "near.memlens", "capacity": "13MiB", "objective": "pareto"}),
        ("advise", {"path": "near.memlens", "capacity": "3KiB"}),
        ("advise", {"script": "train.py", "path": "near.memlens"}),
        ("advise", {"path": "near.memlens", "world_size": 2}),
        ("advise", {"script": "train.py", "world_size": 0}),
        ("advise", {"script": "train.py", "objective": "smallest"}),
        ("advise", {"script": "train.py", "capacity": "x" * 3000}),
        ("advise", {"script": str(outside / "train.py")}),
        ("advise", {"script": "train.py", "gpu": "Z9000"}),
    ], cwd=work)
    assert not any(err for err, _ in answers[:7]), answers[:7]
    got = [json.loads(t) for _, t in answers[:7]]
    calls = [{"gpu": "H100", "objective": "fit", "world_size": None, **ref} for _, ref in cases]
    want = run_child(f"""
out = []
for kw in {calls!r}:
    d = memlens.advise({str(script)!r}, kw.pop("args"), **kw).to_dict()
    d.pop("best_snippet")
    out.append(json.loads(json.dumps(d, default=str)))
result = out
""")
    for (tool, _), g, w in zip(cases, got, want):
        assert g == w, tool
    # the arguments reach the search: 2 blocks fit with fewer changes; A100 and world_size change the answer
    assert got[1]["plans"] != got[0]["plans"] and got[2]["plans"] != got[0]["plans"]
    assert "shard with" in " ".join(r["changes"] for r in got[3]["plans"])
    assert got[4]["capacity"] is None and got[0]["capacity"] == 900 * MiB
    assert got[0]["best"]["snippet"] and got[0]["best"] == {**got[0]["plans"][got[0]["best"]["rank"] - 1],
                                                              "rank": got[0]["best"]["rank"],
                                                              "snippet": got[0]["best"]["snippet"]}
    # a recorded trace: allocator settings replayed on its first cuda device, as memlens.advise does
    import memlens
    for (_, kw), g in zip([({}, dict(capacity="13MiB", objective="pareto")), ({}, dict(capacity="3KiB"))], got[5:7]):
        ref = memlens.advise(load(str(work / "near.memlens")), **kw).to_dict()
        ref.pop("best_snippet")
        assert g == json.loads(json.dumps(ref, default=str))
    # pareto keeps only frontier plans; no replay of a recording has a modeled step time, so memory alone
    # decides: the one plan needing the least device memory of the five replayed
    assert len(got[6]["plans"]) == 5 and len(got[5]["plans"]) == 1
    assert got[5]["plans"][0]["device_bytes_needed"] == min(p["device_bytes_needed"] for p in got[6]["plans"])
    assert got[6]["best"] is None and got[6]["miss_bytes"] > 0
    errors = answers[7:]
    assert all(err for err, _ in errors), errors
    both, trace_ws, ws0, objective, capacity, outside_script, gpu = (t for _, t in errors)
    assert "exactly one of script" in both
    assert "apply to a script" in trace_ws
    assert "world_size" in ws0 and "4096" in ws0
    assert "objective" in objective and "fastest_fit" in objective
    assert "capacity" in capacity and len(capacity) < 400 and "more characters" in capacity
    assert "outside the directories" in outside_script
    assert "Z9000" in gpu
