"""The timeline of one training step, placed from a Plan document's ``schedule`` (or, for a document
written before it, its ``breakdown``): blocks in time for each pipeline stage and the critical path.
Shared by the HTML page (:mod:`planner.report.html`) and the PNG (:mod:`planner.report.chart`).

Nothing here prices anything: the per-micro-batch seconds are the document's (``planner.views``),
and this module only lays them out as the cost model composes the step (``cost.step``). Every
stage runs each model chunk of each micro-batch at the slowest stage's times, forward then
backward, in Megatron-Core's interleaved 1F1B order (plain 1F1B with one chunk): a rank runs
``2 (pp - r - 1) + (vp - 1) N`` chunks forward before its first backward (``N`` the micro-batch
group; ``pp - r - 1`` without interleaving), then one forward and one backward in turn, then the
remaining backwards. A chunk waits for the previous stage's forward or the next stage's backward of
the same micro-batch. The LM head and the stage sends of each micro-batch run on the last stage,
where the model charges them (``m (t_head + t_p2p)``: they set the steady-state period, not the
bubble). After its last backward a stage's exposed data-parallel traffic runs, and every stage
steps the optimizer together at the end. With uniform stages this schedule lasts
``(m + (pp - 1) / vp) t + m (t_head + t_p2p)``, the pipeline term of ``cost.step``; the critical
path (each block's start set by the block before it) therefore sums to the step time.

The exposed collectives of a micro-batch's layers are priced as one figure; they are drawn half in
its forward chunks and half in its backward chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterplan.planner.report.text import TIME_LABELS

MAX_STAGE_ROWS = 8
"""Stages drawn: all up to this many, else this many evenly spaced from the first to the last."""
MAX_CHUNKS = 250_000
"""Model chunks (stages x chunks x micro-batches) placed at most; a plan has far fewer."""
MAX_OPS_PER_ROW = 120
"""Chunks drawn one by one on a row; beyond, consecutive chunks are drawn as :data:`MERGED_SPANS`
merged spans (the page stays small on a pipeline of thousands of chunks)."""
MERGED_SPANS = 48

TERMS = {  # key: (label, colour); the breakdown's keys with the text report's labels
    "forward": ("forward", "#4e79a7"), "backward": ("backward", "#f28e2b"), "recompute": ("recompute", "#e15759"),
    "tp_comm": (TIME_LABELS["tp_comm"], "#76b7b2"), "cp_comm": (TIME_LABELS["cp_comm"], "#59a14f"),
    "ep_comm": (TIME_LABELS["ep_comm"], "#edc948"), "head": ("LM head and loss (forward + backward)", "#b07aa1"),
    "pp_p2p": (TIME_LABELS["pp_p2p"], "#ff9da7"), "dp_comm": (TIME_LABELS["dp_comm"], "#9c755f"),
    "optimizer": (TIME_LABELS["optimizer"], "#555555"), "grad_accum": (TIME_LABELS["grad_accum"], "#bab0ac"), "idle": ("idle (pipeline bubble)", "#e8e8e8"),
    "hidden": ("communication hidden by overlap (not step time)", "#8cd17d"),
    "compute": (TIME_LABELS["compute"], "#4e79a7"), "pp_bubble": (TIME_LABELS["pp_bubble"], "#e8e8e8"),
}
LAYER_COMMS = ("tp_comm", "cp_comm", "ep_comm")


@dataclass(frozen=True)
class Block:
    """One drawn span: ``term`` (a key of :data:`TERMS`) for ``duration_s`` from ``start_s``;
    ``what`` says which micro-batch, chunk and stage (the hover title)."""

    start_s: float
    duration_s: float
    term: str
    what: str = ""


@dataclass
class Row:
    label: str
    blocks: list[Block] = field(default_factory=list)
    hidden: list[Block] = field(default_factory=list)
    """Collectives an overlap hides, drawn under the compute they hide behind (not step time)."""


@dataclass
class Timeline:
    step_time_s: float
    path: Row
    """The critical path: the blocks whose durations make up the step, in order."""
    rows: list[Row]
    note: str


@dataclass
class _Op:
    rank: int
    kind: str  # F or B
    mb: int
    chunk: int
    parts: list[tuple[str, float]]
    start_s: float = 0.0
    end_s: float = 0.0
    before: "_Op | None" = None  # what set its start: the rank's previous chunk or the chunk it waits on

    @property
    def what(self) -> str:
        word = "forward" if self.kind == "F" else "backward"
        return f"{word} of micro-batch {self.mb + 1}, chunk {self.chunk + 1}, stage {self.rank}"


def build_timeline(doc: dict) -> Timeline:
    """The step's timeline from a Plan document (or a what-if row) with a ``schedule``; from its
    ``breakdown`` alone, one row, where it has none."""
    s = doc.get("schedule")
    if not s:
        return _breakdown_timeline(doc)
    named = (doc.get("layout") or {}).get("schedule")
    if named:  # Layout.schedule: its bubble is priced, but the simulation below runs (interleaved) 1F1B
        return _breakdown_timeline(doc, f"the {named} pipeline schedule is not drawn (the timeline lays out 1F1B "
                                        "and interleaved 1F1B)", "")
    try:
        if s["pp"] * s["vp"] * s["num_microbatches"] > MAX_CHUNKS:
            raise ValueError(f"schedule: more than {MAX_CHUNKS:,} chunks")
        ops = _simulate(s)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as err:
        return _breakdown_timeline(doc, f"the document's schedule cannot be drawn ({err})")
    pipe_end = max(o.end_s for o in ops)
    finish = pipe_end + s["dp_comm_s"] + _grad_accum_s(s)
    tail = [("dp_comm", s["dp_comm_s"]), ("grad_accum", _grad_accum_s(s)), ("optimizer", s["optimizer_s"])]
    shown = _shown_ranks(s["pp"])
    rows = [_rank_row(s, r, [o for o in ops if o.rank == r], finish) for r in shown]
    path_ops = _critical(max(ops, key=lambda o: o.end_s))
    path = Row("critical path", _path_blocks(path_ops, len(path_ops) > MAX_OPS_PER_ROW))
    t = pipe_end
    for term, seconds in tail:
        path.blocks.append(Block(t, seconds, term, "after the pipeline drains"))
        t += seconds
    note = (f"{len(shown)} of {s['pp']} stages shown" + (" (evenly spaced, first to last)" if len(shown) < s["pp"] else "")
            + f"; {s['num_microbatches']} micro-batches"
            + (f", {s['vp']} model chunks per stage" if s["vp"] > 1 else "")
            + "; the critical path (top row) chains the blocks each of which starts as the one before it ends, "
              "so they sum to the step time; every stage at the slowest stage's times, as the step is priced; "
              "the LM head and stage sends "
              "on the last stage, where the model charges them; exposed layer collectives drawn half in the "
              "forward, half in the backward")
    return Timeline(doc["step_time_s"], path, rows, note)


def _breakdown_timeline(doc: dict, why: str = "this document has no per-micro-batch schedule (written "
                        "before it)", hint: str = "; plan --json again for the pipeline timeline") -> Timeline:
    """A document without a schedule: its breakdown as one row of consecutive terms."""
    row, t = Row("step"), 0.0
    for term, seconds in doc["breakdown"].items():
        if seconds:
            row.blocks.append(Block(t, seconds, term, "the whole step"))
            t += seconds
    note = f"{why}: the step's breakdown is drawn as one row{hint}"
    return Timeline(doc["step_time_s"], row, [], note)


def _grad_accum_s(s: dict) -> float:
    """The step's gradient accumulation (``cost.step.TimeBreakdown.grad_accum_s``); 0 in documents
    written before it was priced."""
    return s.get("grad_accum_s", 0.0)


def _shown_ranks(pp: int) -> list[int]:
    if pp <= MAX_STAGE_ROWS:
        return list(range(pp))
    return sorted({round(i * (pp - 1) / (MAX_STAGE_ROWS - 1)) for i in range(MAX_STAGE_ROWS)})


def _chunk_parts(s: dict) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The parts of one forward chunk and of one backward chunk (a micro-batch's terms over vp)."""
    vp = s["vp"]
    comms = [(k, s[f"{k}_s"] / 2 / vp) for k in LAYER_COMMS if s[f"{k}_s"]]
    forward = [("forward", s["forward_s"] / vp)] + comms
    backward = ([("recompute", s["recompute_s"] / vp)] if s["recompute_s"] else []) + [("backward", s["backward_s"] / vp)]
    return forward, backward + comms


def _rank_orders(s: dict) -> list[list[tuple[str, int, int]]]:
    """Each rank's chunks in the order it runs them: ``(F|B, micro-batch, chunk)``."""
    pp, vp, m, n = s["pp"], s["vp"], s["num_microbatches"], s["microbatch_group"] or s["pp"]
    groups = [list(range(g, min(m, g + n))) for g in range(0, m, n)]
    forward = [(i, c) for mbs in groups for c in range(vp) for i in mbs]
    backward = [(i, c) for mbs in groups for c in reversed(range(vp)) for i in mbs]
    orders = []
    for r in range(pp):
        warm = min(pp - r - 1 if vp == 1 else 2 * (pp - r - 1) + (vp - 1) * n, m * vp)
        order = [("F", *x) for x in forward[:warm]]
        for k in range(m * vp - warm):
            order += [("F", *forward[warm + k]), ("B", *backward[k])]
        order += [("B", *x) for x in backward[m * vp - warm:]]
        orders.append(order)
    return orders


def _simulate(s: dict) -> list[_Op]:
    """Every chunk placed: each starts when its rank is free and the chunk it waits on is done."""
    pp = s["pp"]
    forward, backward = _chunk_parts(s)
    tail = [("pp_p2p" if k == "p2p" else k, s[f"{k}_s"]) for k in ("head", "p2p") if s[f"{k}_s"]]
    orders, done, ops = _rank_orders(s), {}, []
    free: list[_Op | None] = [None] * pp
    index = [0] * pp
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while index[r] < len(orders[r]):
                op = _place(s, orders[r][index[r]], r, done, free[r], forward + tail, forward, backward)
                if op is None:
                    break
                free[r] = op
                ops.append(op)
                index[r] += 1
                moved = True
    if len(ops) != sum(len(o) for o in orders):
        raise ValueError("schedule: the chunks do not all run (a schedule no plan writes)")
    return ops


def _place(s: dict, item: tuple[str, int, int], rank: int, done: dict, prev: "_Op | None", last_forward: list,
           forward: list, backward: list) -> "_Op | None":
    """The chunk ``item`` of ``rank`` placed after ``prev``, or None while the chunk it waits on has
    not run: a forward waits on the previous virtual stage's forward, a backward on the next one's
    backward (the last virtual stage on its own forward)."""
    kind, mb, chunk = item
    v, last = chunk * s["pp"] + rank, s["pp"] * s["vp"] - 1
    if kind == "F":
        wait = done.get(("F", mb, v - 1)) if v else None
        if v and wait is None:
            return None
        parts = last_forward if v == last else forward
    else:
        wait = done.get(("B", mb, v + 1)) if v < last else done.get(("F", mb, v))
        if wait is None:
            return None
        parts = backward
    op = _Op(rank, kind, mb, chunk, parts)
    op.before = wait if wait is not None and (prev is None or wait.end_s > prev.end_s) else prev
    op.start_s = op.before.end_s if op.before else 0.0
    op.end_s = op.start_s + sum(seconds for _, seconds in parts)
    done[(kind, mb, v)] = op
    return op


def _critical(end: _Op) -> list[_Op]:
    path = []
    op: _Op | None = end
    while op is not None:
        path.append(op)
        op = op.before
    return path[::-1]


def _op_blocks(op: _Op) -> list[Block]:
    out, t = [], op.start_s
    for term, seconds in op.parts:
        out.append(Block(t, seconds, term, op.what))
        t += seconds
    return out


def _merged_blocks(ops: list[_Op], what: str) -> list[Block]:
    """Consecutive chunks drawn as one span: each term's total, in the order the terms first
    appear, then the idle time between them."""
    totals: dict[str, float] = {}
    for op in ops:
        for term, seconds in op.parts:
            totals[term] = totals.get(term, 0.0) + seconds
    start, end = ops[0].start_s, ops[-1].end_s
    totals["idle"] = max(0.0, end - start - sum(totals.values()))
    out, t = [], start
    for term, seconds in totals.items():
        if seconds > 0:
            out.append(Block(t, seconds, term, what))
            t += seconds
    return out


def _spans(ops: list[_Op], merge: bool) -> list[list[_Op]]:
    if not merge:
        return [[op] for op in ops]
    size = -(-len(ops) // MERGED_SPANS)
    return [ops[i:i + size] for i in range(0, len(ops), size)]


def _path_blocks(ops: list[_Op], merge: bool) -> list[Block]:
    out = []
    for span in _spans(ops, merge):
        if len(span) == 1:
            out += _op_blocks(span[0])
        else:
            out += _merged_blocks(span, f"{len(span)} chunks on the path: {span[0].what} to {span[-1].what}")
    return out


def _rank_row(s: dict, rank: int, ops: list[_Op], finish_s: float) -> Row:
    """One stage's row: its chunks, the idle time between them, its exposed data-parallel traffic
    after its last backward, the optimizer at the end, and the collectives its overlaps hide."""
    row, t = Row(f"stage {rank}"), 0.0
    for span in _spans(ops, len(ops) > MAX_OPS_PER_ROW):
        if span[0].start_s > t:
            row.blocks.append(Block(t, span[0].start_s - t, "idle", f"stage {rank} waits on the pipeline"))
        row.blocks += _op_blocks(span[0]) if len(span) == 1 else _merged_blocks(
            span, f"stage {rank}: {len(span)} chunks, {span[0].what} to {span[-1].what}")
        t = span[-1].end_s
    row.blocks.append(Block(t, s["dp_comm_s"], "dp_comm", f"stage {rank}, after its last backward"))
    t += s["dp_comm_s"]
    if _grad_accum_s(s):  # each micro-batch's adds after its backward, drawn together
        row.blocks.append(Block(t, _grad_accum_s(s), "grad_accum", f"stage {rank}, every micro-batch's adds together"))
        t += _grad_accum_s(s)
    if finish_s > t:
        row.blocks.append(Block(t, finish_s - t, "idle", f"stage {rank} waits for every stage before the optimizer"))
    row.blocks.append(Block(finish_s, s["optimizer_s"], "optimizer", f"stage {rank}, every stage together"))
    row.hidden = _hidden_blocks(s, rank, ops)
    return row


def _hidden_blocks(s: dict, rank: int, ops: list[_Op]) -> list[Block]:
    """What the overlaps hide: each chunk's share of the hidden TP and EP collectives from its start,
    and the data-parallel reduction hidden behind the backward, ending with the last one."""
    hidden, vp = s.get("hidden") or {}, s["vp"]
    per_chunk = sum(hidden.get(k, 0.0) for k in ("tp_comm_s", "ep_comm_s")) / 2 / vp
    out = []
    if per_chunk > 0 and len(ops) <= MAX_OPS_PER_ROW:
        out += [Block(op.start_s, min(per_chunk, op.end_s - op.start_s), "hidden",
                      f"TP/EP collectives hidden behind the GEMMs of the {op.what}") for op in ops]
    dp = hidden.get("dp_comm_s", 0.0)
    backward_end = max((op.end_s for op in ops if op.kind == "B"), default=0.0)
    if dp > 0:
        start = max(0.0, backward_end - dp)
        out.append(Block(start, backward_end - start, "hidden",
                         f"stage {rank}: data-parallel reduction hidden behind the backward ({dp:.4g} s)"))
    return out
