"""Assemble one self-contained HTML document: plotly.js inlined, figures as escaped JSON, no network.

Figures are stored as ``<script type="application/json">`` elements (made safe by `markup.script_json`)
and drawn by one small script after the page loads, so the page works offline from a file:// URL.
A machine-readable status of every section sits in ``<script id="memlens-report-status">``.
"""
from __future__ import annotations

import json

from memlens.reporting.markup import Safe, esc, script_json, tag

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:14px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cfd8dc;font-size:13px}
nav{padding:8px 28px;background:#eceff1;font-size:13px}nav a{margin-right:14px;color:#37474f}
nav a.memlens-nav-unavailable{color:#90a4ae}nav a.memlens-nav-error{color:#c62828;font-weight:bold}
main{padding:8px 28px 40px;max-width:1400px}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:16px 0;padding:8px 20px 16px}
section h2{font-size:18px;margin:10px 0}
.memlens-table,.memlens-kv{border-collapse:collapse;font-size:12.5px;margin:8px 0}
.memlens-table th,.memlens-table td,.memlens-kv th,.memlens-kv td{border:1px solid #e0e0e0;padding:3px 8px;
text-align:left;vertical-align:top}
.memlens-table th,.memlens-kv th{background:#f5f5f5}
.memlens-kv pre{margin:0;white-space:pre-wrap;max-height:240px;overflow:auto}
.memlens-note{background:#e3f2fd;border-left:4px solid #1e88e5;padding:6px 10px;margin:8px 0}
.memlens-unavailable{background:#fff8e1;border-left:4px solid #f9a825;padding:6px 10px;margin:8px 0}
.memlens-error{background:#ffebee;border-left:4px solid #c62828;padding:6px 10px;margin:8px 0;font-family:monospace}
.memlens-figure{width:100%;min-height:200px}
.memlens-advice-snippet{background:#f5f5f5;border:1px solid #e0e0e0;padding:6px 10px;overflow:auto;font-size:12px}
"""

BOOT = """
(function(){
  function draw(){
    var specs=document.querySelectorAll('script.memlens-figure-spec');
    for(var i=0;i<specs.length;i++){
      var spec=JSON.parse(specs[i].textContent);
      var div=document.getElementById(specs[i].getAttribute('data-target'));
      Plotly.newPlot(div,spec.data,spec.layout||{},{responsive:true,displaylogo:false});
    }
    document.body.setAttribute('data-figures-drawn',String(specs.length));
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',draw);}else{draw();}
})();
"""


def figure_block(fig, fig_id: str) -> Safe:
    """A placeholder div and the figure's JSON spec for `BOOT` to draw."""
    import plotly.io as pio

    spec = script_json(pio.to_json(fig, validate=False))
    return Safe(f'<div class="memlens-figure" id="{esc(fig_id)}"></div>'
                f'<script type="application/json" class="memlens-figure-spec" data-target="{esc(fig_id)}">'
                f'{spec}</script>')


def document(title: str, subtitle: str, sections, statuses: list[dict]) -> str:
    """The full HTML text. `sections` are (key, title, body `Safe`) triples."""
    from plotly.offline import get_plotlyjs

    marks = {"unavailable": " (n/a)", "error": " (failed)"}
    status_of = {s["key"]: s["status"] for s in statuses}
    nav = "".join(tag("a", t + marks.get(status_of.get(k, "ok"), ""), href=f"#{k}",
                      cls=f"memlens-nav-{status_of.get(k, 'ok')}") for k, t, _ in sections)
    body = "".join(f'<section id="{esc(k)}">{tag("h2", t)}{b}</section>' for k, t, b in sections)
    status_json = script_json(json.dumps({"sections": statuses}, default=str))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; "
            "font-src data:\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>"
            f"<header>{tag('h1', title)}{tag('p', subtitle)}</header><nav>{nav}</nav><main>{body}</main>"
            f'<script type="application/json" id="memlens-report-status">{status_json}</script>'
            f"<script>{BOOT}</script></body></html>\n")


def write_html(text: str, path):
    """Write an HTML document to `path` atomically (a temporary sibling renamed into place); returns the
    path. An unwritable destination is bad input (`InputError` naming it)."""
    import contextlib
    import os
    from pathlib import Path

    from memlens.errors import InputError
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise InputError(f"cannot write the report: {exc.strerror or exc}", out) from None
    finally:
        # when the directory itself could not be created there is no temporary file to remove
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return out
