"""Brief fuzz targets for the input surfaces of round three (a few seconds each): rules TOML, GPU JSON, MCP
arguments and protocol lines. Whatever the input, the answer is a result or memlens's `InputError`, never
another exception; and what is accepted obeys the schema."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlens.errors import InputError

BRIEF = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=8)


@BRIEF
@given(body=st.text(max_size=300), pattern=st.text(max_size=30))
def test_rules_toml_fuzz(tmp_path, body, pattern):
    from memlens.categories.rules import read_rules_file
    path = tmp_path / "rules.toml"
    for text in (body, f"[[rule]]\ncategory = 'c'\nfunction = {json.dumps(pattern)}\n{body}"):
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            rules = read_rules_file(path)
        except InputError:
            continue
        assert len(rules.rules) >= 1


@BRIEF
@given(field=st.sampled_from(["latency_ns", "mem_bw", "compute_units", "gpus_per_node", "class_scale", "flops",
                              "host_bw", "name", "clock_ghz", "mem_efficiency", "aliases"]), value=json_values)
def test_gpu_json_fuzz(tmp_path, field, value):
    from memlens.devicetime.gpu_schema import NUMBERS
    from memlens.devicetime.gpus import gpu, load_gpu
    d = gpu("H100").to_dict()
    d[field] = value
    path = tmp_path / "g.json"
    path.write_text(json.dumps(d))
    try:
        g = load_gpu(path)
    except InputError as exc:
        assert str(exc).startswith(str(path))
        return
    for name, (_, low, high, low_ok) in NUMBERS.items():
        v = getattr(g, name)
        assert not isinstance(v, bool) and math.isfinite(v) and (v >= low if low_ok else v > low) and v <= high
    assert all(math.isfinite(v) and v > 0 for v in g.flops.values())


@BRIEF
@given(tool=st.sampled_from(["info", "sites", "diff", "simulate", "predict"]),
       args=st.dictionaries(st.sampled_from(["path", "path_a", "script", "source_root", "conf", "gpu", "args",
                                             "capacity", "timeout_s"]), json_values, max_size=4))
def test_mcp_arguments_fuzz(tmp_path, tool, args):
    from memlens.mcp_guard import Roots, check_arguments
    try:
        check_arguments(tool, args, Roots([tmp_path]))
    except InputError as exc:
        assert len(str(exc)) < 2000


@BRIEF
@given(line=st.one_of(st.text(max_size=200), json_values.map(json.dumps)))
def test_mcp_lines_fuzz(line):
    pytest.importorskip("mcp_types")
    import mcp_types as types

    from memlens.mcp_stdio import error_reply
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # noqa: BLE001 - whatever the library raises for a bad line is answered
        reply = error_reply(exc).message
        assert reply.error.code in (types.PARSE_ERROR, types.INVALID_REQUEST)
