"""Small HTML builders that escape every piece of text they are given.

Everything a section produces goes through these helpers, so trace text (names of modules, ops, frames,
files, user metadata) can never become markup. Values already made safe are wrapped in `Safe`.
"""
from __future__ import annotations

import html
import json
import re
from typing import Callable, Iterable

import pandas as pd

from memlens.errors import visible_format_chars

MAX_VALUE_CHARS = 20_000  # longest metadata value shown in full


class Safe(str):
    """A string that is already valid, escaped HTML."""


def esc(value) -> Safe:
    """`value` as escaped text (a `Safe` value passes through unchanged)."""
    if isinstance(value, Safe):
        return value
    # bidi overrides (U+202E) and other invisible format characters from a trace would reorder or hide
    # the text around them: show them as \\u202e instead
    return Safe(html.escape(visible_format_chars("" if value is None else str(value)), quote=True))


def tag(name: str, *children, cls: str | None = None, **attrs) -> Safe:
    """``<name class=cls attrs>children</name>`` with attribute values and text children escaped."""
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None)
    if cls:
        attr = f' class="{esc(cls)}"' + attr
    return Safe(f"<{name}{attr}>{''.join(esc(c) for c in children)}</{name}>")


def paragraph(*parts) -> Safe:
    """A paragraph of text (each part escaped unless `Safe`)."""
    return tag("p", *parts)


def note(text, kind: str = "note") -> Safe:
    """A highlighted box: kind 'note' (information), 'unavailable' or 'error'."""
    return tag("div", text, cls=f"memlens-{kind}")


def bullet_list(items: Iterable) -> Safe:
    """An unordered list, one escaped item per entry."""
    return tag("ul", *[tag("li", item) for item in items])


def table(df: pd.DataFrame, formats: dict[str, Callable] | None = None, headers: dict[str, str] | None = None,
          cls: str = "memlens-table") -> Safe:
    """An HTML table of `df`; `formats` maps a column to a function turning a value into text. Columns
    without one whose name gives their unit read in it: ``*_ns`` (not a unix time) as a duration, ``bytes``
    / ``*_bytes`` / ``size`` in bytes (`memlens.units`' formatters), so no table prints raw ns or bytes."""
    formats = formats or {}
    headers = headers or {}
    head = tag("tr", *[tag("th", headers.get(c, c)) for c in df.columns])
    columns = []
    for c in df.columns:
        fmt = formats.get(c) or _unit_format(str(c))
        columns.append([esc(fmt(v)) for v in df[c].tolist()])
    rows = [Safe("<tr>" + "".join(f"<td>{col[i]}</td>" for col in columns) + "</tr>") for i in range(len(df))]
    return Safe(f'<table class="{esc(cls)}"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')


def _unit_format(column: str) -> Callable:
    """The formatter a column's name implies for its numbers (see `table`); `_default_format` otherwise."""
    import numbers

    if column.endswith("_ns") and "unix" not in column:
        unit = ns_text
    elif column in ("bytes", "size") or column.endswith("_bytes"):
        unit = bytes_text
    else:
        return _default_format
    return lambda v: unit(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else _default_format(v)


def key_values(pairs: Iterable[tuple[str, object]]) -> Safe:
    """A two-column table of (name, value) pairs; dict/list values are shown as JSON."""
    rows = []
    for key, value in pairs:
        if isinstance(value, (dict, list, tuple)):
            value = json.dumps(value, default=str, indent=1)
            if len(value) > MAX_VALUE_CHARS:  # e.g. thousands of annotations: keep the page light
                value = value[:MAX_VALUE_CHARS] + f"\n... ({len(value) - MAX_VALUE_CHARS:,} more characters)"
            rows.append(tag("tr", tag("th", key), tag("td", tag("pre", value))))
        else:
            rows.append(tag("tr", tag("th", key), tag("td", _unit_format(str(key))(value))))
    return Safe(f'<table class="memlens-kv"><tbody>{"".join(rows)}</tbody></table>')


_FORMAT_CHARS = "\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff"
_RAW_FORMAT_CHAR = re.compile(f"[{_FORMAT_CHARS}]")
# \\uXXXX of a format character, preceded by an even number of backslashes (so it is an escape, not text)
_ESCAPED_FORMAT_CHAR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(061[cC]|200[b-fB-F]|202[a-eA-E]|206[0-9]|[fF][eE][fF][fF])")


def script_json(obj_json: str) -> str:
    """JSON text made safe to sit inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` can occur in JSON only inside strings, where ``\\u003c`` etc. mean the same
    characters, so no ``</script>`` or ``<!--`` can end or confuse the element; U+2028/2029 are escaped for
    old JavaScript parsers.
    """
    text = (obj_json.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    # invisible format characters (bidi overrides, zero-width), raw or as \\uXXXX escapes, become the
    # visible text "\\uXXXX" in the decoded string (an escaped backslash), so no label can reorder itself
    text = _RAW_FORMAT_CHAR.sub(lambda m: f"\\\\u{ord(m.group(0)):04x}", text)
    return _ESCAPED_FORMAT_CHAR.sub(lambda m: m.group(1) + "\\\\u" + m.group(2), text)


def bytes_text(value) -> str:
    """Bytes in binary units ('1.5 MiB'); empty for a missing value."""
    from memlens.units import format_bytes
    return "" if value is None or pd.isna(value) else format_bytes(value)


def ns_text(value) -> str:
    """A duration from ns ('4.56 ms'); empty for a missing value."""
    from memlens.units import format_ns
    return "" if value is None or pd.isna(value) else format_ns(value)


def share_text(value) -> str:
    """A fraction as a percentage ('12.5%'); empty for a missing value."""
    from memlens.units import format_share
    return "" if value is None or pd.isna(value) else format_share(value)


def _default_format(value) -> str:
    if value is None or (not isinstance(value, (list, dict, tuple)) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
