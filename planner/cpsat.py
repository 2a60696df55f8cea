"""The CP-SAT model: knob indices as variables, cost terms through element constraints.

Each knob is an integer variable indexing its domain in the :class:`~planner.space.Space`. Group
indices (which (tp, cp) pair, which tensor-parallel communicator) are element look-ups on the
factorization and order; each cost term is an element look-up on its own small table
(``planner.tables``). Products that the decomposition cannot avoid (micro-batch slots times
per-micro-batch time, in-flight layers times activation bytes) are multiplication equalities.
Structural rules enter as allowed-assignment tables on the knobs they concern, memory fit as two
linear inequalities. Runners-up come from re-solving with the previous optima forbidden.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from models.errors import SolverError
from planner.exhaustive import DIMS
from planner.tables import SLOT_QUANTUM, Tables


@dataclass
class CpSatResult:
    solutions: list[tuple[int, dict]]  # (objective, knob indices), best first
    status: str
    gap: float  # relative gap of the best solution (0 when proven optimal)
    wall_s: float
    num_branches: int


def _flat(table: np.ndarray) -> list[int]:
    return [int(x) for x in table.ravel()]


def _index_expr(vars_: list, shape: tuple[int, ...]):
    """Row-major flat index of a table of ``shape`` from one variable (or constant) per axis."""
    expr, stride = 0, 1
    for var, size in zip(reversed(vars_), reversed(shape)):
        expr = expr + var * stride if not isinstance(var, int) else expr + var * stride
        stride *= size
    return expr


class _Model:
    """Builds the CP-SAT model once; ``solve`` can be called repeatedly with exclusions."""

    def __init__(self, T: Tables, objective: str = "time"):
        self.T = T
        m = self.m = cp_model.CpModel()
        S = T.space
        sizes = {"f": len(S.factorizations), "o": len(S.order), "e": len(S.ep), "v": len(S.vp),
                 "mb": len(S.micro_batch_size), "s": len(S.sequence_parallel), "r": len(S.recompute),
                 "z": len(S.zero_stage), "do": len(S.dp_overlap), "to": len(S.tp_overlap)}
        self.x = {k: m.new_int_var(0, n - 1, k) for k, n in sizes.items()}
        self._structure()
        self._objective()

    def _lookup(self, name: str, table: np.ndarray, axes: list):
        """``target = table[axes...]`` as an element constraint; returns the target variable."""
        values = _flat(table)
        target = self.m.new_int_var(min(values), max(values), name)
        self.m.add_element(_index_expr(axes, table.shape), values, target)
        return target

    def _product(self, name: str, a, b, lo: int, hi: int):
        target = self.m.new_int_var(lo, hi, name)
        self.m.add_multiplication_equality(target, [a, b])
        return target

    def _structure(self) -> None:
        T, x, m = self.T, self.x, self.m
        self.tc = self._lookup("tc", T.tc_of_f, [x["f"]])
        self.tpg = self._lookup("tpg", T.tpg_of_fo, [x["f"], x["o"]])
        self.cpg = self._lookup("cpg", T.cpg_of_fo, [x["f"], x["o"]])
        self.epg = self._lookup("epg", T.epg_of_foe, [x["f"], x["o"], x["e"]])
        m.add_allowed_assignments([x["f"]], [(int(i),) for i in np.flatnonzero(T.ok_f < 0)])
        m.add_allowed_assignments([x["f"], x["mb"], x["v"]], [tuple(map(int, t)) for t in np.argwhere(T.ok_fmbv < 0)])
        m.add_allowed_assignments([x["f"], x["e"]], [tuple(map(int, t)) for t in np.argwhere(T.ok_fe < 0)])
        m.add_allowed_assignments([x["e"], x["o"]], [tuple(map(int, t)) for t in np.argwhere(T.ok_eo < 0)])
        canon_vars = [x["f"], x["e"], x["s"], x["z"], x["o"], x["do"], x["to"]]
        m.add_allowed_assignments(canon_vars, [tuple(map(int, t)) for t in np.argwhere(T.canon)])
        self._memory()

    def _memory(self) -> None:
        T, x = self.T, self.x
        static = self._lookup("static", T.STATIC, [x["f"], x["v"], x["e"], x["z"]])
        act = self._lookup("act", T.ACT, [self.tc, x["mb"], x["s"], x["r"]])
        trans = self._lookup("trans", T.TRANS, [self.tc, x["mb"], x["s"], x["r"]])
        logits = self._lookup("logits", T.LOGITS, [self.tc, x["mb"]])
        if1 = self._lookup("if1", T.IF1, [x["f"], x["mb"], x["v"]])
        if2 = self._lookup("if2", T.IF2, [x["f"], x["mb"], x["v"]])
        hi = int(T.ACT.max()) * int(max(T.IF1.max(), T.IF2.max(), 1))
        a1 = self._product("act_first", act, if1, 0, hi)
        a2 = self._product("act_last", act, if2, 0, hi)
        self.m.add(static + a1 + trans <= T.capacity)
        self.m.add(static + a2 + trans + logits <= T.capacity)

    def _objective(self) -> None:
        T, x, m, Q = self.T, self.x, self.m, SLOT_QUANTUM
        axes4 = [self.tc, x["mb"], x["s"], x["r"]]
        c = self._lookup("compute", T.C, axes4)
        bwd = self._lookup("backward", T.BWD, axes4)
        tpc = self._lookup("tp_comm", T.TPC, [self.tpg, x["mb"], x["s"], x["r"], x["to"]])
        cpc = self._lookup("cp_comm", T.CPC, [self.cpg, x["mb"], x["s"]])
        epc = self._lookup("ep_comm", T.EPC, [self.epg, x["mb"], x["s"], x["r"]])
        layer_hi = int(T.C.max() + T.TPC.max() + T.CPC.max() + T.EPC.max())
        layer = m.new_int_var(0, layer_hi, "layer_time")
        m.add(layer == c + tpc + cpc + epc)
        u = self._lookup("slots", T.U, [x["f"], x["mb"], x["v"]])
        frac = self._lookup("frac", T.FRAC, [x["f"], x["v"]])
        mb_count = self._lookup("microbatches", T.M, [x["f"], x["mb"]])
        head = self._lookup("head", T.H, [self.tpg, x["mb"], x["s"]])
        p2p = self._lookup("p2p", T.P2P, [x["f"], x["o"], x["mb"]])
        per_mb = m.new_int_var(0, int(T.H.max() + T.P2P.max()), "per_mb")
        m.add(per_mb == head + p2p)
        pipe = self._product("pipeline", u, layer, 0, int(T.U.max()) * layer_hi)
        extra = self._product("head_p2p", mb_count, per_mb, 0, int(T.M.max()) * int(T.H.max() + T.P2P.max()))
        dp_exp = self._exposed("dp", T.DPS, T.DPSB, frac, bwd, T.BWD)
        fsdp_mb = self._exposed("fsdp", T.DPM, T.DPMB, frac, c, T.C)
        fsdp = self._product("fsdp_total", mb_count, fsdp_mb, 0, int(T.M.max()) * int(T.DPM.max()) * Q)
        opt = self._lookup("optimizer", T.OPT, [x["f"], x["v"], x["e"], x["z"]])
        self.objective = pipe + Q * extra + dp_exp + fsdp + Q * opt
        m.minimize(self.objective)

    def _exposed(self, name: str, full: np.ndarray, last: np.ndarray, frac, window_base, window_table):
        """``exposed >= max(last bucket, traffic - overlap window)`` or the whole traffic without overlap."""
        T, x, m, Q = self.T, self.x, self.m, SLOT_QUANTUM
        axes = [x["f"], x["o"], x["v"], x["e"], x["z"]]
        traffic = self._lookup(f"{name}_traffic", full, axes)
        bucket = self._lookup(f"{name}_bucket", last, axes)
        hi_window = int(T.FRAC.max()) * int(window_table.max())
        window = self._product(f"{name}_window", frac, window_base, 0, hi_window)
        big = int(full.max()) * Q + hi_window + 1
        overlap = self._lookup(f"{name}_overlap_on", np.array(T.space.dp_overlap, dtype=np.int64), [x["do"]])
        exposed = m.new_int_var(0, int(full.max()) * Q, f"{name}_exposed")
        m.add(exposed >= Q * bucket)
        m.add(exposed >= Q * traffic - window)
        m.add(exposed >= Q * traffic - big * overlap)
        return exposed


def solve_cpsat(T: Tables, top_k: int = 0, time_limit_s: float | None = None, workers: int = 0) -> CpSatResult:
    """Optimum (proven, unless ``time_limit_s`` cuts the search) and ``top_k`` runners-up."""
    model = _Model(T)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers or 2
    start = time.perf_counter()
    solutions: list[tuple[int, dict]] = []
    status_name, gap, branches = "UNKNOWN", 0.0, 0
    keys = list(DIMS)
    for k in range(top_k + 1):
        if time_limit_s is not None:
            solver.parameters.max_time_in_seconds = max(0.05, time_limit_s - (time.perf_counter() - start))
        status = solver.solve(model.m)
        branches += solver.num_branches
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if k == 0:
                status_name = solver.status_name(status)
            break
        value = int(round(solver.objective_value))
        idx = {key: int(solver.value(model.x[key])) for key in keys}
        solutions.append((value, idx))
        if k == 0:
            status_name = solver.status_name(status)
            bound = solver.best_objective_bound
            gap = 0.0 if status == cp_model.OPTIMAL else max(0.0, (value - bound) / max(1, value))
        model.m.add_forbidden_assignments([model.x[key] for key in keys], [tuple(idx[key] for key in keys)])
    wall = time.perf_counter() - start
    if not solutions and status_name not in ("INFEASIBLE",):
        raise SolverError(f"CP-SAT stopped with status {status_name} before finding any layout "
                          f"(time limit {time_limit_s} s); raise --time-limit")
    return CpSatResult(solutions, status_name, gap, wall, branches)
