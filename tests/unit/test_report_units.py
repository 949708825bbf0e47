"""Times and sizes in a report's tables come from `memlens.units`' formatters: the ATI-by-category table
reads in ms / s (never raw ns), and the what-if notes in bytes units."""
from __future__ import annotations

import re
from pathlib import Path

import memlens
from memlens.analysis.ati import ati_by
from memlens.reporting import build_report
from memlens.units import format_bytes, format_ns

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_train_adamw.memlens"


def test_ati_by_category_table_is_in_time_units():
    trace = memlens.load(SAMPLE)
    html = build_report(trace, sections=["ati"]).html()
    start = html.index("by category</h3>")
    table = html[start:html.index("</table>", start)]
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    expected = ati_by(trace, "category")
    assert len(rows) == len(expected)
    columns = list(expected.columns)
    for cells, row in zip(rows, expected.itertuples(index=False)):
        for name, cell, value in zip(columns, cells, row):
            if name.endswith("_ns"):
                assert cell == format_ns(value), (name, cell)
            elif name == "bytes":
                assert cell == format_bytes(value)
    assert not re.search(r"<td>\d{1,3}(,\d{3}){2,}</td>", table)


def test_whatif_notes_use_the_unit_formatters():
    from memlens.whatif import compare
    trace = memlens.load(SAMPLE)
    df = compare(trace, time_limit_s=0.2)
    plan = df.attrs["swap_plans"]["cpu"]
    swap_note = df[df["stage"] == "swapping"]["note"].iloc[0]
    # the floor (with why it is below 1 MiB on a small model), then the bytes copied and the stall, each formatted
    assert f"of blocks >= {format_bytes(plan.min_size)} " in swap_note
    assert swap_note.endswith(f", {format_bytes(plan.transfer_bytes)} copied, stall {format_ns(plan.stall_ns)}")
