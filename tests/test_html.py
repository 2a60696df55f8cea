"""The HTML page and the timeline (issue 40): one self-contained page per plan or what-if study,
written from the Plan document alone, whose timeline's critical path sums to the step time.

The page of three plans (a dense plan on 16,384 H100s, an MoE plan on a GB200 NVL72 rack, a TPU
plan) is checked for external references, parsed with ``html.parser``, measured, and compared with
``render --html`` of the same plan's saved document; where a headless Chromium is installed (CI
installs Debian's ``chromium-headless-shell``: ``.ci/run``), each page is opened in it and must
log no console error, its hover script included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from itertools import product

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.layout import microbatch_group_size
from clusterplan.planner.report.html import SECTIONS
from clusterplan.planner.report.timeline import TERMS, build_timeline

PLANS = {
    "dense_16k": ["--model", "gpt3-175b", "--cluster", "dgx-h100-superpod", "--devices", "16384"],
    "moe_nvl72": ["--model", "mixtral-8x7b", "--cluster", "gb200-nvl72", "--devices", "72"],
    "tpu": ["--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "64"],
}
MAX_PAGE_BYTES = 2 * 2**20
try:  # the optional extra `chart`: --timeline needs it (CI runs without)
    import matplotlib  # noqa: F401
    CHART = True
except ImportError:
    CHART = False
needs_chart = pytest.mark.skipif(not CHART, reason="matplotlib is not installed (pip install 'clusterplan[chart]')")
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr"}  # HTML void elements; SVG closes its own


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, dict]:
    """Each plan's document, page, saved JSON and timeline PNG, from one ``plan --json --html --timeline``."""
    folder, out = tmp_path_factory.mktemp("pages"), {}
    for name, args in PLANS.items():
        page, png, saved = folder / f"{name}.html", folder / f"{name}.png", folder / f"{name}.json"
        result = run("plan", *args, "--no-timings", "--json", "--html", str(page), *(["--timeline", str(png)] * CHART))
        assert result.exit_code == 0, result.stderr
        assert f"wrote {page}" in result.stderr and (f"wrote {png}" in result.stderr or not CHART)
        saved.write_text(result.stdout)
        out[name] = {"doc": json.loads(result.stdout), "page": page.read_text(encoding="utf-8"), "png": png,
                     "saved": saved, "folder": folder}
    return out


class _Page(HTMLParser):
    """The page's structure: section ids, open tags balanced, the critical path's blocks and every
    SVG block's hover title."""

    def __init__(self):
        super().__init__()
        self.stack, self.sections, self.path_s, self.titles, self.refs = [], [], [], [], []
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.refs += [v for k, v in attrs if k in ("src", "href", "xlink:href", "action")]
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "rect" and a.get("class") == "cp":
            self.path_s.append((a["data-t"], float(a["data-s"])))
        self.in_title = tag == "title" and self.stack and self.stack[-1] == "rect"
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()

    def handle_data(self, data):
        if self.in_title:
            self.titles.append(data)
            self.in_title = False


def parsed(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    p.close()
    assert not p.stack, f"unclosed: {p.stack}"
    return p


@pytest.mark.parametrize("name", PLANS)
def test_the_page_refers_to_nothing_outside_itself(plans, name):
    page = plans[name]["page"]
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert not re.search(r"""\b(?:src|href|xlink:href)\s*=""", page, re.I), "an external reference"
    assert not re.search(r"@import|url\(|@font-face", page), "a style that loads something"
    assert not parsed(page).refs


@pytest.mark.parametrize("name", PLANS)
def test_the_page_parses_with_its_sections_and_a_hover_title_per_block(plans, name):
    page = parsed(plans[name]["page"])
    assert page.sections == [s for s in SECTIONS if s in page.sections]  # in order
    assert {"summary", "timeline", "memory", "fabric", "time", "runners-up", "explanation", "rejections"} <= set(page.sections)
    labels = {label for label, _ in TERMS.values()}
    timed = [t for t in page.titles if re.match(r"[^:]+: [0-9.e+-]+ s: ", t)]
    assert timed and all(t.split(": ")[0] in labels for t in timed), timed[:3]
    doc = plans[name]["doc"]
    assert doc["runners_up"] and all(f"{r['step_time_s']:.3f}" in plans[name]["page"] for r in doc["runners_up"])


@pytest.mark.parametrize("name", PLANS)
def test_the_critical_path_sums_to_the_step_time(plans, name):
    """On the page's numbers (each critical block's ``data-s``) within 0.5%, and exactly in the
    timeline the page is drawn from."""
    doc, page = plans[name]["doc"], parsed(plans[name]["page"])
    total = sum(seconds for _, seconds in page.path_s)
    assert total == pytest.approx(doc["step_time_s"], rel=0.005)
    assert {"forward", "backward", "optimizer"} <= {term for term, _ in page.path_s}
    timeline = build_timeline(doc)
    assert sum(b.duration_s for b in timeline.path.blocks) == pytest.approx(doc["step_time_s"], rel=1e-9)
    assert len(timeline.rows) == min(doc["layout"]["pp"], 8)
    for row in timeline.rows:  # every stage ends with the step
        assert max(b.start_s + b.duration_s for b in row.blocks) == pytest.approx(doc["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("name", PLANS)
def test_the_schedule_composes_the_breakdown(plans, name):
    """The document's schedule is the step as ``cost.step`` composes it: m micro-batches of the
    stage's terms, the bubble (pp - 1) / vp of them, then the exposed DP traffic and the optimizer."""
    doc = plans[name]["doc"]
    s, b = doc["schedule"], doc["breakdown"]
    m, pp, vp = s["num_microbatches"], s["pp"], s["vp"]
    assert m == doc["layout"]["num_microbatches"] and (pp, vp) == (doc["layout"]["pp"], doc["layout"]["vp"])
    stage = sum(s[k] for k in ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s"))
    assert m * (s["forward_s"] + s["backward_s"] + s["head_s"]) == pytest.approx(b["compute"], rel=1e-9)
    assert (pp - 1) / vp * stage == pytest.approx(b["pp_bubble"], rel=1e-9, abs=1e-15)
    for key in ("recompute", "tp_comm", "cp_comm", "ep_comm"):
        assert m * s[f"{key}_s"] == pytest.approx(b[key], rel=1e-9, abs=1e-15)
    assert m * s["p2p_s"] == pytest.approx(b["pp_p2p"], rel=1e-9, abs=1e-15)
    assert all(v >= 0 for v in s["hidden"].values())


def test_the_page_of_16384_devices_stays_under_2_mb(plans):
    assert len(plans["dense_16k"]["page"].encode()) < MAX_PAGE_BYTES


def test_the_moe_and_tpu_pages_draw_their_fabric(plans):
    moe, tpu = plans["moe_nvl72"]["doc"], plans["tpu"]["doc"]
    assert moe["layout"]["ep"] > 1 and "ep" in {g["axis"] for g in moe["fabric_groups"]}
    assert all(g["tier"] == "nvlink" for g in moe["fabric_groups"] if g["num_domains"] == 1)
    assert tpu["inputs"]["cluster"]["torus_shape"] and {g["tier"] for g in tpu["fabric_groups"]} <= {"ici", "dcn"}
    assert "torus (" in plans["tpu"]["page"]
    dense = plans["dense_16k"]["doc"]
    tp = next(g for g in dense["fabric_groups"] if g["axis"] == "tp")
    assert tp["tier"] == "nvlink" and tp["num_nodes"] == 1  # tp inside a DGX node
    assert any(g["num_domains"] > 1 and g["tier"] in ("leaf", "spine", "core") for g in dense["fabric_groups"])


@pytest.mark.parametrize("name", PLANS)
def test_render_writes_the_same_page_as_plan(plans, name, tmp_path):
    page = tmp_path / "rendered.html"
    result = run("render", str(plans[name]["saved"]), "--html", str(page))
    assert result.exit_code == 0, result.stderr
    assert page.read_text(encoding="utf-8") == plans[name]["page"]


def test_render_of_a_document_from_before_the_schedule_still_writes_a_page(plans, tmp_path):
    """A document without schedule, stage_memory and fabric_groups: the timeline is the breakdown
    as one row (it still sums to the step), memory the most loaded stage, and the page says so."""
    doc = dict(plans["moe_nvl72"]["doc"])
    for key in ("schedule", "stage_memory", "fabric_groups"):
        doc.pop(key)
    old, page, png = tmp_path / "old.json", tmp_path / "old.html", tmp_path / "old.png"
    old.write_text(json.dumps(doc))
    result = run("render", str(old), "--html", str(page), *(["--timeline", str(png)] * CHART))
    assert result.exit_code == 0, result.stderr
    html = parsed(page.read_text(encoding="utf-8"))
    assert sum(s for _, s in html.path_s) == pytest.approx(doc["step_time_s"], rel=1e-6)
    assert "no per-micro-batch schedule" in page.read_text() and (not CHART or png.read_bytes()[:4] == b"\x89PNG")


@pytest.mark.parametrize("key, value", [("stage_memory", "x"), ("fabric_groups", [{"axis": "zz"}]),
                                        ("schedule", {"pp": 2, "vp": 1, "num_microbatches": 10**9})])
def test_render_of_an_edited_document_exits_2_or_draws_what_it_can(plans, tmp_path, key, value):
    doc = {**plans["tpu"]["doc"], key: value}
    edited, page = tmp_path / "edited.json", tmp_path / "edited.html"
    edited.write_text(json.dumps(doc))
    result = run("render", str(edited), "--html", str(page))
    if key == "schedule":  # too many chunks to place: the breakdown is drawn, and the page says why
        assert result.exit_code == 0 and "cannot be drawn" in page.read_text()
    else:
        assert result.exit_code == 2 and "PLAN.json: a field the page reads is missing or malformed" in result.stderr


@needs_chart
def test_the_timeline_png(plans):
    assert plans["tpu"]["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_timeline_exits_2_before_searching(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    result = run("plan", "--model", "nonexistent-model", "--cluster", "dgx-superpod", "--timeline", str(tmp_path / "t.png"))
    assert result.exit_code == 2 and "--timeline: install matplotlib" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--timeline", "step.svg"], "--timeline: 'step.svg' is not a .png file"),
    (["--html", "/no/such/folder/p.html"], "--html: folder '/no/such/folder' does not exist"),
    (["--html", "same.png", "--timeline", "same.png"], "--html and --timeline both name 'same.png'"),
    (["--csv", "rows.x", "--html", "rows.x"], "--csv and --html both name 'rows.x'"),
    (["--html", "rows.x", "--chart", "rows.x"], "--html and --chart both name 'rows.x'"),
])
def test_bad_output_files_exit_2_before_searching(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("sweep", "--model", "no-such-model", "--cluster", "dgx-superpod", "--over", "devices=8,16", *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_explain_and_evaluate_write_pages(tmp_path):
    page = tmp_path / "e.html"
    result = run("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                 "--layout", "tp=2,pp=2,dp=4,vp=2", "--html", str(page))
    assert result.exit_code == 0 and "wrote" in result.stderr, result.stderr
    html = parsed(page.read_text(encoding="utf-8"))
    assert "runners-up" not in html.sections and "timeline" in html.sections
    result = run("explain", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                 "--html", str(page))
    assert result.exit_code == 0 and "explanation" in parsed(page.read_text(encoding="utf-8")).sections


@pytest.fixture(scope="module")
def whatif_pages(tmp_path_factory) -> dict[str, str]:
    folder, out = tmp_path_factory.mktemp("whatif"), {}
    commands = {
        "compare": ["compare", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod:16", "--cluster", "tpu-v5p-pod:16",
                    "--cluster", "groq-rack:8", "--tokens", "1T", "--price-per-device-hour", "2"],
        "sweep": ["sweep", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--over", "devices=16,32",
                  "--tokens", "1T", "--jobs", "1"],
    }
    for name, args in commands.items():
        page, png = folder / f"{name}.html", folder / f"{name}.png"
        result = run(*args, "--html", str(page), *(["--timeline", str(png)] * CHART))
        assert result.exit_code == 0, result.stderr
        assert not CHART or png.read_bytes()[:4] == b"\x89PNG"
        out[name] = page.read_text(encoding="utf-8")
    return out


@pytest.mark.parametrize("name", ["compare", "sweep"])
def test_whatif_pages_chart_each_row_with_its_interval(whatif_pages, name):
    page = whatif_pages[name]
    assert "http://" not in page and "https://" not in page
    html = parsed(page)
    assert {"chart-step_time_s", "chart-mfu", "chart-time_to_train_s", "chart-cost_usd", "timeline"} <= set(html.sections)
    assert page.count("80% interval of the step time (s)") >= 2 and page.count("80% interval of the cost to train") >= 2
    assert sum(s for _, s in html.path_s) > 0
    if name == "compare":
        assert "does not fit" in page  # the row without a layout says why in place of its bar


def test_the_timeline_reproduces_the_pipeline_term_for_every_schedule():
    """Every (pp, vp, m) the schedules take, uniform stages, a head on the last: the critical path
    lasts ``(m + (pp - 1) / vp) t + m (t_head + t_p2p)`` plus the DP traffic and the optimizer, as
    ``cost.step`` prices it (interleaved with Megatron's micro-batch groups where pp does not divide m)."""
    for pp, vp, m in product((1, 2, 3, 4, 8), (1, 2, 4), (1, 2, 3, 5, 8, 12, 17, 24)):
        group = microbatch_group_size(m, pp, vp, True)
        if (vp > 1 and pp == 1) or group is None:
            continue
        s = {"pp": pp, "vp": vp, "num_microbatches": m, "microbatch_group": group, "forward_s": 1.0, "backward_s": 2.0,
             "recompute_s": 0.5, "tp_comm_s": 0.2, "cp_comm_s": 0.1, "ep_comm_s": 0.3, "head_s": 0.4, "p2p_s": 0.05,
             "dp_comm_s": 0.7, "optimizer_s": 0.01, "hidden": {"tp_comm_s": 0.1, "ep_comm_s": 0.0, "dp_comm_s": 0.3}}
        t = 1.0 + 2.0 + 0.5 + 0.2 + 0.1 + 0.3
        step = (m + (pp - 1) / vp) * t + m * (0.4 + 0.05) + 0.7 + 0.01
        timeline = build_timeline({"schedule": s, "step_time_s": step, "breakdown": {}})
        assert sum(b.duration_s for b in timeline.path.blocks) == pytest.approx(step, rel=1e-12), (pp, vp, m)
        assert "cannot be drawn" not in timeline.note


def test_a_schedule_no_plan_writes_is_drawn_from_the_breakdown():
    doc = {"schedule": {"pp": "x"}, "step_time_s": 2.0, "breakdown": {"compute": 1.5, "dp_comm": 0.5}}
    timeline = build_timeline(doc)
    assert "cannot be drawn" in timeline.note and sum(b.duration_s for b in timeline.path.blocks) == 2.0


# ---- in a browser ----------------------------------------------------------------------------------------
def _browser() -> str | None:
    return next((shutil.which(b) for b in ("chromium-headless-shell", "chromium", "chromium-browser") if shutil.which(b)),
                None)


HOVER = ("<script>var r=document.querySelector('#timeline svg rect.cp');var b=r.getBoundingClientRect();"
         "r.dispatchEvent(new MouseEvent('mousemove',{bubbles:true,clientX:b.x+1,clientY:b.y+1}));"
         "console.log('hover title: '+document.getElementById('tip').textContent);</script></body>")


@pytest.mark.parametrize("name", PLANS)
def test_the_page_loads_in_headless_chromium_without_console_errors(plans, name):
    """Opened with ``--dump-dom`` (the whole document comes back) and ``--screenshot``, with a
    mouse move over the critical path: the browser logs the hover title and nothing else. CI
    installs the browser and sets CLUSTERPLAN_REQUIRE_BROWSER=1, so there it cannot be skipped."""
    browser = _browser()
    if browser is None:
        if os.environ.get("CLUSTERPLAN_REQUIRE_BROWSER") == "1":
            pytest.fail("no headless Chromium (apt-get install chromium-headless-shell), and CI requires it")
        pytest.skip("no headless Chromium installed (apt-get install chromium-headless-shell)")
    folder = plans[name]["folder"]
    probe = folder / f"{name}-hover.html"
    probe.write_text(plans[name]["page"].replace("</body>", HOVER, 1), encoding="utf-8")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(flags + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "</html>" in dom.stdout and 'id="fabric"' in dom.stdout, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert len(console) == 1 and "hover title: " in console[0] and " s: " in console[0], console
    shot = folder / f"{name}.screenshot.png"
    done = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,2400", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines() if "CONSOLE" in line and "hover title" not in line]
