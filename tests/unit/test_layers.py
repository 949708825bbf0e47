"""Imports run one way: the data model below its storage, the package face above everything inside it."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "memlens"


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` in `path` names (function-level ones included);
    ``from memlens import x`` counts as ``memlens.x``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            out += [f"{module}.{a.name}" for a in node.names] if module == "memlens" else [module]
    return out


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """`module` is one of `packages` or inside one (``memlens.trace.schema`` is within ``memlens.trace``)."""
    return any(module == p or module.startswith(p + ".") for p in packages)


# the data model (memlens/trace/): the Trace, its schema, its checks and its saved directory; it imports only
# itself and the shared leaf modules, never the recorder or the importers that produce Traces
DATA_MODEL = sorted((ROOT / "trace").glob("*.py"))
DATA_MODEL_MAY_IMPORT = ("memlens.trace", "memlens.errors", "memlens.limits", "memlens.units")

# the producers (the recorder, the importers) stand on the data model and the leaf modules beside it, never on
# an analysis, a figure or a face above; they are siblings and import neither the other
PRODUCERS = ("io", "recording")
PRODUCERS_MAY_IMPORT = DATA_MODEL_MAY_IMPORT + ("memlens.opfacts", "memlens.gpu_activity", "memlens.clock",
                                                "memlens.buildcache", "memlens.buildlock", "memlens.buildprogress")


def test_the_data_model_is_one_folder():
    """No data-model module is left beside the package at its old path."""
    old = ("trace.py", "schema.py", "trace_checks.py", "tracedir.py", "io/store.py", "io/partitioned.py")
    assert [name for name in old if (ROOT / name).exists()] == []
    assert {p.name for p in DATA_MODEL} >= {"__init__.py", "model.py", "schema.py", "checks.py", "tracedir.py",
                                            "read.py", "partitioned.py"}


@pytest.mark.parametrize("path", DATA_MODEL, ids=lambda p: p.name)
def test_the_data_model_imports_nothing_above_it(path):
    inside = [m for m in imported_modules(path) if m.startswith("memlens")]
    assert [m for m in inside if not _within(m, DATA_MODEL_MAY_IMPORT)] == []


@pytest.mark.parametrize("producer", PRODUCERS)
def test_the_producers_import_only_the_data_model_and_the_leaves(producer):
    own = (f"memlens.{producer}",)
    bad = [f"{f.relative_to(ROOT)}: {m}" for f in (ROOT / producer).rglob("*.py") for m in imported_modules(f)
           if m.startswith("memlens") and not _within(m, own + PRODUCERS_MAY_IMPORT)]
    assert bad == []


def test_the_imported_module_names_are_read_as_written(tmp_path):
    """The reader above, on a module written here: every import form, function-level ones included."""
    import textwrap
    source = textwrap.dedent("""
        import memlens.trace.schema, os
        from memlens import limits
        from memlens.trace.tracedir import save_trace
        from . import sibling
        def f():
            from memlens.io import load
    """)
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert sorted(imported_modules(path)) == ["memlens.io", "memlens.limits", "memlens.trace.schema",
                                              "memlens.trace.tracedir", "os"]


def test_no_module_inside_the_package_imports_its_face():
    """`memlens/__init__.py` loads the IPython magics (the top layer), so a module inside that imported the
    package face would import upward; they import the submodule they use instead."""
    face_only = {"memlens", "memlens.__version__", "memlens.load_ipython_extension"}
    bad = [f"{f.relative_to(ROOT)}: {m}" for f in ROOT.rglob("*.py") if f != ROOT / "__init__.py"
           for m in imported_modules(f) if m in face_only]
    assert bad == []


def test_verbs_do_not_import_the_dispatcher_that_loads_them():
    """`memlens.cli` discovers and imports the verbs; a verb printing JSON takes `print_json` from
    `memlens.commands._output`."""
    bad = [f.name for f in (ROOT / "commands").glob("*.py")
           if any(m == "memlens.cli" for m in imported_modules(f))]
    assert bad == []


def test_expandable_segments_do_not_import_the_allocator_that_uses_them():
    assert not [m for m in imported_modules(ROOT / "simulate" / "expandable.py") if m == "memlens.simulate.caching"]


def test_op_facts_sit_below_the_recorder_and_the_importers():
    """`memlens.opfacts` (per-op cost facts) is shared by the recorder and the importers: it imports no other
    memlens module above the errors, and the importers never import the recorder (they take the facts from
    opfacts, as the recorder does)."""
    bad = [f"{f.name}: {m}" for f in (ROOT / "opfacts").glob("*.py") for m in imported_modules(f)
           if m.startswith("memlens") and not m.startswith(("memlens.opfacts", "memlens.errors"))]
    bad += [f"io/{f.name}: {m}" for f in (ROOT / "io").rglob("*.py") for m in imported_modules(f)
            if m.startswith("memlens.recording")]
    assert bad == []


def test_user_categories_sit_below_figures_reports_and_the_cli():
    """`memlens.categories` reads a Trace and returns a Trace: it imports only itself and the
    errors; the commands and the package face import it, never the other way round."""
    bad = [f"categories/{f.name}: {m}" for f in (ROOT / "categories").glob("*.py") for m in imported_modules(f)
           if m.startswith("memlens") and not m.startswith(("memlens.categories", "memlens.errors"))]
    assert bad == []


def test_the_advisor_sits_below_figures_reports_and_the_cli():
    """`memlens.advise` combines the predictions, replays and planners beside it; the faces (figures, widgets,
    reports, commands, MCP, magics) import it, never the other way round."""
    above = ("memlens.viz", "memlens.widgets", "memlens.reporting", "memlens.commands", "memlens.mcp_server",
             "memlens.magics", "memlens.cli")
    bad = [f"advise/{f.name}: {m}" for f in (ROOT / "advice").glob("*.py") for m in imported_modules(f)
           if m.startswith(above)]
    assert bad == []


# the recording's build, one stage per module: drain (build), join (joining, on join and join_unmatched),
# assemble, write (streamsave); `memlens.recording.pipeline.build_trace` calls them in that order
BUILD_STAGES = {"build": "drain", "joining": "join", "join": "join", "join_unmatched": "join",
                "assemble": "assemble", "streamsave": "write"}


def test_no_build_stage_imports_another_stage_or_what_calls_it():
    """A walk from `memlens.record()` to the saved trace goes recorder -> pipeline -> each stage in turn and
    never comes back to a module it left: no stage module imports another stage's module, the pipeline or
    the recorder."""
    bad = []
    for name, stage in BUILD_STAGES.items():
        for m in imported_modules(ROOT / "recording" / f"{name}.py"):
            other = m.removeprefix("memlens.recording.")
            if other in ("pipeline", "recorder") or BUILD_STAGES.get(other, stage) != stage:
                bad.append(f"recording/{name}.py ({stage}): {m}")
    assert bad == []


def test_build_trace_calls_the_stages_in_order():
    """The body of `build_trace` names its stages top-down: the session's events, drain, join, assemble, write."""
    import ast
    tree = ast.parse((ROOT / "recording" / "pipeline.py").read_text())
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("build_trace", "_build_windowed")]:
        calls = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        stages = [c for c in calls if c in ("with_session_events", "drain_tables", "drain_windowed", "join_tables",
                                           "assemble_trace", "write_in_memory", "write_windowed")]
        lines = {c: min(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id == c) for c in stages}
        assert sorted(set(stages), key=lines.get) == ([
            "with_session_events", "drain_tables", "join_tables", "assemble_trace", "write_in_memory"]
            if fn.name == "build_trace" else
            ["drain_windowed", "join_tables", "assemble_trace", "write_windowed"])
