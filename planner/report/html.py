"""The HTML page of a plan (``plan``, ``evaluate``, ``explain``, ``render --html``) and of what-if
rows (``compare``, ``sweep --html``): one self-contained file, its style and its few lines of script
inline, its drawings plain SVG (:mod:`planner.report.svg`), no external URL of any kind.

A plan's page is written from the Plan document alone, as the text report is (``render --html`` of
a saved ``plan --json`` writes the same page as the ``plan --html`` that saved it): the headline
figures, the step's timeline per pipeline stage with its critical path (:mod:`planner.report.timeline`),
memory per stage against the device, rank 0's groups on the fabric and the tier each one's
collective crosses, the time breakdown, the runners-up, the explanation and the rejections, the
last quoting the text report's own lines (:func:`planner.report.text.section_text`).
"""

from __future__ import annotations

import io
from html import escape
from pathlib import Path
from typing import Callable

from rich.console import Console

from clusterplan.models.errors import SpecError
from clusterplan.planner.report import svg
from clusterplan.planner.report.chart import timeline_png
from clusterplan.planner.report.text import layout_text, section_text
from clusterplan.planner.report.timeline import build_timeline

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1120px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
.fig{overflow-x:auto}.lbl{font-size:11px}.tick{font-size:10px;fill:#555}.note{color:#555;font-size:12px}
.legend span{display:inline-block;margin:0 12px 2px 0;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border:1px solid #0002}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right}#tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;
padding:3px 6px;border-radius:3px;display:none;max-width:480px}svg rect:hover{opacity:.75}
"""
SCRIPT = """
(function(){var tip=document.getElementById('tip');
document.addEventListener('mousemove',function(e){var t=e.target.closest&&e.target.closest('svg [data-tip],svg rect,svg g');
var title=t&&t.querySelector&&t.querySelector(':scope>title');
if(!title){tip.style.display='none';return;}
tip.textContent=title.textContent;tip.style.display='block';
tip.style.left=(e.clientX+14)+'px';tip.style.top=(e.clientY+10)+'px';});})();
"""
SECTIONS = ("summary", "timeline", "memory", "fabric", "time", "runners-up", "explanation", "rejections", "report")
"""The ``id`` of each section of a plan's page, in order (a section without content is left out)."""


def page(title: str, sections: list[tuple[str, str, str]]) -> str:
    """The whole page: ``(id, heading, body HTML)`` per section."""
    body = "".join(f'<section id="{sid}"><h2>{escape(heading)}</h2>{html}</section>' if heading
                   else f'<section id="{sid}">{html}</section>' for sid, heading, html in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}<div id=\"tip\"></div><script>{SCRIPT}</script></body></html>\n")


def pre(words: str) -> str:
    return f"<pre>{escape(words.rstrip())}</pre>" if words.strip() else ""


def figure(drawing: str) -> str:
    return f'<div class="fig">{drawing}</div>'


def plan_page(doc: dict) -> str:
    """The page of a Plan document (module docstring)."""
    model, cluster = doc["inputs"]["model"], doc["inputs"]["cluster"]
    tl = build_timeline(doc)
    title = f"clusterplan: {model['name']} on {doc['num_devices']:,} x {cluster['device_name']}"
    summary = f"<h1>{escape(title)}</h1>" + pre(section_text(doc, "header") + section_text(doc, "figures"))
    sections = [
        ("summary", "", summary),
        ("timeline", "One step, stage by stage",
         figure(svg.timeline_svg(tl)) + svg.timeline_legend(tl) + f'<p class="note">{escape(tl.note)}</p>'),
        ("memory", "Memory per pipeline stage", figure(svg.memory_svg(doc)) + svg.memory_legend()
         + pre(section_text(doc, "memory"))),
        ("fabric", "Layout on the fabric", _fabric(doc)),
        ("time", "Time per step", pre(section_text(doc, "time") + section_text(doc, "training"))),
    ]
    if doc.get("search"):
        sections += [("runners-up", "Runners-up", pre(section_text(doc, "runners_up"))),
                     ("explanation", "Why this layout", _explanation(doc)),
                     ("rejections", "Rejected layouts", pre(section_text(doc, "rejections") + section_text(doc, "search")))]
    return page(title, [s for s in sections if s[2]])


def saved_plan_page(doc: dict) -> str:
    """:func:`plan_page` of a saved document (``render --html``), or :class:`SpecError` naming what in
    it is missing or malformed (a document no plan writes), as the text report does."""
    try:
        return plan_page(doc)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, IndexError) as err:
        raise SpecError(f"PLAN.json: a field the page reads is missing or malformed ({type(err).__name__}: {err}); "
                        "write it with plan/evaluate --json and do not edit it (if the file is unedited, this is a "
                        "bug: please report it)") from None


def _fabric(doc: dict) -> str:
    """Rank 0's groups drawn on the domains, and a table of each group's span and fabric tier."""
    groups = doc.get("fabric_groups")
    placement = (doc.get("explanation") or {}).get("placement") or []
    lay = f"<p>{escape(layout_text(doc['layout']))}; rank order {escape(doc['layout']['order'])} (innermost first)</p>"
    if groups is None:
        return lay + '<p class="note">this document has no groups on the fabric (written before them): ' \
                     "plan --json again to draw them</p>"
    rows = "".join(
        f"<tr><td>{g['axis']}</td><td class=n>{g['degree']:,}</td><td class=n>{g['num_nodes']:,}</td>"
        f"<td class=n>{g['num_domains']:,}</td><td>{escape(g['tier'])}</td>"
        f"<td class=n>{g['bytes_per_s'] / 1e9:,.1f}</td></tr>" for g in groups)
    table = ("<table><tr><th>axis</th><th>degree</th><th>nodes</th><th>domains</th><th>tier its collective crosses"
             f"</th><th>GB/s per device</th></tr>{rows}</table>") if groups else "<p>every axis has degree 1</p>"
    torus = pre("on the torus: " + "; ".join(placement)) if placement else ""
    return lay + figure(svg.fabric_svg(doc)) + svg.fabric_legend(doc) + table + torus


def _explanation(doc: dict) -> str:
    """The text report's lines on why the winner won, and the one-step moves of ``explain``."""
    why = section_text(doc, "why")
    moves = (doc.get("explanation") or {}).get("sensitivity") or []
    rows = "".join(
        f"<tr><td>{escape(str(r.get('move', '')))}</td>"
        f"<td class=n>{'-' if r.get('step_time_s') is None else format(r['step_time_s'], '.3f')}</td>"
        f"<td class=n>{'-' if r.get('step_time_s') is None else format(r['delta'], '+.1%')}</td>"
        f"<td>{escape(str(r.get('reason', '')))}</td></tr>" for r in moves)
    table = ("<table><tr><th>one step in a knob</th><th>step time s</th><th>change</th><th>note</th></tr>"
             f"{rows}</table>") if rows else ""
    return pre(why) + table


def whatif_page(rows: list[dict], label: str, title: str, table_text: str) -> str:
    """The page of ``compare`` or ``sweep`` rows: the table as the text report prints it, a chart per
    figure (step time, MFU, time and cost to train, each with its 80% interval) and the timeline of
    the first row that ran (the best, as ranked)."""
    sections = [("summary", "", f"<h1>{escape(title)}</h1>" + pre(table_text))]
    for key, interval, heading, unit, fmt in svg.ROW_METRICS:
        sections.append((f"chart-{key}", heading, figure(svg.rows_chart(rows, label, key, interval, heading, unit, fmt))))
    best = next((r for r in rows if "error" not in r), None)
    if best is not None and best.get("schedule"):
        tl = build_timeline(best)
        sections.append(("timeline", f"One step of {best[label]}'s best layout",
                         figure(svg.timeline_svg(tl)) + svg.timeline_legend(tl) + f'<p class="note">{escape(tl.note)}</p>'))
    return page(title, sections)


def console_text(draw, width: int = 120) -> str:
    """What ``draw(console)`` prints, as plain text (a report quoted on the page)."""
    out = io.StringIO()
    draw(Console(file=out, width=width, color_system=None, highlight=False, markup=False, emoji=False, soft_wrap=True))
    return out.getvalue()


def write_page(path: str, text: str, option: str = "--html") -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{option}: cannot write {path}: {err.strerror or err}") from None



def plan_title(doc: dict) -> str:
    model, cluster = doc["inputs"]["model"], doc["inputs"]["cluster"]
    return f"{model['name']} on {doc['num_devices']:,} x {cluster['device_name']}: one step of {layout_text(doc['layout'])}"


def write_views(html_path: str | None, timeline_path: str | None, page_text: Callable[[], str],
                source: dict | None, title: str | None = None) -> list[str]:
    """``--html`` and ``--timeline``: the page, and the timeline of ``source`` (a Plan document, or
    the best what-if row; none where no row ran) as a PNG. Returns the files written."""
    written = []
    if html_path:
        write_page(html_path, page_text())
        written.append(html_path)
    if timeline_path and source is not None:
        timeline_png(build_timeline(source), timeline_path, title or plan_title(source))
        written.append(timeline_path)
    return written
