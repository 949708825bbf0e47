"""User categories: `memlens.categorize` with ordered regex rules from Python or TOML,
first match wins, each block keeping the rule that decided it; ``--categories`` on info, diff and report.
Every expected number is counted here by hand, row by row with Python's `re`, not by the engine."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pandas as pd
import pytest

import memlens
from memlens.analysis.peak import peak_breakdown
from memlens.categories import categorize, load_rules
from memlens.cli import main
from memlens.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "mlp_train_sgd_stacks.memlens"


def _frames_by_stack(trace) -> dict[int, list[tuple[str, str, int]]]:
    """stack_id -> [(function, file with '/', line)] innermost first, by a plain loop over the rows."""
    out: dict[int, list] = {}
    st = trace.stacks if trace.stacks is not None else pd.DataFrame(columns=["stack_id", "depth"])
    for r in st.sort_values(["stack_id", "depth"]).itertuples(index=False):
        out.setdefault(int(r.stack_id), []).append((str(r.name), str(r.filename).replace("\\", "/"), int(r.line)))
    return out


def _hand_categories(trace, rules: list[tuple[str, str, str]]) -> list[str]:
    """The category of every block under `rules` ((category, field, pattern); "@builtin" keeps), first match
    wins, unmatched "unknown": one block at a time."""
    stacks = _frames_by_stack(trace)
    op_phase = dict(zip(trace.ops["op_id"], trace.ops["phase"])) if "phase" in trace.ops.columns else {}
    out = []
    for r in trace.blocks.itertuples(index=False):
        frames = stacks.get(int(r.stack_id), []) if not pd.isna(r.stack_id) else []
        phase = getattr(r, "phase", None)
        if phase is None:  # a recording: the phase of the op that allocated the block
            phase = op_phase.get(int(r.alloc_op_id), "") if not pd.isna(r.alloc_op_id) else ""
        texts = {"module": [str(r.module)], "op": [str(r.op)], "builtin": [str(r.category)], "phase": [phase],
                 "function": [f[0] for f in frames], "file": [f[1] for f in frames],
                 "frame": [f"{f[1]}:{f[2]} {f[0]}" for f in frames],
                 "stack": ["\n".join(f"{f[1]}:{f[2]} {f[0]}" for f in frames)] if frames else []}
        chosen = "unknown"
        for category, field, pattern in rules:
            if field is None or any(re.search(pattern, t) for t in texts[field]):
                chosen = str(r.category) if category == "@builtin" else category
                break
        out.append(chosen)
    return out


def _bytes(categories, sizes) -> dict[str, int]:
    total: dict[str, int] = {}
    for c, s in zip(categories, sizes):
        total[c] = total.get(c, 0) + int(s)
    return total


RULES = [("first_layer", "module", r"^model\.0$"), ("matmul", "op", r"^aten::(add)?mm$"),
         ("data", "stack", r"generate\.py:42 batch\n.*generate\.py:45 "), ("grads", "builtin", r"^gradient$"),
         ("backward", "phase", r"^backward$"), ("generated", "frame", r"generate\.py:45 "), ("@builtin", None, None)]


def _as_dicts(rules):
    return [{"category": c, **({f: p} if f else {})} for c, f, p in rules]


def test_rules_reproduce_a_hand_count_on_a_recorded_trace():
    trace = memlens.load(SAMPLE)
    before = trace.blocks.copy()
    assert memlens.categorize is categorize  # the package face names it
    out = categorize(trace, _as_dicts(RULES))
    expected = _hand_categories(trace, RULES)
    assert out.blocks["category"].tolist() == expected
    assert _bytes(out.blocks["category"], out.blocks["size"]) == _bytes(expected, trace.blocks["size"])
    # every rule decided some blocks here, so the count tests each of them
    assert {"first_layer", "matmul", "data", "backward", "grads", "generated"} <= set(expected)
    pd.testing.assert_frame_equal(trace.blocks, before)  # the input is not changed
    assert out is not trace and out.blocks["builtin_category"].tolist() == before["category"].tolist()
    # each block names the rule that decided it; @builtin keeps memlens's own rule beside it
    rule = out.blocks["category_rule"]
    assert set(rule[out.blocks["category"] == "first_layer"]) == {"rules[0] first_layer: module ~ ^model\\.0$"}
    kept = out.blocks[rule.str.startswith("rules[6] @builtin: every block")]
    assert len(kept) and all(r.endswith(f"({b})") for r, b in zip(kept["category_rule"], kept["builtin_category_rule"]))
    assert out.metadata["categories"]["rules"][1] == "rules[1] matmul: op ~ ^aten::(add)?mm$"
    # categorising again starts from memlens's own categories, not from the first rules' answer
    again = categorize(out, [("grads", "builtin", "^gradient$"), ("@builtin",)])
    assert again.blocks["category"].tolist() == _hand_categories(trace, [("grads", "builtin", "^gradient$"),
                                                                         ("@builtin", None, None)])
    assert again.blocks["builtin_category"].tolist() == before["category"].tolist()


def test_first_match_wins_and_unmatched_blocks_are_unknown():
    trace = memlens.load(SAMPLE)
    # the same blocks, rules in the other order: the earlier rule takes the blocks both match
    a = categorize(trace, [("mm", "op", "mm"), ("layer0", "module", r"model\.0")])
    b = categorize(trace, [("layer0", "module", r"model\.0"), ("mm", "op", "mm")])
    both = trace.blocks["op"].str.contains("mm") & trace.blocks["module"].str.contains(r"model\.0")
    assert both.any()
    assert (a.blocks.loc[both, "category"] == "mm").all() and (b.blocks.loc[both, "category"] == "layer0").all()
    neither = ~trace.blocks["op"].str.contains("mm") & ~trace.blocks["module"].str.contains(r"model\.0")
    assert (a.blocks.loc[neither, "category"] == "unknown").all()
    assert a.blocks.loc[neither, "category_rule"].str.startswith("no rule matched").all()
    # a rule with several matchers needs all of them
    c = categorize(trace, [("layer0_mm", {"module": r"model\.0", "op": "mm"})])
    assert (c.blocks["category"] == "layer0_mm").tolist() == both.tolist()


def test_toml_rules_name_their_line_and_bad_rules_name_file_and_rule(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text('# my rules\n\n[[rule]]\ncategory = "first_layer"\nmodule = "^model\\\\.0$"\n\n'
                    '[[rule]]\ncategory = "@builtin"\n', encoding="utf-8")
    rules = load_rules(path)
    assert rules.describe() == ["rules.toml:3 first_layer: module ~ ^model\\.0$", "rules.toml:7 @builtin: every block"]
    out = categorize(memlens.load(SAMPLE), str(path))
    assert out.metadata["categories"]["source"] == str(path)
    bad = {"unknown field 'modul'": '[[rule]]\ncategory = "x"\nmodul = "a"\n',
           "is not a regular expression": '[[rule]]\ncategory = "x"\nop = "(("\n',
           "needs a 'category'": '[[rule]]\nop = "mm"\n',
           "not valid TOML": '[[rule]\n',
           "no rules": '# nothing\n',
           "unknown top-level key": 'attention = ".*attn.*"\n'}
    for message, text in bad.items():
        path.write_text(text, encoding="utf-8")
        with pytest.raises(InputError) as err:
            load_rules(path)
        assert message in str(err.value) and str(path) in str(err.value), message
    with pytest.raises(InputError, match=r"rules\[1\]: op: the pattern must be a string"):
        load_rules([("a", "op", "mm"), ("b", "op", 3)])
    path.write_bytes(b"#" * ((4 << 20) + 1))
    with pytest.raises(InputError, match="a rules file holds at most"):
        load_rules(path)
    with pytest.raises(InputError, match="no rules"):
        load_rules([])
    with pytest.raises(InputError, match="no such rules file"):
        load_rules(tmp_path / "absent.toml")


def _annotated_snapshot() -> dict:
    """Five allocations at 1..5 ms on the Unix clock; record_function "attn_block" spans 2..3 ms, "mlp"
    4..4 ms. Sizes 100, 200, 300, 400, 500 bytes; only the last is freed."""
    t0 = 1_700_000_000_000_000  # us
    frames = [{"filename": "lab/model.py", "line": 10 + k, "name": f"layer{k}"} for k in range(5)]
    ev = [{"action": "alloc", "addr": 0x1000 * (k + 1), "size": 100 * (k + 1), "stream": 0,
           "time_us": t0 + 1000 * (k + 1), "frames": [frames[k]]} for k in range(5)]
    ev.append({"action": "free_requested", "addr": 0x5000, "size": 500, "stream": 0, "time_us": t0 + 6000,
               "frames": []})
    ev.append({"action": "free_completed", "addr": 0x5000, "size": 500, "stream": 0, "time_us": t0 + 6001,
               "frames": []})
    ann = [{"name": "attn_block", "stage": "START", "time_us": t0 + 2000, "device": 0},
           {"name": "attn_block", "stage": "END", "time_us": t0 + 3000, "device": 0},
           {"name": "mlp", "stage": "START", "time_us": t0 + 4000, "device": 0},
           {"name": "mlp", "stage": "END", "time_us": t0 + 4000, "device": 0}]
    return {"segments": [], "device_traces": [ev], "external_annotations": ann}


def test_annotation_frame_and_cli_on_a_snapshot(tmp_path, capsys):
    snap = tmp_path / "annotated.pickle"
    snap.write_bytes(pickle.dumps(_annotated_snapshot()))
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncategory = "attention"\nannotation = "^attn"\n\n'
                     '[[rule]]\ncategory = "mlp"\nannotation = "mlp"\n\n'
                     '[[rule]]\ncategory = "layer0"\nframe = "model\\\\.py:10 layer0$"\n', encoding="utf-8")
    trace = memlens.load(snap)
    out = categorize(trace, rules)
    # by hand: 2 ms and 3 ms lie in attn_block (ends included), 4 ms in mlp, 1 ms matches the frame rule,
    # 5 ms nothing
    assert out.blocks.sort_values("alloc_ns")["category"].tolist() == ["layer0", "attention", "attention", "mlp",
                                                                      "unknown"]
    # the peak (all five live at 5 ms): 200 + 300 attention, 400 mlp, 100 layer0, 500 unknown
    peak = peak_breakdown(out)["cuda:0"]
    assert dict(zip(peak.by_category["category"], peak.by_category["bytes"])) == {
        "attention": 500, "unknown": 500, "mlp": 400, "layer0": 100}
    assert main(["info", str(snap), "--json", "--categories", str(rules)]) == 0
    told = json.loads(capsys.readouterr().out)
    assert told["peak"]["cuda:0"]["by_category"] == {"attention": 500, "unknown": 500, "mlp": 400, "layer0": 100}
    assert told["categories"]["rules"][0] == "rules.toml:1 attention: annotation ~ ^attn"
    assert main(["info", str(snap), "--categories", str(rules)]) == 0
    text = capsys.readouterr().out
    assert "categories: by 3 rule(s) of" in text and "attention" in text
    # diff: both sides categorised by the same rules
    assert main(["diff", str(snap), str(snap), "--json", "--categories", str(rules)]) == 0
    assert "attention" in capsys.readouterr().out
    page = tmp_path / "r.html"
    assert main(["report", str(snap), "-o", str(page), "--sections", "summary,peak", "--no-whatif",
                 "--categories", str(rules)]) == 0
    capsys.readouterr()
    assert "attention" in page.read_text(encoding="utf-8")
    # a bad rules file stops before the trace is read, naming the file
    rules.write_text('[[rule]]\ncategory = "x"\nmodul = "a"\n', encoding="utf-8")
    assert main(["info", str(snap), "--categories", str(rules)]) == 2
    err = capsys.readouterr().err
    assert "--categories" in err and "rules.toml" in err and "unknown field 'modul'" in err


def test_user_rules_reproduce_a_hand_count_on_a_real_snapshot(shared):
    trace = memlens.load(shared("snapshots/decomfl_memory.pickle"))
    rules = [("estimator", "file", r"gradient_estimators/"), ("client", "function", r"^local_update$"),
             ("hf", "file", r"transformers/"), ("@builtin", None, None)]
    out = categorize(trace, _as_dicts(rules))
    expected = _hand_categories(trace, rules)
    assert out.blocks["category"].tolist() == expected
    got = _bytes(out.blocks["category"], out.blocks["size"])
    assert got == _bytes(expected, trace.blocks["size"]) and got["estimator"] > 0 and got["client"] > 0


def test_categorised_traces_keep_their_categories_when_saved_and_per_file_in_info(tmp_path, capsys):
    # a notebook's categorised Trace saved (as %memlens passes Trace variables to the CLI) and loaded back
    out = categorize(memlens.load(SAMPLE), [("matmul", "op", "mm"), ("@builtin",)])
    back = memlens.load(out.save(tmp_path / "cat.memlens"))
    assert back.blocks["category"].tolist() == out.blocks["category"].tolist()
    assert back.blocks["category_rule"].tolist() == out.blocks["category_rule"].tolist()
    assert back.metadata["categories"]["rules"] == ["rules[0] matmul: op ~ mm", "rules[1] @builtin: every block"]
    # several files: each one categorised by the same rules
    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"
    for p in (a, b):
        p.write_bytes(pickle.dumps(_annotated_snapshot()))
    rules = tmp_path / "r.toml"
    rules.write_text('[[rule]]\ncategory = "attention"\nannotation = "^attn"\n', encoding="utf-8")
    assert main(["info", str(a), str(b), "--json", "--categories", str(rules)]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    # by hand: 200 + 300 bytes allocated inside attn_block, the other 1000 match no rule
    assert [r["peak"]["cuda:0"]["by_category"] for r in runs] == [{"unknown": 1000, "attention": 500}] * 2


@pytest.mark.parametrize("name", ["cs336_wedsonlin_medium_128_training", "verl_segments_only"])
def test_frame_rules_written_as_user_rules_give_the_builtin_categories(shared, name):
    from memlens.categories import DEFAULT_RULES, FRAME_RULES
    trace = memlens.load(shared(f"snapshots/{name}.pickle"))
    b = trace.blocks
    framed = categorize(trace, list(FRAME_RULES)).blocks
    assert framed["category"].tolist() == b["category"].tolist()
    assert categorize(trace, list(DEFAULT_RULES)).blocks["category"].tolist() == b["category"].tolist()
    # the frame rules decide exactly the blocks memlens's own frame rules decided
    by_frames = b["category_rule"].isin(["cuBLAS / cuDNN frame on the stack", "allocated under autograd's AccumulateGrad"]) \
        | b["category_rule"].str.startswith("made by a function named for a key/value cache")
    assert by_frames.any()  # cs336: 169 gradients; verl: one cuBLAS workspace and vLLM's KV cache blocks
    assert (~framed["category_rule"].str.contains("@builtin")).tolist() == by_frames.tolist()
