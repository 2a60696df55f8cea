"""The SVG drawings of the HTML page (:mod:`planner.report.html`): the step's timeline, memory per
pipeline stage, rank 0's groups on the fabric, and the what-if rows' charts. Plain SVG strings with
a ``<title>`` on every block (the browser's hover title: the term and its seconds), no external
resource. Each drawing reads a Plan document (or what-if rows) and places its figures; nothing is
computed but positions.
"""

from __future__ import annotations

import math
from html import escape

from clusterplan.planner.report.text import MEMORY_LABELS
from clusterplan.planner.report.timeline import TERMS, Block, Timeline

GIB = 2**30
LABEL_W, PLOT_W, ROW_H, GAP = 120.0, 940.0, 18.0, 8.0
AXIS_COLORS = {"tp": "#e15759", "cp": "#59a14f", "ep": "#edc948", "dp": "#4e79a7", "pp": "#b07aa1"}
AXIS_NAMES = {"tp": "tensor parallel", "cp": "context parallel", "ep": "expert parallel", "dp": "data parallel",
              "pp": "pipeline (a stage and its neighbour)"}
MEMORY_COLORS = {"weights": "#4e79a7", "gradients": "#f28e2b", "optimizer": "#e15759", "activations": "#76b7b2",
                 "working": "#59a14f", "reserved": "#9c755f", "allocator": "#d4d4d4", "step_copies": "#ff9d9a"}
MAX_DOMAIN_BOXES = 512
MAX_ZOOM_DEVICES = 1024


def svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg role="img" aria-label="{escape(label)}" '
            f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">' + "".join(body) + "</svg>")


def rect(x: float, y: float, w: float, h: float, fill: str, title: str, attrs: str = "") -> str:
    return (f'<rect x="{x:.1f}" y="{y:.0f}" width="{max(w, 0.0):.2f}" height="{h:.0f}" fill="{fill}"{attrs}>'
            f"<title>{escape(title)}</title></rect>")


def text(x: float, y: float, words: str, attrs: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}"{attrs}>{escape(words)}</text>'


def legend(items: list[tuple[str, str]]) -> str:
    """An HTML legend: a swatch and a name each."""
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{color}"></i>{escape(name)}</span>' for name, color in items) + "</p>"


# ---- the step's timeline -------------------------------------------------------------------------------
def timeline_svg(tl: Timeline) -> str:
    """The critical path on top (its blocks carry ``class="cp"`` and ``data-s``, their seconds: they
    sum to the step time), then each stage drawn, with what its overlaps hide in a thin lane below."""
    scale = PLOT_W / max(tl.step_time_s, 1e-30)
    body, y = [], 14.0
    body += _axis(tl.step_time_s, scale, y)
    y += 10
    body += _row(tl.path.label, tl.path.blocks, y, scale, True)
    y += ROW_H + GAP * 2
    for row in tl.rows:
        body += _row(row.label, row.blocks, y, scale, False)
        for b in row.hidden:
            body.append(rect(LABEL_W + b.start_s * scale, y + ROW_H + 1, b.duration_s * scale, 4, TERMS["hidden"][1],
                             f"{TERMS['hidden'][0]}: {b.duration_s:.4g} s: {b.what}", ' class="hid"'))
        y += ROW_H + GAP + 4
    return svg(LABEL_W + PLOT_W + 20, y + 4, body, "timeline of one step")


def _row(label: str, blocks: list[Block], y: float, scale: float, path: bool) -> list[str]:
    """A row of blocks; the critical path's carry their term and exact seconds (``data-t``, ``data-s``)."""
    out = [text(4, y + ROW_H - 5, label, ' class="lbl"')]
    for b in blocks:
        name, color = TERMS.get(b.term, (b.term, "#999999"))
        attrs = f' class="cp" data-t="{b.term}" data-s="{b.duration_s!r}"' if path else ""
        out.append(rect(LABEL_W + b.start_s * scale, y, b.duration_s * scale, ROW_H, color,
                        f"{name}: {b.duration_s:.4g} s: {b.what}", attrs))
    return out


def _axis(total_s: float, scale: float, y: float) -> list[str]:
    """Ticks at a round step, about eight across."""
    raw = max(total_s, 1e-30) / 8
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(k * magnitude for k in (1, 2, 5, 10) if k * magnitude >= raw)
    out, t = [], 0.0
    while t <= total_s * 1.0001:
        x = LABEL_W + t * scale
        out += [f'<line x1="{x:.1f}" y1="{y:.0f}" x2="{x:.1f}" y2="{y + 6:.0f}" stroke="#888"/>',
                text(x + 2, y - 2, f"{t:.4g} s", ' class="tick"')]
        t += step
    return out


def timeline_legend(tl: Timeline) -> str:
    used = {b.term for b in tl.path.blocks} | {b.term for r in tl.rows for b in r.blocks}
    used |= {"hidden"} if any(r.hidden for r in tl.rows) else set()
    return legend([(TERMS[k][0], TERMS[k][1]) for k in TERMS if k in used])


# ---- memory per stage ------------------------------------------------------------------------------------
def memory_svg(doc: dict) -> str:
    """Stacked bars, one per pipeline rank whose peak bounds the others (first, second, last), against
    the device's capacity and the headroom the search kept; the most loaded stage alone for a document
    without them."""
    stages = doc.get("stage_memory") or {"most loaded": {**doc["memory"], "rank": None}}
    capacity = doc["device_memory_bytes"]
    headroom = (doc.get("search") or {}).get("memory_headroom") or 0.0
    top = max([capacity] + [sum(v for k, v in s.items() if k != "rank") for s in stages.values()]) * 1.05
    scale, body, y = PLOT_W / top, [], 8.0
    for name, stage in stages.items():
        rank = "" if stage.get("rank") is None else f" (rank {stage['rank']})"
        name = "the one stage" if len(stages) == 1 and stage.get("rank") == 0 else name
        body.append(text(4, y + ROW_H - 5, f"{name}{rank}", ' class="lbl"'))
        x = LABEL_W
        for key, value in stage.items():
            if key == "rank" or not value:
                continue
            body.append(rect(x, y, value * scale, ROW_H, MEMORY_COLORS.get(key, "#999"),
                             f"{key}: {value / GIB:,.2f} GiB on the {name} stage{rank}", f' data-b="{value!r}"'))
            x += value * scale
        y += ROW_H + GAP
    body += _memory_line(capacity * scale, y, f"device {capacity / GIB:,.1f} GiB", "#c00")
    if headroom:
        body += _memory_line(capacity * (1 - headroom) * scale, y,
                             f"headroom {headroom:.1%} kept free", "#888", dy=14)
    return svg(LABEL_W + PLOT_W + 20, y + 34, body, "memory per pipeline stage")


def _memory_line(x: float, y: float, label: str, color: str, dy: float = 0.0) -> list[str]:
    return [f'<line x1="{LABEL_W + x:.1f}" y1="0" x2="{LABEL_W + x:.1f}" y2="{y:.0f}" stroke="{color}" '
            'stroke-dasharray="4 3"/>', text(LABEL_W + x - 4, y + 12 + dy, label, f' class="tick" text-anchor="end" fill="{color}"')]


def memory_legend() -> str:
    return legend([(MEMORY_LABELS[k], c) for k, c in MEMORY_COLORS.items()])


# ---- rank 0's groups on the fabric ------------------------------------------------------------------------
def fabric_svg(doc: dict) -> str:
    """The scale-up domains (nodes, NVL72 racks, torus slices) as boxes, each marked with the axes
    whose rank-0 group has a member there; then rank 0's domain device by device, each device marked
    with the rank-0 groups it belongs to (rank 0 outlined)."""
    cluster, groups = doc["inputs"]["cluster"], doc.get("fabric_groups") or []
    n, size = doc["num_devices"], max(1, cluster.get("domain_size") or 1)
    num_domains = -(-n // size)
    per_box = -(-num_domains // MAX_DOMAIN_BOXES)
    boxes = -(-num_domains // per_box)
    cols = min(boxes, 32)
    members = {g["axis"]: {d // size // per_box for d in g["devices"]} for g in groups}
    body, w, h = [], 28.0, 20.0
    for b in range(boxes):
        x, y = 4 + (b % cols) * (w + 3), 4 + (b // cols) * (h + 3)
        first, last = b * per_box, min(num_domains, (b + 1) * per_box) - 1
        here = [a for a in members if b in members[a]]
        what = f"domain {first}" if first == last else f"domains {first}-{last}"
        body.append(rect(x, y, w, h, "#f4f4f4", f"{what} ({size} devices each): rank-0 groups here: "
                         + (", ".join(here) or "none"), ' stroke="#bbb"'))
        body += [rect(x + 2 + i * 5, y + 3, 4, h - 6, AXIS_COLORS[a], f"{a} group of rank 0 has members in {what}")
                 for i, a in enumerate(here)]
    height = 8 + -(-boxes // cols) * (h + 3)
    zoom, (zoom_w, zoom_h) = _zoom(cluster, groups, size, height + 16)
    caption = (f"{num_domains:,} scale-up domains of {size} devices" +
               (f", {per_box} to a box" if per_box > 1 else ""))
    body.append(text(4, height + 10, caption + "; below, domain 0 device by device (rank 0 outlined)", ' class="tick"'))
    return svg(max(cols * (w + 3) + 8, zoom_w + 8, 480), zoom_h + 8, body + zoom, "rank 0's groups on the fabric")


def _zoom(cluster: dict, groups: list[dict], size: int, top: float) -> tuple[list[str], tuple[float, float]]:
    """Domain 0's devices: a torus slice as x panels of y rows and z columns, else nodes as rows."""
    count = min(size, MAX_ZOOM_DEVICES)
    shape = cluster.get("torus_shape")
    per_node = max(1, cluster.get("devices_per_node") or 1)
    cell, body, right, bottom = 18.0, [], 0.0, top
    sets = [(g["axis"], set(g["devices"])) for g in groups]
    of = {d: [axis for axis, devices in sets if d in devices] for d in range(count)}
    for d in range(count):
        if shape and len(shape) == 3:
            x_, y_, z_ = d // (shape[1] * shape[2]), d // shape[2] % shape[1], d % shape[2]
            px, py = 4 + x_ * (shape[2] * cell + 10) + z_ * cell, top + y_ * cell
            where = f"torus ({x_}, {y_}, {z_})"
        elif shape and len(shape) == 2:
            px, py, where = 4 + d % shape[1] * cell, top + d // shape[1] * cell, f"torus ({d // shape[1]}, {d % shape[1]})"
        else:
            row, col = divmod(d, min(per_node * max(1, 32 // per_node), 32))
            px, py, where = 4 + col * cell + (col // per_node) * 4, top + row * cell, f"node {d // per_node}"
        axes = of[d]
        body.append(rect(px, py, cell - 2, cell - 2, "#fafafa", f"device {d}, {where}: rank-0 groups: "
                         + (", ".join(axes) or "none"), ' stroke="#000" stroke-width="1.5"' if d == 0 else ' stroke="#ccc"'))
        body += [rect(px + 2 + i * 3, py + 3, 2.6, cell - 8, AXIS_COLORS[a], f"device {d}: in rank 0's {a} group")
                 for i, a in enumerate(axes)]
        right, bottom = max(right, px + cell), max(bottom, py + cell)
    return body, (right, bottom)


def fabric_legend(doc: dict) -> str:
    axes = [g["axis"] for g in doc.get("fabric_groups") or []]
    return legend([(f"{a}: {AXIS_NAMES[a]}", AXIS_COLORS[a]) for a in AXIS_COLORS if a in axes])


# ---- what-if rows ----------------------------------------------------------------------------------------
ROW_METRICS = (  # (row key, interval key, title, unit divisor, format)
    ("step_time_s", "step_time_interval_s", "step time (s)", 1.0, "{:.3f}"),
    ("mfu", "mfu_interval", "MFU (%)", 0.01, "{:.1f}"),
    ("time_to_train_s", "time_to_train_interval_s", "time to train (days)", 86400.0, "{:,.1f}"),
    ("cost_usd", "cost_interval_usd", "cost to train (USD)", 1.0, "{:,.0f}"),
)


def rows_chart(rows: list[dict], label: str, key: str, interval: str, title: str, unit: float, fmt: str) -> str:
    """One bar per row with its 80% interval as a whisker; a row without the figure (no layout, no
    token count, no price) says so in place of its bar."""
    values = [(r, None if "error" in r or r.get(key) is None else r[key] / unit) for r in rows]
    spans = [[v / unit for v in r[interval]] for r, _ in values if "error" not in r and r.get(interval)]
    top = max([v for _, v in values if v is not None] + [hi for _, hi in spans] + [1e-30]) * 1.08
    scale, body, y = (PLOT_W - 160) / top, [], 6.0
    for r, v in values:
        body.append(text(4, y + ROW_H - 5, str(r[label])[:28], ' class="lbl"'))
        if v is None:
            why = r.get("error") or "no figure (no token count or price)"
            body.append(text(LABEL_W + 80, y + ROW_H - 5, why[:110], ' class="tick"'))
        else:
            body.append(rect(LABEL_W + 80, y + 2, v * scale, ROW_H - 4, "#4e79a7", f"{title}: {fmt.format(v)}",
                             f' data-v="{v!r}"'))
            body.append(_whisker(r.get(interval), unit, scale, y, fmt, title))
            right = max([v] + [hi / unit for hi in (r.get(interval) or [])[1:]])
            body.append(text(LABEL_W + 86 + right * scale, y + ROW_H - 5, fmt.format(v), ' class="tick"'))
        y += ROW_H + 4
    return svg(LABEL_W + PLOT_W + 20, y + 6, body, title)


def _whisker(pair: list | None, unit: float, scale: float, y: float, fmt: str, title: str) -> str:
    if not pair:
        return ""
    low, high = pair[0] / unit, pair[1] / unit
    x1, x2, mid = LABEL_W + 80 + low * scale, LABEL_W + 80 + high * scale, y + ROW_H / 2
    return (f'<g stroke="#222"><title>{escape(f"80% interval of the {title}: {fmt.format(low)} to {fmt.format(high)}")}'
            f'</title><line x1="{x1:.1f}" y1="{mid:.1f}" x2="{x2:.1f}" y2="{mid:.1f}"/>'
            f'<line x1="{x1:.1f}" y1="{mid - 4:.1f}" x2="{x1:.1f}" y2="{mid + 4:.1f}"/>'
            f'<line x1="{x2:.1f}" y1="{mid - 4:.1f}" x2="{x2:.1f}" y2="{mid + 4:.1f}"/></g>')
