"""How the verbs print machine-readable results (``--json``): one JSON document on stdout.

It lives beside the verbs, not in `memlens.cli`, so that a verb never imports the dispatcher that loads it."""
from __future__ import annotations

import json
import sys


def print_json(obj) -> None:
    """Print `obj` as one JSON document on stdout (values JSON cannot hold, such as paths, as their str)."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
