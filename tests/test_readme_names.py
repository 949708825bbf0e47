"""Every dotted ``memlens.<...>`` name the README and the documentation pages (docs/*.md) write in code (blocks
and inline) is reachable after a bare ``import memlens``, in a fresh interpreter (issue 28:
`memlens.widgets.Explorer` raised AttributeError)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_names() -> list[str]:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    code = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    names = set()
    for chunk in code:
        names |= set(re.findall(r"(?<![\w./-])memlens(?:\.[A-Za-z_]\w*)+", chunk))
    # a path such as memlens/record/native or a file name (memlens.json) is not an attribute chain
    return sorted(n for n in names if not n.endswith((".json", ".html", ".py", ".memlens", ".toml")))


def test_readme_names_resolve_after_import_memlens():
    names = readme_names()
    assert len(names) >= 15  # README and docs name this many public objects today; the scan must find them
    code = ("import json, memlens\nbad = []\nfor n in json.loads(input()):\n    obj = memlens\n    try:\n"
            "        for part in n.split('.')[1:]:\n            obj = getattr(obj, part)\n"
            "    except AttributeError as e:\n        bad.append(f'{n}: {e}')\nprint(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(names), capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
