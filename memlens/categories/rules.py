"""User category rules: what they look like, and reading them from Python or a TOML file.

A rule set is an ordered list of rules; the first rule that matches a block decides its category. A rule
is a category name and zero or more matchers, each a regular expression (Python `re`, searched anywhere in
the text: anchor it with ``^``/``$`` to match the whole text) over one thing the trace says about a block;
a rule matches when all its matchers do (a rule with none matches every block):

``frame``      any one frame of the block's allocation stack, written ``file:line function`` (paths with ``/``)
``function``   the function name of any frame of the stack
``file``       the file of any frame of the stack (paths with ``/``, Windows paths included)
``stack``      the whole stack, one ``file:line function`` per line, innermost first
``module``     the block's module path (recorded traces: ``model.layers.3.attn``; snapshots have none)
``op``         the op that allocated it (``aten::mm`` / ``mm``; snapshots: the innermost native frame)
``annotation`` a record_function range open when it was allocated (snapshots' ``external_annotations``)
``phase``      the phase it was allocated in (``forward``, ``backward``, ``optimizer_step`` ...)
``builtin``    memlens's own category for it (``parameter``, ``optimizer_state``, ``unknown`` ...)

The category ``@builtin`` keeps memlens's own category for the blocks the rule matches: as the last rule,
without matchers, it is the fallback for everything the rules before it leave open. Blocks no rule matches
are ``unknown``.

In Python, a rule is a dict (``{"category": "attention", "module": ".*attn.*"}``) or a tuple
(``("attention", "module", ".*attn.*")``, ``("attention", {"module": ".*attn.*", "op": "bmm"})``,
``("@builtin",)``). In a TOML file, each rule is a ``[[rule]]`` table with the same keys::

    [[rule]]
    category = "attention"
    module = ".*attn.*"

    [[rule]]
    category = "@builtin"
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import regex

from memlens.errors import InputError, read_user_file

MATCH_FIELDS = ("frame", "function", "file", "stack", "module", "op", "annotation", "phase", "builtin")
STACK_FIELDS = ("frame", "function", "file", "stack")
BUILTIN = "@builtin"
MAX_RULES = 10_000
MAX_PATTERN = 2_000  # characters: a longer "regex" is a pasted file, not a rule
MAX_FILE_BYTES = 4 << 20  # a rules file past 4 MiB is not a rules file
RULE_SECONDS = 2.0  # time one rule's pattern may spend searching one trace: real patterns take microseconds


class TimedPattern:
    """A rule's compiled pattern, applied to one trace: its searches share `RULE_SECONDS`; past that, an
    `InputError` naming the rule (a pattern such as ``(a|aa)+$`` backtracks exponentially on some names)."""

    def __init__(self, compiled, where: str, field: str):
        self.compiled, self.where, self.field, self.used = compiled, where, field, 0.0

    @property
    def pattern(self) -> str:
        return self.compiled.pattern

    def search(self, text: str):
        start = time.perf_counter()
        try:
            return self.compiled.search(text, timeout=max(RULE_SECONDS - self.used, 1e-3))
        except TimeoutError:
            raise InputError(f"{self.where}: {self.field} pattern {self.compiled.pattern[:80]!r} took over "
                             f"{RULE_SECONDS:g} s on this trace's names (it backtracks without bound, e.g. a "
                             "nested repeat like (a+)+); rewrite it") from None
        finally:
            self.used += time.perf_counter() - start


@dataclass(frozen=True)
class Rule:
    """One rule: the `category` it gives (`BUILTIN`: keep memlens's own), its `matchers` ({field: compiled
    regex}, all must match) and `where` it was written (``rules.toml:3`` or ``rules[2]``)."""

    category: str
    matchers: dict = field(default_factory=dict)
    where: str = ""

    @property
    def keeps_builtin(self) -> bool:
        return self.category == BUILTIN

    def describe(self) -> str:
        """The rule as the ``category_rule`` column shows it: ``rules.toml:3 attention: module ~ .*attn.*``."""
        what = " & ".join(f"{f} ~ {m.pattern}" for f, m in self.matchers.items()) or "every block"
        return f"{self.where} {self.category}: {what}".strip()


@dataclass(frozen=True)
class RuleSet:
    """Ordered rules (first match wins) and `source`, where they came from (a file path or ``rules``)."""

    rules: tuple
    source: str = "rules"

    def __len__(self) -> int:
        return len(self.rules)

    def describe(self) -> list[str]:
        return [r.describe() for r in self.rules]


def load_rules(rules, source: str | None = None) -> RuleSet:
    """A `RuleSet` from `rules`: a RuleSet (returned as is), a path to a TOML file (str or Path ending in
    ``.toml``), or a list of dicts / tuples (see the module docstring). Raises `InputError` naming the file
    or the rule and what is wrong with it."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (str, Path)):
        return read_rules_file(rules)
    if isinstance(rules, dict):
        raise InputError("rules must be a list of rules (dicts or tuples), not one dict; wrap it in [...]")
    try:
        items = list(rules)
    except TypeError:
        raise InputError(f"rules must be a list of dicts or tuples, or a .toml path, not {type(rules).__name__}") \
            from None
    name = source or "rules"
    if not items:
        raise InputError("no rules: give at least one (end with {\"category\": \"@builtin\"} to keep memlens's own "
                         "categories for the rest)")
    return RuleSet(tuple(_rule(item, f"{name}[{i}]", None) for i, item in enumerate(_bounded(items, name))),
                   source=name)


def read_rules_file(path) -> RuleSet:
    """The `RuleSet` of a TOML file of ``[[rule]]`` tables; each rule's `where` is the file's name and the
    line of its ``[[rule]]`` header."""
    path = Path(path)
    try:
        text = read_user_file(path, MAX_FILE_BYTES, "rules file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read the rules file ({exc})", path) from None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the backport (a dependency there)
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", path) from None
    except RecursionError:
        raise InputError("not valid TOML for rules: nested too deeply", path) from None
    extra = sorted(set(data) - {"rule"})
    if extra:
        raise InputError(f"unknown top-level key{'s' if len(extra) > 1 else ''} {', '.join(extra)} (write each "
                         "rule as a [[rule]] table)", path)
    items = data.get("rule", [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InputError("'rule' must be an array of tables: write each rule as a [[rule]] table", path)
    if not items:
        raise InputError("no rules: write each rule as a [[rule]] table", path)
    headers = [k + 1 for k, line in enumerate(text.splitlines()) if re.match(r"\s*\[\[\s*rule\s*\]\]", line)]
    lines = headers if len(headers) == len(items) else None  # e.g. an inline array instead of [[rule]] tables
    where = [f"{path.name}:{lines[i]}" if lines else f"{path.name}#{i + 1}" for i in range(len(items))]
    return RuleSet(tuple(_rule(item, where[i], path) for i, item in enumerate(_bounded(items, path))),
                   source=str(path))


def _bounded(items: list, where) -> list:
    if len(items) > MAX_RULES:
        raise InputError(f"{len(items):,} rules: at most {MAX_RULES:,}", where if isinstance(where, Path) else None)
    return items


def _rule(item, where: str, path) -> Rule:
    def fail(message):
        raise InputError(f"{where}: {message}", path)

    if isinstance(item, dict):
        spec = dict(item)
        category = spec.pop("category", None)
    elif isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
        category = item[0]
        if len(item) == 1:
            spec = {}
        elif len(item) == 2 and isinstance(item[1], dict):
            spec = dict(item[1])
        elif len(item) == 3:
            spec = {item[1]: item[2]}
        else:
            fail("a tuple rule is (category,), (category, field, pattern) or (category, {field: pattern})")
    else:
        fail(f"a rule is a dict or a tuple, not {type(item).__name__}")
    if not isinstance(category, str) or not category.strip():
        fail("needs a 'category' (a non-empty name)")
    matchers = {}
    for key, pattern in spec.items():
        if key not in MATCH_FIELDS:
            fail(f"unknown field {key!r} (fields: {', '.join(MATCH_FIELDS)})")
        if not isinstance(pattern, str):
            fail(f"{key}: the pattern must be a string (a regular expression), not {type(pattern).__name__}")
        if len(pattern) > MAX_PATTERN:
            fail(f"{key}: the pattern is {len(pattern):,} characters (at most {MAX_PATTERN:,})")
        try:
            matchers[key] = regex.compile(pattern)  # Python's syntax, with a timeout per search (`TimedPattern`)
        except (regex.error, RecursionError, OverflowError) as exc:
            fail(f"{key}: {pattern!r} is not a regular expression ({exc})")
    return Rule(category=category.strip(), matchers=matchers, where=where)
