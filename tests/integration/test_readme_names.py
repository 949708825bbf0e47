"""Every dotted ``memlens.<...>`` name the README and the documentation pages (docs/*.md) write in code (blocks
and inline) resolves in a fresh interpreter as a user reaches it: the longest prefix that is a module is
imported (``import memlens.analysis.ati``), the rest are attributes (``memlens.record`` is a function of the
package; `memlens.widgets.Explorer` once raised AttributeError)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RESOLVE = """
import importlib, json, memlens
bad = []
for name in json.loads(input()):
    parts = name.split('.')
    obj, k = memlens, 1
    for n in range(len(parts), 1, -1):   # the longest prefix that is a module, imported as a user would
        try:
            obj, k = importlib.import_module('.'.join(parts[:n])), n
            break
        except ImportError:
            continue
    try:
        for part in parts[k:]:
            obj = getattr(obj, part)
    except AttributeError as e:
        bad.append(f'{name}: {e}')
print(json.dumps(bad))
"""


def readme_names() -> list[str]:
    # the changelog names what was renamed, old names included; every other page names what works today
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "changelog.md"]
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *pages])
    code = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    names = set()
    for chunk in code:
        names |= set(re.findall(r"(?<![\w./-])memlens(?:\.[A-Za-z_]\w*)+", chunk))
    # a path such as memlens/recording/native or a file name (memlens.json) is not an attribute chain
    return sorted(n for n in names if not n.endswith((".json", ".html", ".py", ".memlens", ".toml")))


def test_readme_names_resolve_as_a_user_reaches_them():
    names = readme_names()
    assert len(names) >= 15  # README and docs name this many public objects today; the scan must find them
    out = subprocess.run([sys.executable, "-c", _RESOLVE], input=json.dumps(names), capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_a_missing_name_is_reported():
    """The resolver is not vacuous: a wrong attribute and a wrong module are both named."""
    out = subprocess.run([sys.executable, "-c", _RESOLVE], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         input=json.dumps(["memlens.analysis.ati.no_such_thing", "memlens.no_such_module.x",
                                           "memlens.record", "memlens.analysis.ati"]))
    bad = json.loads(out.stdout)
    assert [b.split(":")[0] for b in bad] == ["memlens.analysis.ati.no_such_thing", "memlens.no_such_module.x"]
