"""The HTML page every view is: one self-contained file (inline CSS and JavaScript, figures as
``data:`` URIs, no request to anything) that opens from disk.

Whatever a run wrote — a model's reasoning, a tool's output, a task's prompt — is text, never markup:
every string goes through :func:`esc` (``html.escape``, quotes included), data for the script goes in
``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped (:func:`json_script`), and
the script builds no HTML from data (it only shows and hides rows). A Content-Security-Policy with a
fresh nonce is the second wall: only the page's own script runs, inline event handlers never do, and
nothing is loaded from anywhere.
"""

from __future__ import annotations

import html
import json
import secrets
from typing import Any

CSS = """
:root { --fg: #1d2330; --muted: #667085; --line: #d0d5dd; --bg: #ffffff; --panel: #f6f7f9;
  --ok: #067647; --ok-bg: #dcfae6; --bad: #b42318; --bad-bg: #fee4e2; --accent: #1849a9; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 64px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.sub { color: var(--muted); margin-bottom: 16px; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; padding: 8px 10px;
  background: var(--panel);
  border: 1px solid var(--line); border-radius: 6px;
  font: 12.5px/1.4 ui-monospace, Menlo, Consolas, monospace; }
table { border-collapse: collapse; width: 100%; margin: 8px 0; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--panel); font-weight: 600; position: sticky; top: 0; }
tr.sample { cursor: pointer; } tr.sample:hover { background: #eef4ff; }
tr.detail > td { background: #fbfbfc; padding: 12px 16px; }
.pass { color: var(--ok); background: var(--ok-bg); } .fail { color: var(--bad);
  background: var(--bad-bg); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0 16px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 140px;
  background: var(--panel); }
.card .k { color: var(--muted); font-size: 12px; } .card .v { font-size: 18px; font-weight: 600; }
.turn { border-left: 3px solid var(--line); margin: 10px 0; padding: 2px 0 2px 12px; }
.turn.system { border-color: #98a2b3; } .turn.user { border-color: #7a5af8; }
.turn.assistant { border-color: var(--accent); } .turn.tool { border-color: #f79009; }
.role { font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .04em;
  color: var(--muted); }
.meta { color: var(--muted); font-size: 12px; margin-left: 8px; }
.call { margin: 6px 0; } .call .name { font-weight: 600; font-family: ui-monospace, monospace; }
details > summary { cursor: pointer; color: var(--accent); margin: 4px 0; }
.controls { display: flex; gap: 8px; align-items: center; margin: 8px 0; flex-wrap: wrap; }
.controls button { border: 1px solid var(--line); background: var(--bg); padding: 4px 12px;
  border-radius: 6px;
  cursor: pointer; font: inherit; }
.controls button[aria-pressed="true"] { background: var(--accent); color: #fff;
  border-color: var(--accent); }
.controls input { padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px;
  min-width: 260px; font: inherit; }
.count { color: var(--muted); }
.hidden { display: none; }
.figure img { max-width: 100%; border: 1px solid var(--line); border-radius: 6px; }
svg.chart { background: var(--bg); border: 1px solid var(--line); border-radius: 6px;
  margin: 6px 12px 6px 0; }
svg.chart text { font: 11px system-ui, sans-serif; fill: var(--muted); }
svg.chart text.title { font-size: 13px; font-weight: 600; fill: var(--fg); }
.charts { display: flex; flex-wrap: wrap; }
.final { border: 1px solid var(--accent); border-radius: 6px; padding: 6px 10px; margin: 10px 0; }
"""

# Filters of every table with class "samples": the pass/fail toggle, the text filter, and a click on a
# row opening the detail row after it. Reads only data-* attributes and the page's JSON; builds no HTML.
JS = """
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('dsv32-data').textContent);
  window.dsv32 = data;
  for (const table of document.querySelectorAll('table.samples')) {
    const box = table.previousElementSibling;
    const rows = Array.from(table.querySelectorAll('tr.sample'));
    const input = box.querySelector('input');
    const count = box.querySelector('.count');
    let mode = 'all';
    function apply() {
      const words = (input.value || '').toLowerCase().split(/\\s+/).filter(Boolean);
      let shown = 0;
      for (const row of rows) {
        const passed = row.dataset.passed === '1';
        const text = row.dataset.text || '';
        const ok = (mode === 'all' || (mode === 'passed') === passed) && words.every((w) => text.includes(w));
        row.classList.toggle('hidden', !ok);
        const detail = row.nextElementSibling;
        if (detail && detail.classList.contains('detail') && !ok) detail.classList.add('hidden');
        if (ok) shown += 1;
      }
      count.textContent = shown + ' of ' + rows.length + ' shown';
    }
    for (const button of box.querySelectorAll('button[data-mode]')) {
      button.addEventListener('click', () => {
        mode = button.dataset.mode;
        for (const b of box.querySelectorAll('button[data-mode]')) {
          b.setAttribute('aria-pressed', String(b === button));
        }
        apply();
      });
    }
    input.addEventListener('input', apply);
    for (const row of rows) {
      row.addEventListener('click', () => {
        const detail = row.nextElementSibling;
        if (detail && detail.classList.contains('detail')) detail.classList.toggle('hidden');
      });
    }
    apply();
  }
})();
"""


def esc(value: Any) -> str:
    """``value`` as HTML text (``&``, ``<``, ``>``, both quotes escaped)."""
    return html.escape("" if value is None else str(value), quote=True)


def json_script(element_id: str, data: Any) -> str:
    """``data`` as a ``<script type="application/json">`` element that nothing in ``data`` can close or
    turn into markup: ``<``, ``>``, ``&`` and the JavaScript line separators are written as escapes."""
    text = json.dumps(data, ensure_ascii=False, default=str)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def page(title: str, subtitle: str, body: str, data: Any) -> str:
    """The whole document: ``body`` (HTML built with :func:`esc`), ``data`` for the script."""
    nonce = secrets.token_urlsafe(18)
    policy = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'nonce-{nonce}'; base-uri 'none'; form-action 'none'"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f'<h1>{esc(title)}</h1>\n<div class="sub">{esc(subtitle)}</div>\n{body}\n'
        f'{json_script("dsv32-data", data)}\n<script nonce="{nonce}">{JS}</script>\n</body>\n</html>\n'
    )


def cards(items: list[tuple[str, Any]]) -> str:
    """Headline numbers as cards (``label``, ``value``)."""
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
            for k, v in items
        )
        + "</div>"
    )


def badge(passed: bool | None, yes: str = "passed", no: str = "failed") -> str:
    if passed is None:
        return '<span class="badge">–</span>'
    return f'<span class="badge {"pass" if passed else "fail"}">{esc(yes if passed else no)}</span>'


def number(value: Any, digits: int = 3) -> str:
    """A number as the tables show it (``–`` for none)."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def filter_controls(label: str) -> str:
    """The controls of the ``table.samples`` that follows them."""
    buttons = "".join(
        f'<button type="button" data-mode="{mode}" aria-pressed="{"true" if mode == "all" else "false"}">'
        f"{text}</button>"
        for mode, text in (("all", "all"), ("failed", "failed only"), ("passed", "passed only"))
    )
    return (
        f'<div class="controls">{buttons}<input type="search" placeholder="{esc(label)}" '
        'aria-label="filter"><span class="count"></span></div>'
    )


def samples_table(
    headers: list[str],
    rows: list[tuple[list[str], bool | None, str, str]],
    search: str = "id, category, reason",
) -> str:
    """A filterable table: each row is ``(cells as HTML, passed, text the filter searches, detail
    HTML shown under the row when it is clicked)``; ``search``: what the text filter searches, in
    words."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for cells, passed, text, detail in rows:
        flag = "1" if passed else "0"
        body.append(
            f'<tr class="sample" data-passed="{flag}" data-text="{esc(text.lower())}" tabindex="0">'
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
        body.append(f'<tr class="detail hidden"><td colspan="{len(headers)}">{detail}</td></tr>')
    return (
        filter_controls(f"filter: {search}…")
        + f'<table class="samples"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )
