"""The CP-SAT model: knob indices as variables, cost terms through element constraints.

Each knob is an integer variable indexing its domain in the :class:`~planner.search.space.Space`.
Factorization, interleaving and micro-batch size are chosen together through one variable ``fvm``
ranging over the (f, v, mb) triples that pass the batch, layer and interleaving rules, so those
rules cost nothing at search time; ``fv`` is the (f, v) pair it implies. Group indices (which
(tp, cp) pair, which tensor-parallel communicator) are element look-ups on the factorization and
order; each cost term is an element look-up on its own small table (``planner.search.tables``).

Products the decomposition cannot avoid (micro-batch slots times per-micro-batch time, in-flight
layers times activation bytes, stage share times the overlap window) are multiplication
equalities. Their linear relaxation is weak, so each is also bounded below by its first factor
times the least second factor its knobs allow: a valid cut that leaves the optimum unchanged and
lets the solver prove it quickly. Memory fit is two linear inequalities; runners-up come from
re-solving with the previous optima forbidden.

The objective itself is bounded below per (f, mb, v) triple and expert degree by a memory-aware
bound (``planner.search.bounds.objective_lower_bound``): the terms minimised separately over the placement and overlap
knobs, over only the (sp, recompute, ZeRO) choices whose memory fits. Memory is what rules out the
fastest layouts, so this bound is within about 1% of the optimum on the benchmark problems; the
triples whose bound exceeds a known upper bound (from the warm start) are left out of the model,
and (triple, ep) pairs that cannot fit are forbidden. This took DeepSeek-V3 on 2,048 H800 from
15 s to 2.2 s of CP-SAT time for the optimum and 3 runners-up (benchmarks/search_speed.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from clusterplan.cost import assembly
from clusterplan.cost.assembly import STEP_TERMS
from clusterplan.cost.terms import NUM_GRAD_BUCKETS
from clusterplan.models.errors import SolverError
from clusterplan.planner.search.exhaustive import DIMS
from clusterplan.planner.search.bounds import UNREACHABLE, factor_minima, neighbourhood, objective_lower_bound, once, warm_start
from clusterplan.planner.search.tables import SHARE_PARTS, SLOT_QUANTUM, Tables, full_recompute, key_use
from clusterplan.planner.search.reuse import fewer_collections

ELEMENT_MAX_ENTRIES = 64
OBJECTIVE_LIMIT = 2**59  # objective units: 5.8e7 s of step time at weight 1; eight such terms fit in 2^62


@dataclass
class CpSatResult:
    solutions: list[tuple[int, dict]]  # (objective, knob indices), best first
    status: str
    gap: float  # relative gap of the best solution (0 when proven optimal)
    wall_s: float
    num_branches: int


def _index_expr(vars_: list, shape: tuple[int, ...]):
    """Row-major flat index of a table of ``shape`` from one variable (or constant) per axis."""
    expr, stride = 0, 1
    for var, size in zip(reversed(vars_), reversed(shape)):
        expr = expr + var * stride
        stride *= size
    return expr


def _valid_triples(T: Tables) -> np.ndarray:
    """(f, mb, v) index triples passing the degree, batch, layer and interleaving rules."""
    ok = (T.ok_fmbv < 0) & (T.ok_f[:, None, None] < 0)
    return np.argwhere(ok)


class _Model:
    """Builds the CP-SAT model once; ``solve_cpsat`` re-solves it with exclusions for runners-up."""

    def __init__(self, T: Tables, cap: int | None = None):
        """``cap``: a known upper bound on every objective the caller wants (the k-th best of a
        sub-space bounds the k-th best of the space); (f, mb, v) triples whose lower bound exceeds
        it cannot hold any of them and are left out of the model."""
        if T.memory_only:
            raise ValueError("memory-only tables (build_tables(memory_only=True)) have no time terms to optimise")
        self.T = T
        self.cap = cap
        self.m = cp_model.CpModel()
        self.table_rows = 0
        self.pairs: list[tuple[object, np.ndarray]] = []  # (group key variable, its reached (key, mb) pairs)
        S = T.space
        triples = _valid_triples(T)
        if len(triples) == 0:
            raise SolverError("no (tp, pp, dp, cp, vp, micro-batch) combination passes the structural rules")
        # Order the (f, mb, v) choices by a lower bound of the whole objective so that the search
        # tries the most promising first (values are explored in index order); the same bound is
        # a cut on the objective.
        lb_e = once(T, objective_lower_bound)[triples[:, 0], triples[:, 1], triples[:, 2]]  # (triples, E)
        lb = lb_e.min(axis=1)
        keep = lb < UNREACHABLE  # a triple whose every completion overflows memory holds no solution
        if cap is not None:
            keep &= lb <= cap
        if not keep.any():
            keep[:] = True  # nothing fits: let the solver report it (count_rejections already has)
            lb_e = np.minimum(lb_e, 0)
            lb = lb_e.min(axis=1)
        triples, lb_e, lb = triples[keep], lb_e[keep], lb[keep]
        self.f_keep = np.zeros(len(T.space.factorizations), dtype=bool)
        self.f_keep[triples[:, 0]] = True
        order = np.argsort(lb, kind="stable")
        triples, self.triple_lb, self.triple_e_lb = triples[order], lb[order], lb_e[order]
        fv_pairs, fv_of_triple = np.unique(triples[:, [0, 2]], axis=0, return_inverse=True)
        self.triples, self.fv_pairs = triples, fv_pairs
        m = self.m
        self.fvm = m.new_int_var(0, len(triples) - 1, "fvm")
        self.fv = self._lookup("fv", fv_of_triple.ravel(), [self.fvm])
        sizes = {"o": len(S.order), "e": len(S.ep), "s": len(S.sequence_parallel), "r": len(S.recompute),
                 "z": len(S.zero_stage), "do": len(S.dp_overlap), "to": len(S.tp_overlap), "eo": len(S.ep_overlap)}
        self.x = {k: m.new_int_var(0, n - 1, k) for k, n in sizes.items()}
        self.x["f"] = self._lookup("f", triples[:, 0], [self.fvm])
        self.x["mb"] = self._lookup("mb", triples[:, 1], [self.fvm])
        self.x["v"] = self._lookup("v", triples[:, 2], [self.fvm])
        # (f, mb) pairs of the kept triples: a table over (group key, mb, ...) keeps only the rows
        # some kept factorization reaches at one of its micro-batch sizes (``_lookup``)
        self.f_mb = np.zeros((len(T.space.factorizations), len(S.micro_batch_size)), bool)
        self.f_mb[triples[:, 0], triples[:, 1]] = True
        self._structure()
        self._memory()
        self._objective()

    # ---- helpers ---------------------------------------------------------------------------
    def _lookup(self, name: str, table: np.ndarray, axes: list):
        """``target = table[axes...]``; returns the target variable.

        Small tables are element constraints on a flat index; large ones are allowed-assignment
        tables over (axes..., target), which CP-SAT presolves much faster than an expanded element
        (measured: 2x on DeepSeek-V3 / 2048 GPUs, benchmarks/search_speed.py).
        """
        table = np.asarray(table)
        target = self.m.new_int_var(int(table.min()), int(table.max()), name)
        if table.size <= ELEMENT_MAX_ENTRIES:
            self.m.add_element(_index_expr(axes, table.shape), [int(v) for v in table.ravel()], target)
        else:
            rows = np.concatenate([np.indices(table.shape).reshape(len(axes), -1).T, table.reshape(-1, 1)], axis=1)
            if axes and axes[0] is getattr(self, "x", {}).get("f"):  # dropped factorizations cannot occur
                rows = rows[self.f_keep[rows[:, 0]]]
            reached = next((mask for var, mask in self.pairs if var is axes[0]), None)
            if reached is not None and len(axes) > 1 and axes[1] is self.x["mb"]:
                rows = rows[reached[rows[:, 0], rows[:, 1]]]
            self.m.add_allowed_assignments(list(axes) + [target], rows.tolist())
            self.table_rows += len(rows)
        return target

    def _product(self, name: str, a, b, hi: int, weight: int = 1):
        """``a * b``; ``weight`` is its coefficient in the objective. The table maxima multiply to
        bounds that can overflow CP-SAT's 64-bit sums under energy weights; any product above
        OBJECTIVE_LIMIT / weight would belong to a step of days, so the domain stops there."""
        hi = min(hi, OBJECTIVE_LIMIT // max(1, weight))
        target = self.m.new_int_var(0, hi, name)
        self.m.add_multiplication_equality(target, [a, b])
        return target

    def _fvm_table(self, table: np.ndarray) -> np.ndarray:
        """A (F, MB, V)-indexed table restricted to the valid triples."""
        t = self.triples
        return table[t[:, 0], t[:, 1], t[:, 2]]

    def _fv_table(self, table: np.ndarray) -> np.ndarray:
        """A table whose first two axes are (F, V), restricted to the valid pairs."""
        return table[self.fv_pairs[:, 0], self.fv_pairs[:, 1]]

    # ---- constraints -------------------------------------------------------------------------
    def _structure(self) -> None:
        T, x, m = self.T, self.x, self.m
        self.tc = self._keyed("tc", T.tc_of_fe, [x["f"], x["e"]])
        self.tpg = self._keyed("tpg", T.tpg_of_fo, [x["f"], x["o"]])
        self.tpc = self._keyed("tpc", T.tpc_of_foe, [x["f"], x["o"], x["e"]])
        self.cpg = self._keyed("cpg", T.cpg_of_fo, [x["f"], x["o"]])
        self.epg = self._keyed("epg", T.epg_of_foe, [x["f"], x["o"], x["e"]])
        m.add_allowed_assignments([x["f"], x["e"]], self._f_rows(T.ok_fe < 0))
        if refused := self._f_rows(T.ok_foe >= 0):  # fewer than the allowed; most spaces have none
            m.add_forbidden_assignments([x["f"], x["o"], x["e"]], refused)
        m.add_allowed_assignments([x["f"], x["e"], x["s"]], self._f_rows(T.ok_fes < 0))
        m.add_allowed_assignments([x["f"], x["o"]], self._f_rows(T.ok_fo < 0))
        # Symmetry breaking (planner.search.space.canonical), split by the knobs each part concerns.
        order_ok = T.canon.any(axis=(1, 2, 3, 5, 6))  # (F, O)
        m.add_allowed_assignments([x["f"], x["o"]], self._f_rows(order_ok))
        rest = T.canon.any(axis=4)  # (F, E, S, Z, DO, TO)
        m.add_allowed_assignments([x["f"], x["e"], x["s"], x["z"], x["do"], x["to"]], self._f_rows(rest))
        if len(T.space.ep_overlap) > 1:
            m.add_allowed_assignments([x["e"], x["eo"]], np.argwhere(T.eo_canon).tolist())
            m.add_allowed_assignments([x["f"], x["v"], x["r"], x["eo"]], self._f_rows(T.eo_ok))

    def _keyed(self, name: str, index: np.ndarray, axes: list):
        """The group key ``index[axes...]`` (over (f, ...)) as a variable, with the (key, mb) pairs
        the kept triples reach, which the tables read through it are cut to."""
        key = self._lookup(name, index, axes)
        self.pairs.append((key, key_use(index, int(index.max()) + 1, self.f_mb)))
        return key

    def _f_rows(self, mask: np.ndarray) -> list:
        """The index tuples where ``mask`` (first axis: factorization) holds, for the factorizations
        the model keeps (the others cannot be chosen, so their rows only cost loading time)."""
        return np.argwhere(mask & self.f_keep.reshape((-1,) + (1,) * (mask.ndim - 1))).tolist()

    def _memory(self) -> None:
        """Every memory row (``planner.search.tables.memory_rows``) within the capacity."""
        T, x = self.T, self.x
        ta = self._keyed("ta", T.ta_of_f, [x["f"]])
        axes4 = [ta, x["mb"], x["s"], x["r"]]
        trans = self._lookup("trans", T.TRANS, axes4)
        logits = self._lookup("logits", T.LOGITS, axes4)
        acts = [(self._lookup(f"act_{kind}", table, axes4), table, kind)
                for table, kind in ((T.ACT_D, "ifd"), (T.ACT_M, "ifm")) if table.any()]
        one = None
        for row in T.rows:
            full = self._lookup(f"static_{row.name}", self._fv_table(row.static), [self.fv, x["e"], x["z"]])
            static = full
            if row.frees_gradients():  # a one-micro-batch step holds no gradient at its activation peak
                one = one if one is not None else self._lookup(
                    "one_microbatch", self._fvm_table((T.M == 1)[:, :, None].repeat(T.U.shape[2], 2)), [self.fvm])
                static1 = self._lookup(f"static1_{row.name}", self._fv_table(row.static1), [self.fv, x["e"], x["z"]])
                static = full - self._product(f"grads_freed_{row.name}", one, full - static1,
                                              int((row.static - row.static1).max()))
                self.m.add(full + trans <= T.capacity)  # backward's end: every gradient, no activation
            if row.copies_gradients():  # the optimizer step's copies of the gradient partition
                self.m.add(self._lookup(f"step_{row.name}", self._fv_table(row.step), [self.fv, x["e"], x["z"]])
                           <= T.capacity)
            held = static + trans + (logits if row.logits else 0)
            for act, table, kind in acts:
                count = getattr(row, kind)
                if count.any():
                    flying = self._lookup(f"{kind}_{row.name}", self._fvm_table(count), [self.fvm])
                    held += self._product(f"act_{kind}_{row.name}", act, flying, int(table.max()) * int(count.max()))
            self.m.add(held <= T.capacity)

    def _objective(self) -> None:
        T, x, m, Q = self.T, self.x, self.m, SLOT_QUANTUM
        axes4 = [self.tc, x["mb"], x["s"], x["r"]]
        c = self._lookup("compute", T.C, axes4)
        axes5 = axes4 + [x["to"]]
        bwd = self._lookup("dp_window", T.BWD, axes5)
        fw = self._lookup("fsdp_window", T.FW, axes5 + [x["eo"]])
        tpc = self._lookup("tp_comm", T.TPC, [self.tpc, x["mb"], x["s"], x["r"], x["to"]])
        cpc = self._lookup("cp_comm", T.CPC, [self.cpg, x["mb"], x["s"]])
        epc = self._lookup("ep_comm", T.EPC, [self.epg, x["mb"], x["s"], x["r"]])
        u = self._lookup("slots", self._fvm_table(T.U), [self.fvm])
        frac = self._lookup("frac", self._fv_table(T.FRAC), [self.fv])
        mb_count = self._lookup("microbatches", self._fvm_table(T.M[:, :, None].repeat(T.U.shape[2], 2)), [self.fvm])
        mb_terms = [t for t in STEP_TERMS if t.per_microbatch]
        per_mb = m.new_int_var(0, per_mb_hi := int(sum(getattr(T, t.table).max() for t in mb_terms)), "per_mb")
        added = {t.name: self._term(t) for t in mb_terms}  # what each micro-batch adds
        m.add(per_mb == _total([v for v in added.values() if v is not None], 0))
        tw, bw = T.time_weight, T.busy_weight
        extra = self._product("head_p2p", mb_count, per_mb, int(T.M.max()) * per_mb_hi, tw * Q)
        _, hmin = once(T, factor_minima)
        m.add(extra >= self._lookup("head_lb", self._fvm_table((T.M * hmin)[:, :, None].repeat(T.U.shape[2], 2)),
                                    [self.fvm]))
        core = self._pipeline_and_dp(u, c, tpc, cpc, epc, axes4, axes5, frac, (bwd, fw), mb_count)
        step_terms = [t for t in STEP_TERMS if not t.per_microbatch]
        added.update({t.name: self._term(t) for t in step_terms})  # what each step adds
        accumulation = self._grad_accumulation(mb_count)
        step = [Q * added[t.name] for t in step_terms if added[t.name] is not None]
        self.objective = T.time_weight * (_total([Q * extra, *step, Q * accumulation], core))
        if T.busy_weight:  # energy: the extra power while computing (planner.search.tables docstring)
            share = self._fvm_table(T.M[:, :, None] * T.BF[:, None, None].repeat(T.U.shape[2], 2))
            busy_compute = self._product("busy_compute", self._lookup("mb_share", share, [self.fvm]), c,
                                         int(share.max()) * int(T.C.max()), bw)
            busy = [Q * self._product(f"busy_{t.name}", mb_count, added[t.name],
                                      int(T.M.max()) * int(getattr(T, t.table).max()), bw * Q)
                    for t in mb_terms if t.busy and added[t.name] is not None]
            busy += [Q * added[t.name] for t in step_terms if t.busy and added[t.name] is not None]
            self.objective += T.busy_weight * _total([*busy, Q * accumulation], busy_compute)
        m.add(self.objective >= self._lookup("objective_lb", self.triple_lb, [self.fvm]))
        # A (triple, ep) pair whose every completion overflows memory, or whose bound exceeds the cap,
        # is excluded outright.
        limit = UNREACHABLE if self.cap is None else min(UNREACHABLE, self.cap + 1)
        pairs = np.argwhere(self.triple_e_lb < limit)
        if len(pairs) == 0:
            pairs = np.argwhere(self.triple_e_lb < UNREACHABLE)
        m.add_allowed_assignments([self.fvm, x["e"]], pairs.tolist())
        m.minimize(self.objective)

    def _term(self, term):
        """An additive term of the step (``cost.assembly.STEP_TERMS``) at the chosen knobs, looked up
        on its table through its dims (a group key's variable, (f, v) through ``fv``); None where it is
        sparse and no cell pays it."""
        T, x = self.T, self.x
        table, dims = getattr(T, term.table), term.dims
        if term.sparse and not table.any():
            return None
        if dims[0] not in DIMS:
            keys = {"tpg_of_fo": self.tpg, "tpc_of_foe": self.tpc, "cpg_of_fo": self.cpg, "epg_of_foe": self.epg,
                    "tc_of_fe": self.tc}
            return self._lookup(term.name, table, [keys[dims[0]]] + [x[d] for d in dims[1:]])
        if "v" not in dims:
            return self._lookup(term.name, table, [x[d] for d in dims])
        lead = ("f", "mb", "v") if "mb" in dims else ("f", "v")
        rest = [d for d in dims if d not in lead]
        table = np.transpose(table, [dims.index(d) for d in (*lead, *rest)])
        table, key = (self._fvm_table(table), self.fvm) if "mb" in dims else (self._fv_table(table), self.fv)
        return self._lookup(term.name, table, [key] + [x[d] for d in rest])

    def _grad_accumulation(self, mb_count):
        """The step's gradient accumulation (``exhaustive.grad_accumulation_term``): the micro-batches
        times one's add, less the first's where it is taken as it comes and the only one's where a
        one-micro-batch step adds nothing; 0 where no layout pays any."""
        T, x = self.T, self.x
        if not T.GA.any():
            return 0
        axes = [self.fv, x["e"], x["z"]]
        per_mb = self._lookup("grad_accum", self._fv_table(T.GA), axes)
        first = self._lookup("grad_accum_first", self._fv_table(T.GAW), axes)
        weight = (T.time_weight + T.busy_weight) * SLOT_QUANTUM  # in the step time and, for energy, the busy time
        adds = self._product("grad_accum_adds", mb_count, per_mb, int(T.M.max()) * int(T.GA.max()), weight)
        if not T.GA1.any():
            return adds - first
        one = self._lookup("grad_accum_one", self._fvm_table((T.M == 1)[:, :, None].repeat(T.U.shape[2], 2)), [self.fvm])
        only = self._lookup("grad_accum_only", self._fv_table(T.GA1), axes)
        return adds - first - self._product("grad_accum_skipped", one, only, int(T.GA1.max()))

    def _pipeline_and_dp(self, u, c, tpc, cpc, epc, axes4, axes5, frac, windows, mb_count):
        """The pipeline and the exposed data-parallel traffic over the step
        (``planner.search.exhaustive._pipeline_and_dp``): with dense and MoE layers both, at least
        each candidate stage's, each with its own windows, the objective holding it at the larger."""
        T, m, Q, tw = self.T, self.m, SLOT_QUANTUM, self.T.time_weight
        hidden = self._ep_hidden(epc, axes5)
        dp_step, dp_mb = self._dp_traffic()
        bwd, fw = windows
        if T.stages is None:
            layer_hi = int(T.C.max() + T.TPC.max() + T.CPC.max() + T.EPC.max())
            layer = m.new_int_var(0, layer_hi, "layer_time")
            m.add(layer == c + tpc + cpc + epc)
            pipe = self._product("pipeline", u, layer, int(T.U.max()) * layer_hi, tw)
            xmin, _ = once(T, factor_minima)
            m.add(pipe >= self._lookup("pipeline_lb", self._fvm_table(T.U * xmin[:, :, None]), [self.fvm]))
            step_window = self._product("dp_window_share", frac, bwd, int(T.FRAC.max()) * int(T.BWD.max()))
            mb_window = self._product("fsdp_window_share", frac, fw, int(T.FRAC.max()) * int(T.FW.max()))
            return (pipe - self._ep_saving(T.UG, hidden, "") - self._zero_bubble(axes4)
                    + self._dp_exposed("", dp_step, dp_mb, step_window, mb_window, mb_count))
        dense, moe = self._kind_times(c, tpc, epc, axes4, axes5)
        split = [(whole, self._lookup(f"{name}_moe", table, axes), table_whole, table) for whole, name, table, axes,
                 table_whole in ((bwd, "dp_window", T.BWD_M, axes5, T.BWD), (fw, "fsdp_window", T.FW_M,
                                                                             axes5 + [self.x["eo"]], T.FW))]
        core = m.new_int_var(0, OBJECTIVE_LIMIT // max(1, tw), "pipeline_and_dp")
        for k, stage in enumerate(T.stages):
            pipe = (self._signed_product(f"stage{k}_dense", stage.ud, dense)
                    + self._signed_product(f"stage{k}_moe", stage.um, moe) - self._ep_saving(stage.ugm, hidden, f"_stage{k}")
                    - self._zero_bubble(axes4, stage, k))
            step_window, mb_window = (self._stage_window(f"{k}_{n}", stage, whole, part, big, small)
                                      for n, (whole, part, big, small) in enumerate(split))
            m.add(core >= pipe + self._dp_exposed(f"_stage{k}", dp_step, dp_mb, step_window, mb_window, mb_count))
        return core + self._product("pipeline_cp", u, cpc, int(T.U.max()) * int(T.CPC.max()), tw)

    def _zero_bubble(self, axes4, stage=None, k: int = 0):
        """What zero bubble takes off the bubble (``exhaustive.zero_bubble_saving``): its slots times
        the backward compute of one micro-batch; per kind on a candidate ``stage``. 0 where no
        layout runs it."""
        T, m = self.T, self.m
        if T.ZU is None:
            return 0
        if "zero_bubble_backward" not in self.__dict__:
            self.zero_bubble_backward = self._lookup("backward", T.BK, axes4)
            if T.BK_M is not None:
                moe = self._lookup("moe_backward", T.BK_M, axes4)
                dense = m.new_int_var(0, int((T.BK - T.BK_M).max()), "dense_backward")
                m.add(dense == self.zero_bubble_backward - moe)
                self.zero_bubble_backward = (dense, moe)
        bk = self.zero_bubble_backward
        if stage is None:
            return self._signed_product("zero_bubble", T.ZU, bk)
        return (self._signed_product(f"stage{k}_zero_bubble_dense", stage.zd, bk[0])
                + self._signed_product(f"stage{k}_zero_bubble_moe", stage.zm, bk[1]))

    def _kind_times(self, c, tpc, epc, axes4, axes5):
        """The dense and the MoE layers' time per micro-batch (all layers of each kind) as variables."""
        T, m = self.T, self.m
        cm = self._lookup("moe_compute", T.C_M, axes4)
        tpcm = self._lookup("moe_tp_comm", T.TPC_M, [self.tpc] + axes5[1:])
        lo, hi = int((T.C - T.C_M).min() + (T.TPC - T.TPC_M).min()), int((T.C - T.C_M).max() + (T.TPC - T.TPC_M).max())
        dense = m.new_int_var(min(0, lo), max(0, hi), "dense_time")
        m.add(dense == c - cm + tpc - tpcm)
        moe = m.new_int_var(0, int(T.C_M.max() + T.TPC_M.max() + T.EPC.max()), "moe_time")
        m.add(moe == cm + tpcm + epc)
        return dense, moe

    def _stage_window(self, name: str, stage, whole, moe, whole_table: np.ndarray, moe_table: np.ndarray):
        """A candidate stage's window: its share of the dense layers' window and of the MoE layers'."""
        dense_table = whole_table - moe_table
        dense = self.m.new_int_var(min(0, int(dense_table.min())), max(0, int(dense_table.max())), f"window{name}_dense")
        self.m.add(dense == whole - moe)
        fd = self._lookup(f"window{name}_fd", self._fv_table(stage.fd), [self.fv])
        fm = self._lookup(f"window{name}_fm", self._fv_table(stage.fm), [self.fv])
        d = self.m.new_int_var(min(0, int(stage.fd.max()) * _bounds(dense)[0]),
                               int(stage.fd.max()) * _bounds(dense)[1], f"window{name}_d")
        self.m.add_multiplication_equality(d, [fd, dense])
        e = self._product(f"window{name}_m", fm, moe, int(stage.fm.max()) * int(moe_table.max()))
        window = self.m.new_int_var(0, int(stage.fd.max()) * max(0, int(dense_table.max()))
                                    + int(stage.fm.max()) * int(moe_table.max()), f"window{name}")
        self.m.add_max_equality(window, [0, d + e])
        return window

    def _dp_exposed(self, suffix: str, dp_step, dp_mb, step_window, mb_window, mb_count):
        """The exposed per-step traffic (beyond ``step_window`` less the last micro-batch's ZeRO-2/3
        traffic) and the micro-batches' exposed ZeRO-2/3 traffic (beyond ``mb_window``)."""
        T, Q, tw = self.T, SLOT_QUANTUM, self.T.time_weight
        dp_exp = self._exposed(f"dp{suffix}", dp_step, step_window, taken=dp_mb)
        fsdp_mb = self._exposed(f"fsdp{suffix}", dp_mb, mb_window)
        return dp_exp + self._product(f"fsdp_total{suffix}", mb_count, fsdp_mb,
                                      int(T.M.max()) * int((T.DPM + T.RG).max()) * Q, tw)

    def _signed_product(self, name: str, table: np.ndarray, var):
        """``table[f, mb, v] * var`` where ``var``'s domain may reach below 0 (a quantized difference)."""
        lookup = self._lookup(f"{name}_slots", self._fvm_table(table), [self.fvm])
        lo, hi = _bounds(var)
        top = int(table.max())
        target = self.m.new_int_var(min(0, top * lo), max(0, top * hi), name)
        self.m.add_multiplication_equality(target, [lookup, var])
        return target

    def _ep_hidden(self, epc, axes5):
        """Per micro-batch slot, the all-to-all time EP overlap hides (``exhaustive.ep_hidden``), with
        the switch: ``(hidden, on)``; None where the overlap is off or out of the space."""
        T, x, m = self.T, self.x, self.m
        if True not in T.space.ep_overlap or not T.WE.any():
            return None
        we = self._lookup("ep_overlap_window", T.WE, axes5)
        # cost.assembly.ep_hidden: what the SM share leaves of the open all-to-alls, at most the window
        per_slot = assembly.ep_hidden(_Equalities(m, T.ep_share, [("ep_overlap_left", int(T.EPC.max())),
                                                                  ("ep_overlap_hidden", int(T.WE.max()))]), epc, we)
        on = self._lookup("ep_overlap_on", np.array(T.space.ep_overlap, dtype=np.int64), [x["eo"]])
        return per_slot, on

    def _ep_saving(self, slots: np.ndarray, hidden, suffix: str):
        """What EP overlap saves over the step: the steady-state ``slots`` times the hidden time per
        slot; 0 with it off or out of the space."""
        if hidden is None:
            return 0
        T, m, tw = self.T, self.m, self.T.time_weight
        per_slot, on = hidden
        ug = self._lookup(f"ep_overlap_slots{suffix}", self._fvm_table(slots), [self.fvm])
        hi = min(int(slots.max()) * int(T.WE.max()), OBJECTIVE_LIMIT // max(1, tw))
        full = self._product(f"ep_overlap_saving_if_on{suffix}", ug, per_slot, hi, tw)
        saving = m.new_int_var(0, hi, f"ep_overlap_saving{suffix}")  # the objective pushes it up to its bounds
        m.add(saving <= full)
        m.add(saving <= hi * on)
        return saving

    def _dp_traffic(self):
        """Per-step overlappable traffic (ZeRO 0-1) and per-micro-batch traffic (ZeRO 2-3)."""
        T, x = self.T, self.x
        axes = [self.fv, x["o"], x["e"], x["z"]]
        step = self._lookup("dp_step", self._fv_table(np.transpose(T.DPS, (0, 2, 1, 3, 4))), axes)
        per_mb = self._lookup("dp_mb", self._fv_table(np.transpose(T.DPM, (0, 2, 1, 3, 4))), axes)
        if not T.RG.any():
            return step, per_mb
        # ZeRO-3's third gathers, paid with full recomputation only
        regather = self._lookup("dp_regather", self._fv_table(np.transpose(T.RG, (0, 2, 1, 3, 4))), axes)
        full = self._lookup("recompute_full", full_recompute(T.space), [x["r"]])
        paid = self._product("dp_regather_paid", regather, full, int(T.RG.max()))
        total = self.m.new_int_var(0, int(T.DPM.max() + T.RG.max()), "dp_mb_total")
        self.m.add(total == per_mb + paid)
        return step, total

    def _exposed(self, name: str, traffic, window, taken=None):
        """``exposed = max(last bucket, slowdown, traffic - overlap window)``, or all of it without
        overlap; ``taken``: traffic that already fills part of the window (the window is what it leaves)."""
        T, x, m, Q = self.T, self.x, self.m, SLOT_QUANTUM
        hi_traffic = int(max(T.DPS.max(), (T.DPM + T.RG).max())) * Q
        hi_window = max(0, _bounds(window)[1])
        if taken is not None:
            left = m.new_int_var(0, hi_window, f"{name}_window_left")
            m.add_max_equality(left, [0, window - Q * taken])
            window = left
        overlap = self._lookup(f"{name}_overlap_on", np.array(T.space.dp_overlap, dtype=np.int64), [x["do"]])
        exposed = m.new_int_var(0, hi_traffic, f"{name}_exposed")
        # cost.assembly.exposed_traffic's terms (the last bucket, the SMs the NCCL kernels take, beyond
        # the window), each a lower bound; the scaled ones first, as this model has always posted them
        terms = assembly.exposed_traffic(_LowerBounds(T.dp_share), Q * traffic, window)
        for k, bound in sorted(terms, key=lambda t: t[0] == 1):
            m.add(k * exposed >= bound)
        m.add(exposed >= Q * traffic - (hi_traffic + hi_window + 1) * overlap)
        return exposed

    def indices(self, solver: cp_model.CpSolver) -> dict:
        idx = {k: int(solver.value(v)) for k, v in self.x.items()}
        return {k: idx[k] for k in DIMS}


def _total(terms: list, first):
    """``first + terms[0] + terms[1] + ...``, summed left to right as the model's expressions always
    were (the proto keeps the order its sums are written in)."""
    for term in terms:
        first = first + term
    return first


@dataclass(frozen=True)
class _LowerBounds:
    """``cost.assembly``'s ops for :func:`~cost.assembly.exposed_traffic` in CP-SAT: the objective
    minimises the exposure, so its maximum is a variable held at or above each term. A term is
    ``(k, expression)``: ``k x variable >= expression``, a division by ``k`` rounded up, as the
    tables' ``IntegerOps`` rounds it; ``dp_share`` in SHARE_PARTS."""

    dp_share: int

    @staticmethod
    def bucket(traffic) -> list:
        return [(NUM_GRAD_BUCKETS, traffic)]

    def slowdown(self, traffic) -> list:
        return [(SHARE_PARTS, self.dp_share * traffic)]

    @staticmethod
    def maximum(a, b) -> list:
        return [*(a if isinstance(a, list) else [(1, a)]), *(b if isinstance(b, list) else [(1, b)])]

    imax = maximum


class _Equalities:
    """``cost.assembly``'s ops for CP-SAT where a rule's result enters a product
    (:func:`~cost.assembly.ep_hidden`): each operation is a new variable held equal to its result,
    named and bounded by the next of ``names`` (``(name, upper bound)``, in the order they are made);
    ``ep_share`` in SHARE_PARTS, what EP overlap leaves rounded down as the tables' ``IntegerOps``."""

    def __init__(self, m: cp_model.CpModel, ep_share: int, names: list[tuple[str, int]]):
        self.m, self.ep_share, self.names = m, ep_share, iter(names)

    def _var(self):
        name, hi = next(self.names)
        return self.m.new_int_var(0, hi, name)

    def unshared(self, traffic):
        left = self._var()
        self.m.add_division_equality(left, (SHARE_PARTS - self.ep_share) * traffic, SHARE_PARTS)
        return left

    def minimum(self, a, b):
        least = self._var()
        self.m.add_min_equality(least, [a, b])
        return least


def _bounds(var) -> tuple[int, int]:
    """The least and the greatest value of an integer variable's domain (its proto's repeated
    field takes no negative index)."""
    domain = list(var.proto.domain)
    return int(domain[0]), int(domain[-1])


CPSAT_MAX_MEMORY_MB = 2048
"""CP-SAT's own memory limit. A model whose propagation outgrows it (Mixtral at 32k tokens with
unfused attention on Gaudi 2 exhausted the machine's memory after two minutes) stops, and
``planner.search`` falls back to the exhaustive engine on the same tables."""


@fewer_collections()
def solve_cpsat(T: Tables, top_k: int = 0, time_limit_s: float | None = None, workers: int = 0,
                ceiling: int | None = None) -> CpSatResult:
    """Optimum (proven, unless ``time_limit_s`` cuts the search) and ``top_k`` runners-up; with a
    ``ceiling``, only layouts whose objective is at most it (none: status INFEASIBLE)."""
    start = time.perf_counter()
    bounds = warm_start(T, top_k + 1)
    cap = bounds[top_k][0] if len(bounds) > top_k else None
    cap = ceiling if cap is None else cap if ceiling is None else min(cap, ceiling)
    model = _capped_model(T, cap, ceiling)
    solver = _solver(model, workers)
    solutions: list[tuple[int, dict]] = []
    status_name, gap, branches = "UNKNOWN", 0.0, 0
    if bounds:
        _hint(model, bounds[0][1])
    for k in range(top_k + 1):
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - start)
            if left <= 0:
                break
            solver.parameters.max_time_in_seconds = left
        status = _solve_below(solver, model, bounds[k][0] if k < len(bounds) else None, k)
        branches += solver.num_branches
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if k == 0:
                status_name = solver.status_name(status)
            break
        value, idx = int(round(solver.objective_value)), model.indices(solver)
        if k == 0:
            status_name, gap = _status_and_gap(solver, status)
            if status == cp_model.OPTIMAL:
                idx, bounds = _with_neighbourhood(T, value, idx, bounds, top_k)
        solutions.append((value, idx))
        if k == 0 and top_k > 0 and len(bounds) > top_k and (cap is None or bounds[top_k][0] < cap):
            cap = bounds[top_k][0]  # the neighbourhood tightened the bound: re-solve on a smaller model
            model = _capped_model(T, cap, ceiling)
        model.m.clear_hints()
        _hint(model, bounds[k + 1][1] if k + 1 < len(bounds) else idx)
        _exclude(model, idx, value)
    if not solutions and status_name != "INFEASIBLE":
        raise SolverError(f"CP-SAT stopped with status {status_name} before finding any layout "
                          f"(time limit {time_limit_s} s); raise --time-limit")
    return CpSatResult(solutions, status_name, gap, time.perf_counter() - start, branches)


def _capped_model(T: Tables, cap: int | None, ceiling: int | None) -> _Model:
    """The model with the rows no answer under ``cap`` can use pruned, and the objective held at or
    below ``ceiling`` (a bound another search already reached)."""
    model = _Model(T, cap=cap)
    if ceiling is not None:
        model.m.add(model.objective <= ceiling)
    return model


def _solver(model: _Model, workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    # One worker: the model is a few dozen element constraints. Probing stays at CP-SAT's default:
    # with it off (level 0, once chosen as costing nothing here), OR-Tools 9.15's search exhausted
    # 21 GB in its main search on DeepSeek-V3 / 72 MI300X (a plan of 100 s where 3 s do; found by
    # benchmarks/fit_bound.py; CPSAT_MAX_MEMORY_MB does not stop that allocation), and the default
    # level costs nothing measurable on benchmarks/search_speed.py's cases.
    solver.parameters.num_workers = workers or 1
    solver.parameters.max_memory_in_mb = CPSAT_MAX_MEMORY_MB
    solver.parameters.linearization_level = 0  # the LP relaxation of the products is weak; skipping it is faster
    # No presolve. It paid for itself on small models (GPT-3 on 1,024 GPUs: 0.19 s with it, 0.35 s
    # without) and not on large ones (DeepSeek-V3 on 2,048 GPUs: 5.5 s with, 3.3 s without), and on
    # some tables it runs for minutes, ignoring the time limit, and exhausts memory (found by
    # benchmarks/fuzz_cli.py: Llama 3 70B on Gaudi 2 with dp fixed to 8, over 160 s against 0.3 s
    # without; Mixtral at 32k tokens with unfused attention, 200 s then std::bad_alloc, in its table
    # compression). A search must not hang on some inputs to save a tenth of a second on others.
    solver.parameters.cp_model_presolve = False
    return solver


def _hint(model: _Model, idx: dict) -> None:
    for key in DIMS:
        model.m.add_hint(model.x[key], idx[key])


def _solve_below(solver: cp_model.CpSolver, model: _Model, bound: int | None, k: int) -> int:
    """Solve for the ``k``-th best with the objective held at or below ``bound`` (the k-th best of
    a sub-space bounds the k-th best of the space), as an assumption; a runner-up lost to it is
    solved again without, defensively."""
    cutoff = None
    if bound is not None:
        cutoff = model.m.new_bool_var(f"cutoff_{k}")
        model.m.add(model.objective <= bound).only_enforce_if(cutoff)
        model.m.add_assumptions([cutoff])
    status = solver.solve(model.m)
    model.m.clear_assumptions()
    if status == cp_model.INFEASIBLE and cutoff is not None and k > 0:
        status = solver.solve(model.m)
    return status


def _status_and_gap(solver: cp_model.CpSolver, status: int) -> tuple[str, float]:
    if status == cp_model.OPTIMAL:
        return solver.status_name(status), 0.0
    value, bound = solver.objective_value, solver.best_objective_bound
    return solver.status_name(status), max(0.0, (value - bound) / value)


def _with_neighbourhood(T: Tables, value: int, idx: dict, bounds: list, top_k: int) -> tuple[dict, list]:
    """The least memory among the layouts tied at the optimum, and the runners-up bounds merged with
    the optimum's neighbours."""
    near = neighbourhood(T, idx, top_k + 1)
    if near and near[0][0] == value:
        idx = near[0][1]
    merged = [min((b for b in (bounds[j] if j < len(bounds) else None, near[j] if j < len(near) else None)
                   if b is not None), key=lambda b: b[0]) for j in range(max(len(bounds), len(near)))]
    return idx, merged


def _exclude(model: _Model, idx: dict, value: int) -> None:
    """Forbid a found layout; the next best is no better than it."""
    model.m.add_forbidden_assignments([model.x[key] for key in DIMS], [tuple(idx[key] for key in DIMS)])
    model.m.add(model.objective >= value)
