"""Training curves as inline SVG, drawn from a run's JSONL logs (``metrics.jsonl``, ``eval.jsonl``):
no plotting library, no script — the page stays one file that opens anywhere."""

from __future__ import annotations

import math
from typing import Any

from dsv32.view.page import esc

COLOURS = ("#1849a9", "#e04f16", "#067647", "#7a5af8", "#c11574", "#475467")
W, H, LEFT, RIGHT, TOP, BOTTOM = 460, 240, 56, 12, 44, 36


def series(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """``(step, value)`` of every row holding a finite number under ``key``."""
    out = []
    for row in rows:
        x, y = row.get("step"), row.get(key)
        if _num(x) and _num(y) and math.isfinite(y):
            out.append((float(x), float(y)))
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _tick(v: float) -> str:
    return f"{v:.3g}"


def line_chart(title: str, lines: dict[str, list[tuple[float, float]]]) -> str:
    """An SVG chart of ``lines`` (name → points) sharing axes; empty string when no line has a point."""
    lines = {k: v for k, v in lines.items() if v}
    if not lines:
        return ""
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * ph

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}">',
        f'<text class="title" x="{LEFT}" y="16">{esc(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="#98a2b3"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="#98a2b3"/>',
    ]
    for i in range(5):  # y ticks and grid
        v = y0 + (y1 - y0) * i / 4
        y = py(v)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eaecf0"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(_tick(v))}</text>')
    for i in range(5):  # x ticks
        v = x0 + (x1 - x0) * i / 4
        parts.append(f'<text x="{px(v):.1f}" y="{TOP + ph + 14}" text-anchor="middle">{esc(_tick(v))}</text>')
    parts.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 4}" text-anchor="middle">step</text>')
    for n, (name, pts) in enumerate(lines.items()):
        colour = COLOURS[n % len(COLOURS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        if len(pts) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{coords}"/>')
        for x, y in pts if len(pts) <= 40 else ():
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>')
        lx = LEFT + 140 * n  # the legend, under the title
        parts.append(f'<rect x="{lx}" y="26" width="10" height="3" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 14}" y="31">{esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def charts(rows: list[dict], specs: list[tuple[str, list[str]]]) -> str:
    """One chart per ``(title, keys)`` of ``specs`` whose keys have points in ``rows``."""
    drawn = [line_chart(title, {k: series(rows, k) for k in keys}) for title, keys in specs]
    return "".join(d for d in drawn if d)
