"""User-defined categories (`memlens.categorize`): ordered regex rules over a block's frames, module path,
op, annotations, phase and built-in category decide its category; each block keeps the rule that decided
it. Rules come from Python (a list of dicts / tuples) or a TOML file (``--categories rules.toml`` on
``memlens info``, ``report`` and ``diff``). See `memlens.categories.rules` for the format and
`memlens.categories.builtin` for memlens's own categories written as rules (where a regex can say them).

A stage below the figures, reports and CLI, beside the analyses: it reads a Trace and returns a Trace.
"""
from __future__ import annotations

from memlens.categories.builtin import DEFAULT_RULES, FRAME_RULES
from memlens.categories.engine import categorize
from memlens.categories.rules import BUILTIN, MATCH_FIELDS, Rule, RuleSet, load_rules, read_rules_file

__all__ = ["categorize", "DEFAULT_RULES", "FRAME_RULES", "load_rules", "read_rules_file", "Rule", "RuleSet", "BUILTIN", "MATCH_FIELDS"]
