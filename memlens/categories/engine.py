"""`memlens.categorize(trace, rules)`: a new Trace whose blocks' categories come from the user's rules.

The input trace is never changed: the result has a copy of the blocks table in which ``category`` and
``category_rule`` are the rules' answer (``category_rule`` names the rule that decided each block, e.g.
``rules.toml:3 attention: module ~ .*attn.*``), and ``builtin_category`` / ``builtin_category_rule`` keep
memlens's own answer. The other tables are shared with the input (nothing here writes to them). Every
analysis, figure, report and diff that groups by category then groups by the user's categories.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from memlens.categories.facts import BlockFacts
from memlens.categories.rules import STACK_FIELDS, RuleSet, TimedPattern, load_rules

NO_RULE = "no rule matched (end the rules with {category = \"@builtin\"} to keep memlens's own categories)"


def categorize(trace, rules, *, source: str | None = None):
    """A new `memlens.Trace` like `trace` whose blocks' ``category`` / ``category_rule`` come from `rules`
    (a `RuleSet`, a path to a TOML file, or a list of dicts / tuples: see `memlens.categories.rules`), the
    first matching rule deciding each block; blocks no rule matches are ``unknown``. `trace` is not changed.
    ``metadata["categories"]`` records the rules used and the bytes per category over all blocks."""
    ruleset = load_rules(rules, source)
    category, why = assign(trace, ruleset)
    blocks = trace.blocks.copy()
    builtin_rule = (blocks["category_rule"].astype(str) if "category_rule" in blocks.columns
                    else pd.Series("", index=blocks.index, dtype=object))
    if "builtin_category" not in blocks.columns:  # categorising a categorised trace keeps the first answer
        blocks["builtin_category"] = blocks["category"].astype(str)
        blocks["builtin_category_rule"] = builtin_rule.to_numpy(dtype=object)
    blocks["category"] = category
    blocks["category_rule"] = why
    meta = dict(trace.metadata)
    meta["notes"] = list(trace.metadata.get("notes", []))
    meta["categories"] = {"source": ruleset.source, "rules": ruleset.describe()}
    return dataclasses.replace(trace, blocks=blocks, metadata=meta)


def assign(trace, ruleset: RuleSet) -> tuple[np.ndarray, np.ndarray]:
    """(category, category_rule) per row of ``trace.blocks`` under `ruleset`, first match winning."""
    facts = BlockFacts(trace)
    n = facts.n
    b = trace.blocks
    # memlens's own answer: kept aside when the trace was categorised by rules before
    first = "builtin_category" in b.columns
    builtin = b["builtin_category" if first else "category"].astype(str).to_numpy(dtype=object)
    rule_col = "builtin_category_rule" if first else "category_rule"
    builtin_rule = (b[rule_col].astype(str).to_numpy(dtype=object) if rule_col in b.columns
                    else np.full(n, "", dtype=object))
    category = np.full(n, "unknown", dtype=object)
    why = np.full(n, NO_RULE, dtype=object)
    open_ = np.ones(n, dtype=bool)
    columns: dict[str, np.ndarray] = {}
    for rule in ruleset.rules:
        if not open_.any():
            break
        hit = open_.copy()
        for field, compiled in rule.matchers.items():
            regex = TimedPattern(compiled, rule.where, field)
            if not hit.any():
                break
            if field in STACK_FIELDS:
                hit &= facts.stack_match(field, regex)
            elif field == "annotation":
                hit &= facts.annotation_match(regex)
            else:
                if field not in columns:
                    columns[field] = facts.column(field)
                hit &= facts.column_match(columns[field], regex)
        if not hit.any():
            continue
        if rule.keeps_builtin:
            category[hit] = builtin[hit]
            said = rule.describe()
            why[hit] = [f"{said} ({r})" if r else said for r in builtin_rule[hit]]
        else:
            category[hit] = rule.category
            why[hit] = rule.describe()
        open_ &= ~hit
    return category, why

