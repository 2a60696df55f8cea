"""Measure, on one real GPU, the device constants the cost model assumes.

Run on a machine with one NVIDIA GPU and PyTorch (not needed to build or test the project)::

    python benchmarks/gpu_probe.py --out probe.json            # about 3 minutes on an H100

It prints a line per figure and writes them all as JSON. Each section is independent; a section
that fails records its error and the others still run. What it measures, and which constant in
``topologies/data/devices.yaml`` each figure checks:

- ``mamf``: maximum achievable matmul FLOP/s over a sweep of large GEMM shapes, bf16 and fp8
  (``gemm.large``, ``gemm.large_fp8``), the method of ml-engineering's ``mamf-finder.py``: the best
  of many shapes, random data, each shape timed after warm-up.
- ``sustained``: the best shape run back to back for ``--sustain-s`` seconds, TFLOP/s per window
  with the SM clock and power read from nvidia-smi: the power-saturated fraction
  (``sustained_fraction``; ml-engineering's MSMF vs MAMF).
- ``attention``: fused causal attention fwd and fwd+bwd through PyTorch's SDPA with the
  FlashAttention-2 and the cuDNN backends (``attention_efficiency_fa2``, ``attention_efficiency``).
- ``memory_bandwidth``: copy and triad through PyTorch (``memory_efficiency``).
- ``launch``: the per-kernel cost of an eager PyTorch op too small to be GPU-bound
  (``kernel_overhead_s``).
- ``layers``: a decoder stack (Llama-style and GPT-style layers) trained fwd+bwd in eager PyTorch,
  bf16, with its time per layer and its activation memory per layer, to compare with what
  ``clusterplan evaluate`` predicts for the same shapes (``benchmarks/compare_probe.py``).
- ``loss``: bytes per logit held by torchtitan's loss at its peak, eager and compiled
  (``semantics.logit_bytes`` of the torchtitan profile).
- ``small_run``: a Llama-style model of 1.5 B parameters trained under FSDP2 on one rank as torchtitan
  builds it (no AC, per-op SAC, full AC; per-op SAC compiled): peak allocated and reserved memory,
  to compare with ``clusterplan evaluate`` for the same job on one device.
- ``moe``: a token-choice MoE MLP on one rank (router, top-k, permute, grouped SwiGLU GEMMs,
  weighted un-permute), fwd+bwd time and activation memory, to compare with ``models.ops.moe_ops``
  and ``cost.terms.moe_mlp_activation_bytes`` (``benchmarks/compare_probe.py``).
- ``overlap``: what an overlapped collective costs the compute it hides behind. A kernel of N thread
  blocks (N = 4, 8, 16, 32; one NCCL channel is one block of 512 threads) runs on a second stream
  for the whole time a loop of bf16 GEMMs runs on the first: a ``copy`` kernel that streams memory
  as a channel does, and a ``spin`` kernel that only holds its SMs. The GEMMs' slowdown (median of
  three), against ``cost.terms.overlap_share``. ``overlap_more``: a GEMM of few waves and causal
  attention; ``overlap_waves``: GEMMs of 3 to 54 waves and one fp8 GEMM. One GPU: no link traffic,
  only the SM and memory contention.
- ``sustained_fp8``: the ``sustained`` run with an FP8 GEMM (``sustained_fraction_fp8``).
- ``fp8_linear``: Llama 3 8B's four linear layers at 8192 tokens in FP8 as Transformer Engine runs
  them: a one-pass Triton cast-transpose of the input and of the output gradient (the fastest of a
  few tile shapes), the three tensorwise-scaled GEMMs, a rowwise-scaled forward GEMM beside them, and
  the GEMM chain run back to back (``cost.compute.fp8_cast_s``, ``CAST_TRANSPOSE_RATE_SHARE``).
- ``sustained_layer``: Llama 3 8B decoder layers trained back to back: a real layer's mix under
  the power limit, against the GEMM-only ``sustained`` figure.
- ``expert_gemms``: MoE expert GEMMs at Megatron-Bridge's per-rank shapes, launched one per expert
  over four streams (Transformer Engine's grouped GEMM until 2026), in sequence, grouped, and as one
  GEMM (``models.ops.moe_ops``).
- ``tp_shard_unfused``: one tensor-parallel rank of a 2022 Megatron-DeepSpeed GPT layer (unfused
  attention as batched GEMMs, fp16, dropout 0.1) at BigScience's head sizes 225, 224, 216 and 108
  and micro-batches 1 to 8, and the attention's batched GEMMs alone at head sizes 216-225, 128 and
  120 (``unaligned_gemm_fraction``: a GEMM whose K or N is not a multiple of 8 elements).
- ``zero3_list_copies``: the per-partition copies DeepSpeed ZeRO-3 made around each module's
  all-gather before v0.5.6, at GPT-3 175B's module sizes and 384-1536 ranks (host time per copy).
- ``allocator``: a short AdamW training loop (fp32 master weights, bf16 autocast): peak allocated
  vs peak reserved bytes of PyTorch's caching allocator.
- ``wgrad_accum``: weight-gradient GEMMs (``dW = X^T dY``, K = the tokens) written three ways: a
  fresh bf16 output; accumulated into an fp32 buffer by the GEMM itself where PyTorch offers it
  (``out_dtype`` on ``addmm``: beta 1, as Megatron's ``--gradient-accumulation-fusion`` and Transformer
  Engine's ``fuse_wgrad_accumulation`` write ``main_grad``); and a bf16 GEMM then a separate add into
  the fp32 buffer (``main_grad.add_(grad)``, Megatron before the fusion). Not priced yet: the model
  charges every GEMM output 2 bytes an element (``cost.compute._epilogue_s``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

RESULTS: dict = {}


def log(*args) -> None:
    print(*args, flush=True)


def timed(fn, iters: int, warmup: int = 3) -> float:
    """Mean seconds per call, CUDA events around ``iters`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def smi() -> dict:
    q = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        vals = [v.strip() for v in out.split(",")]
        return dict(zip(q.split(","), vals))
    except Exception as exc:  # noqa: BLE001 - a probe reports what it can
        return {"error": repr(exc)}


def section(name):
    def wrap(fn):
        def run(*a, **kw):
            t0 = time.time()
            try:
                RESULTS[name] = fn(*a, **kw)
            except Exception:  # noqa: BLE001
                RESULTS[name] = {"error": traceback.format_exc(limit=3)}
                log(f"[{name}] FAILED\n{RESULTS[name]['error']}")
            RESULTS.setdefault("section_wall_s", {})[name] = round(time.time() - t0, 1)
            return RESULTS[name]
        return run
    return wrap


def gemm_fn(m, n, k, dtype):
    if dtype == "fp8":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return lambda: a @ b


@section("mamf")
def mamf(quick: bool):
    ms = [4096, 6144, 8192, 16384]
    ns = [4096, 8192, 14336, 17920, 28672]
    ks = [2048, 2816, 4096, 8192]
    if quick:
        ms, ns, ks = [4096], [4096], [4096]
    out = {}
    for dtype in ("bf16", "fp8"):
        rows = []
        for m in ms:
            for n in ns:
                for k in ks:
                    fn = gemm_fn(m, n, k, dtype)
                    t = timed(fn, iters=10, warmup=2)
                    rows.append((2 * m * n * k / t / 1e12, m, n, k))
                    del fn
        rows.sort(reverse=True)
        fixed = gemm_fn(6144, 17920, 2816, dtype)  # ml-engineering's H100 MAMF shape
        t_fixed = timed(fixed, iters=20)
        out[dtype] = {"best_tflops": round(rows[0][0], 1), "best_shape": rows[0][1:],
                      "median_tflops": round(sorted(r[0] for r in rows)[len(rows) // 2], 1),
                      "mleng_shape_tflops": round(2 * 6144 * 17920 * 2816 / t_fixed / 1e12, 1),
                      "top5": [(round(r[0], 1),) + r[1:] for r in rows[:5]], "shapes": len(rows),
                      "rows": [(round(r[0], 1),) + r[1:] for r in rows]}
        log(f"[mamf] {dtype}: best {out[dtype]['best_tflops']} TFLOP/s at {rows[0][1:]}, "
            f"median {out[dtype]['median_tflops']}, mleng shape {out[dtype]['mleng_shape_tflops']}")
        torch.cuda.empty_cache()
    # alignment: a dimension that is not a multiple of 64 (BLOOM-style head and hidden sizes)
    align = {}
    for k in (4096, 4104, 4160, 13824, 13832):
        fn = gemm_fn(8192, 8192, k, "bf16")
        align[k] = round(2 * 8192 * 8192 * k / timed(fn, 10) / 1e12, 1)
    out["alignment_k_tflops"] = align
    log(f"[mamf] bf16 8192x8192xK by K: {align}")
    return out


def _sustain(name: str, fn, flops: float, seconds: float, iters: int) -> dict:
    """Run ``fn`` back to back for ``seconds`` in windows of ``iters`` calls: TFLOP/s per window with
    the SM clock and board power read after it; steady = median of the second half of the windows."""
    windows = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        t = timed(fn, iters=iters, warmup=0)
        windows.append({"tflops": round(flops / t / 1e12, 1), **smi()})
    first = windows[0]["tflops"]
    tail = sorted(w["tflops"] for w in windows[len(windows) // 2:])
    res = {"windows": windows, "first_tflops": first, "steady_tflops": tail[len(tail) // 2],
           "steady_over_first": round(tail[len(tail) // 2] / first, 3)}
    log(f"[{name}] first {first}, steady {res['steady_tflops']} TFLOP/s over {len(windows)} windows; "
        f"last {windows[-1]}")
    return res


@section("sustained")
def sustained(seconds: float):
    m, n, k = 8192, 8192, 8192
    return {"shape": [m, n, k], **_sustain("sustained", gemm_fn(m, n, k, "bf16"), 2 * m * n * k, seconds, 200)}


@section("sustained_fp8")
def sustained_fp8(seconds: float):
    """The same power-saturated run with an FP8 GEMM (tensorwise scales, bf16 output): whether FP8
    keeps the bf16 sustained fraction of its burst rate, which ``sustained_fraction`` assumes."""
    m, n, k = 8192, 8192, 8192
    return {"shape": [m, n, k], **_sustain("sustained_fp8", gemm_fn(m, n, k, "fp8"), 2 * m * n * k, seconds, 300)}


@section("attention")
def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    tokens = 16384
    out = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for seq in (2048, 4096, 8192):
            for d, heads in ((128, 32), (64, 32)):
                b = tokens // seq
                q, k_, v = (torch.randn(b, heads, seq, d, device="cuda", dtype=torch.bfloat16,
                                        requires_grad=True) for _ in range(3))
                fwd_flops = 4 * b * heads * seq * seq * d / 2  # causal: half the scores
                try:
                    with sdpa_kernel(backend):
                        f = lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True)
                        t_f = timed(f, 10)
                        o = f()
                        g = torch.randn_like(o)

                        def fb():
                            y = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
                            y.backward(g)
                        t_fb = timed(fb, 10)
                    row = {"backend": backend.name, "seq": seq, "head_dim": d, "heads": heads, "batch": b,
                           "fwd_tflops": round(fwd_flops / t_f / 1e12, 1),
                           "fwd_bwd_tflops": round(3.5 * fwd_flops / t_fb / 1e12, 1),
                           "bwd_tflops": round(2.5 * fwd_flops / max(t_fb - t_f, 1e-9) / 1e12, 1)}
                except Exception as exc:  # noqa: BLE001
                    row = {"backend": backend.name, "seq": seq, "head_dim": d, "error": repr(exc)[:200]}
                out.append(row)
                log(f"[attention] {row}")
                del q, k_, v
    return out


@section("memory_bandwidth")
def memory_bandwidth():
    n = 1 << 28  # 268M bf16 elements = 512 MiB per tensor
    x, y, z = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    t_copy = timed(lambda: x.copy_(y), 20)
    t_triad = timed(lambda: torch.add(y, z, alpha=2.0, out=x), 20)
    res = {"copy_bytes_per_s": 2 * 2 * n / t_copy, "triad_bytes_per_s": 3 * 2 * n / t_triad}
    log(f"[memory_bandwidth] copy {res['copy_bytes_per_s'] / 1e12:.2f} TB/s, triad {res['triad_bytes_per_s'] / 1e12:.2f} TB/s")
    return res


@section("launch")
def launch():
    x = torch.ones(1024, device="cuda")
    w = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
    v = torch.ones(16, 1024, device="cuda", dtype=torch.bfloat16)
    res = {"add_s": timed(lambda: x.add_(1.0), 5000, 50),
           "small_matmul_s": timed(lambda: v @ w, 5000, 50),
           "layer_norm_s": timed(lambda: F.layer_norm(v, (1024,)), 5000, 50)}
    log(f"[launch] per eager op (CPU-bound): " + ", ".join(f"{k} {v_ * 1e6:.1f} us" for k, v_ in res.items()))
    return res


class Layer(torch.nn.Module):
    """One decoder layer: pre-norm attention and MLP, as Megatron/torchtitan compute it (no dropout)."""

    def __init__(self, hidden, heads, kv_heads, ffn, style):
        super().__init__()
        self.h, self.heads, self.kv, self.d, self.style = hidden, heads, kv_heads, hidden // heads, style
        bias = style == "gpt"
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.d, bias=bias)
        self.proj = torch.nn.Linear(hidden, hidden, bias=bias)
        if style == "llama":
            self.up = torch.nn.Linear(hidden, 2 * ffn, bias=False)  # gate and up fused
        else:
            self.up = torch.nn.Linear(hidden, ffn, bias=True)
        self.down = torch.nn.Linear(ffn, hidden, bias=bias)
        self.n1 = torch.nn.RMSNorm(hidden) if style == "llama" else torch.nn.LayerNorm(hidden)
        self.n2 = torch.nn.RMSNorm(hidden) if style == "llama" else torch.nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.heads * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv, self.d).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        if self.kv != self.heads:  # repeat the shared K/V heads, as torchtitan's repeat_kv does
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.h))
        u = self.up(self.n2(x))
        if self.style == "llama":
            g, u = u.chunk(2, -1)
            u = F.silu(g) * u
        else:
            u = F.gelu(u)
        return x + self.down(u)


LAYER_CASES = [
    # name, hidden, heads, kv_heads, ffn, style, seq, micro_batch, layers
    ("llama3-8b-layer-s8192-mb1", 4096, 32, 8, 14336, "llama", 8192, 1, 4),
    ("llama3-8b-layer-s4096-mb2", 4096, 32, 8, 14336, "llama", 4096, 2, 4),
    ("gpt-h6144-s2048-mb4", 6144, 48, 48, 24576, "gpt", 2048, 4, 4),
    ("gpt-h2048-s2048-mb8", 2048, 16, 16, 8192, "gpt", 2048, 8, 8),
    # small shapes, where per-kernel overheads are a visible share (cost.compute kernel_overhead_s)
    ("gpt-h1024-s2048-mb1", 1024, 16, 16, 4096, "gpt", 2048, 1, 8),
    ("llama-h2048-s2048-mb1", 2048, 16, 8, 5632, "llama", 2048, 1, 8),
    ("gpt-h4096-s2048-mb1", 4096, 32, 32, 16384, "gpt", 2048, 1, 8),
]


@section("layers")
def layers():
    out = []
    for name, hidden, heads, kv, ffn, style, seq, mb, n in LAYER_CASES:
        torch.cuda.empty_cache()
        stack = torch.nn.Sequential(*[Layer(hidden, heads, kv, ffn, style) for _ in range(n)]).cuda().bfloat16()
        x = torch.randn(mb, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn_like(x)

        def step():
            stack(x).backward(g)

        t = timed(step, 5, warmup=2)
        t_fwd = timed(lambda: stack(x).detach(), 5, warmup=1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = stack(x)
        act = torch.cuda.memory_allocated() - base
        y.backward(g)
        del y
        params = sum(p.numel() for p in stack.parameters())
        tokens = mb * seq
        d = hidden // heads
        gemm_flops = 2 * tokens * params  # weights only (biases and norms are negligible)
        attn_flops = 4 * mb * heads * seq * seq * d / 2  # causal half, per layer, forward
        flops = 3 * gemm_flops + 3.5 * attn_flops * n
        row = {"case": name, "hidden": hidden, "heads": heads, "kv_heads": kv, "ffn": ffn, "style": style,
               "seq": seq, "micro_batch": mb, "layers": n, "fwd_bwd_s_per_layer": t / n,
               "fwd_s_per_layer": t_fwd / n, "activation_bytes_per_layer": act / n,
               "achieved_tflops": round(flops / t / 1e12, 1)}
        out.append(row)
        log(f"[layers] {name}: fwd+bwd {t / n * 1e3:.2f} ms/layer, fwd {t_fwd / n * 1e3:.2f} ms/layer, "
            f"activations {act / n / 2**20:.0f} MiB/layer, {row['achieved_tflops']} TFLOP/s (causal count)")
        del stack, x, g
    return out


class TPShard(torch.nn.Module):
    """One tensor-parallel rank's share of a GPT layer (Megatron's column/row-parallel split, no
    communication): QKV and fc1 output hidden/tp columns, proj and fc2 take them back to hidden."""

    def __init__(self, hidden, heads, tp):
        super().__init__()
        self.hl, self.heads, self.d = hidden // tp, heads // tp, hidden // heads
        self.n1, self.n2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * self.hl)
        self.proj = torch.nn.Linear(self.hl, hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden // tp)
        self.down = torch.nn.Linear(4 * hidden // tp, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, self.d).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.hl))
        return x + self.down(F.gelu(self.up(self.n2(x))))


def _stack_s(layer, n: int, mb: int, seq: int, hidden: int, dtype, iters: int, fwd_too: bool = False):
    """Mean seconds of forward+backward (and of the forward alone, with ``fwd_too``) of ``n`` layers
    built by ``layer()`` on a micro-batch of ``mb`` sequences of ``seq`` tokens."""
    torch.cuda.empty_cache()
    stack = torch.nn.Sequential(*[layer() for _ in range(n)]).cuda().to(dtype)
    x = torch.randn(mb, seq, hidden, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn_like(x)
    t = timed(lambda: stack(x).backward(g), iters, warmup=2)
    return t, (timed(lambda: stack(x).detach(), iters, warmup=1) if fwd_too else None)


@section("tp_shard")
def tp_shard():
    """Time per token of one TP rank's layer against the micro-batch size: BigScience's 2022 layout
    trials (h 13824, 64 heads, tp 8, 2048 tokens) found larger micro-batches several % faster."""
    out = []
    for hidden, heads, tp in ((13824, 64, 8), (14336, 64, 8)):
        for mb in (1, 2, 4, 8):
            seq, n = 2048, 4
            t, _ = _stack_s(lambda: TPShard(hidden, heads, tp), n, mb, seq, hidden, torch.bfloat16, 6)
            row = {"hidden": hidden, "heads": heads, "tp": tp, "seq": seq, "micro_batch": mb, "layers": n,
                   "fwd_bwd_s_per_layer": t / n, "s_per_token_per_layer": t / n / (mb * seq)}
            out.append(row)
            log(f"[tp_shard] h{hidden} nh{heads} tp{tp} mbs{mb}: fwd+bwd {t / n * 1e3:.2f} ms/layer, "
                f"{t / n / (mb * seq) * 1e9:.1f} ns/token")
    return out


class UnfusedTPShard(TPShard):
    """One tensor-parallel rank's GPT layer as 2022 Megatron-DeepSpeed ran it (BigScience's layout
    trials): attention unfused (baddbmm of Q and K into a scores buffer, a masked softmax, dropout,
    bmm with V), LayerNorm, bias-GELU and dropout 0.1, fp16. The fused scale-mask-softmax kernel is
    not built here: the causal mask, scale and softmax run as PyTorch ops (an upper bound on that
    part; the GEMMs, whose inner dimension is the head size, are what the case isolates)."""

    def __init__(self, hidden, heads, tp, dropout=0.1):
        super().__init__(hidden, heads, tp)
        self.p = dropout

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, self.d).unbind(2)
        q = q.permute(0, 2, 1, 3).reshape(b * self.heads, s, self.d)
        k = k.permute(0, 2, 3, 1).reshape(b * self.heads, self.d, s)
        v = v.permute(0, 2, 1, 3).reshape(b * self.heads, s, self.d)
        scores = torch.baddbmm(torch.empty(b * self.heads, s, s, device=x.device, dtype=x.dtype), q, k,
                               beta=0.0, alpha=1.0 / math.sqrt(self.d))
        mask = torch.ones(s, s, device=x.device, dtype=torch.bool).triu_(1)
        probs = F.dropout(torch.softmax(scores.masked_fill(mask, -10000.0), -1), self.p, True)
        a = torch.bmm(probs, v).view(b, self.heads, s, self.d).permute(0, 2, 1, 3).reshape(b, s, self.hl)
        x = x + F.dropout(self.proj(a), self.p, True)
        return x + F.dropout(self.down(F.gelu(self.up(self.n2(x)))), self.p, True)


TP_SHARD_UNFUSED = [  # hidden, heads, tp, micro-batches: BigScience 2022-02 trials (head size 225, 224, 216, 108)
    (14400, 64, 8, (1, 2, 4, 8)), (14336, 64, 8, (1, 2, 4, 8)), (13824, 64, 8, (1, 2, 4, 8)),
    (13824, 128, 8, (2, 4)), (14336, 64, 4, (1, 2, 4)), (13824, 64, 4, (1, 2, 4)),
]


@section("tp_shard_unfused")
def tp_shard_unfused():
    """Time per token of one TP rank's 2022 Megatron-DeepSpeed layer (unfused attention, fp16)
    against the micro-batch size and the head size, and the attention GEMMs alone at head sizes 224
    and 225 (16-byte alignment: tensor-core kernels want the inner dimension a multiple of 8)."""
    out = {"layers": [], "bmm": []}
    for hidden, heads, tp, mbs in TP_SHARD_UNFUSED:
        for mb in mbs:
            seq, n = 2048, 2
            t, t_f = _stack_s(lambda: UnfusedTPShard(hidden, heads, tp), n, mb, seq, hidden, torch.half, 5, fwd_too=True)
            row = {"hidden": hidden, "heads": heads, "tp": tp, "head_dim": hidden // heads, "seq": seq,
                   "micro_batch": mb, "layers": n, "fwd_bwd_s_per_layer": t / n, "fwd_s_per_layer": t_f / n,
                   "s_per_token_per_layer": t / n / (mb * seq)}
            out["layers"].append(row)
            log(f"[tp_shard_unfused] h{hidden} nh{heads} d{hidden // heads} tp{tp} mbs{mb}: fwd+bwd "
                f"{t / n * 1e3:.2f} ms/layer, {t / n / (mb * seq) * 1e9:.1f} ns/token")
    for d in (216, 224, 225, 128, 120):
        for batch in (8, 32):
            q = torch.randn(batch, 2048, d, device="cuda", dtype=torch.half)
            kt = torch.randn(batch, d, 2048, device="cuda", dtype=torch.half)
            p_ = torch.randn(batch, 2048, 2048, device="cuda", dtype=torch.half)
            v = torch.randn(batch, 2048, d, device="cuda", dtype=torch.half)
            flops = 2 * batch * 2048 * 2048 * d
            t_qk, t_pv = timed(lambda: torch.bmm(q, kt), 20), timed(lambda: torch.bmm(p_, v), 20)
            row = {"head_dim": d, "batch": batch, "qk_tflops": round(flops / t_qk / 1e12, 1),
                   "pv_tflops": round(flops / t_pv / 1e12, 1)}
            out["bmm"].append(row)
            log(f"[tp_shard_unfused] bmm {row}")
            del q, kt, p_, v
    return out


@section("allocator")
def allocator():
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    hidden, heads, kv, ffn, seq, mb, n = 4096, 32, 8, 14336, 4096, 1, 8
    stack = torch.nn.Sequential(*[Layer(hidden, heads, kv, ffn, "llama") for _ in range(n)]).cuda()
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-5, fused=True)
    x = torch.randn(mb, seq, hidden, device="cuda")
    for _ in range(4):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = stack(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    params = sum(p.numel() for p in stack.parameters())
    st = torch.cuda.memory_stats()
    res = {"params": params, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
           "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
           "weights_grads_adam_bytes": params * 16,
           "num_alloc_retries": st.get("num_alloc_retries", 0)}
    res["reserved_over_allocated"] = round(res["peak_reserved_bytes"] / res["peak_allocated_bytes"], 4)
    free, total = torch.cuda.mem_get_info()
    res["context_bytes"] = total - free - torch.cuda.memory_reserved()
    log(f"[allocator] {json.dumps(res)}")
    return res


class TitanBlock(torch.nn.Module):
    """torchtitan's Llama 3 TransformerBlock as its model.py writes it (v0.2.2): separate wq/wk/wv,
    rotary embedding through fp32 complex views, ``repeat_kv`` (or SDPA's ``enable_gqa``, torchtitan
    since 2026-01), ``transpose(1, 2).contiguous()`` before wo, ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden, heads, kv_heads, ffn, gqa_native):
        super().__init__()
        self.h, self.heads, self.kv, self.d, self.gqa_native = hidden, heads, kv_heads, hidden // heads, gqa_native
        self.wq = torch.nn.Linear(hidden, heads * self.d, bias=False)
        self.wk = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.wv = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.wo = torch.nn.Linear(heads * self.d, hidden, bias=False)
        self.w1 = torch.nn.Linear(hidden, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, hidden, bias=False)
        self.w3 = torch.nn.Linear(hidden, ffn, bias=False)
        self.attention_norm = torch.nn.RMSNorm(hidden)
        self.ffn_norm = torch.nn.RMSNorm(hidden)

    def rope(self, x, freqs):
        x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(x_ * freqs).flatten(3).type_as(x)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        y = self.attention_norm(x)
        xq = self.wq(y).view(b, s, self.heads, self.d)
        xk = self.wk(y).view(b, s, self.kv, self.d)
        xv = self.wv(y).view(b, s, self.kv, self.d)
        xq, xk = self.rope(xq, freqs), self.rope(xk, freqs)
        if not self.gqa_native and self.kv != self.heads:
            rep = self.heads // self.kv
            xk = xk[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
            xv = xv[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                           is_causal=True, enable_gqa=self.gqa_native and self.kv != self.heads)
        x = x + self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def _op_sac_context():
    """torchtitan's per-op SAC policy (distributed/activation_checkpoint.py, llama3 _op_sac_save_list)."""
    from collections import defaultdict
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    ops = torch.ops.aten
    save = {ops.mm.default, ops._scaled_dot_product_efficient_attention.default,
            ops._scaled_dot_product_flash_attention.default, ops._scaled_dot_product_cudnn_attention.default,
            ops.max.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
        if func == ops.mm.default:
            meta[key] += 1
        keep = func in save and not (func == ops.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


class Wrapped(torch.nn.Module):
    def __init__(self, block, mode):
        super().__init__()
        self.block, self.mode = block, mode

    def forward(self, x, freqs):
        from torch.utils.checkpoint import checkpoint
        if self.mode == "full":
            return checkpoint(self.block, x, freqs, use_reentrant=False)
        if self.mode == "op_sac":
            return checkpoint(self.block, x, freqs, use_reentrant=False, context_fn=_op_sac_context)
        return self.block(x, freqs)


@section("titan_layers")
def titan_layers(compile_too: bool):
    hidden, heads, kv, ffn, seq, mb, n = 4096, 32, 8, 14336, 8192, 1, 4
    d = hidden // heads
    freqs = torch.polar(torch.ones(seq, d // 2, device="cuda"),
                        torch.outer(torch.arange(seq, device="cuda").float(),
                                    1.0 / (500000 ** (torch.arange(0, d, 2, device="cuda").float() / d))))
    freqs = freqs.view(1, seq, 1, d // 2)
    out = []
    cases = [(g, m, False) for g in (False, True) for m in ("none", "op_sac", "full")]
    if compile_too:
        cases += [(False, "none", True), (False, "op_sac", True)]
    for gqa_native, mode, compiled in cases:
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        blocks = [Wrapped(TitanBlock(hidden, heads, kv, ffn, gqa_native), mode).cuda().bfloat16() for _ in range(n)]
        if compiled:
            blocks = [torch.compile(b) for b in blocks]
        x = torch.randn(mb, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn_like(x)

        def run(keep=False):
            y = x
            for b in blocks:
                y = b(y, freqs)
            if keep:
                return y
            y.backward(g)

        t0 = time.time()
        t = timed(run, 4, warmup=2)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = run(keep=True)
        act = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
        y.backward(g)
        peak = torch.cuda.max_memory_allocated() - base
        del y
        row = {"gqa_native": gqa_native, "ac": mode, "compiled": compiled, "seq": seq, "micro_batch": mb,
               "layers": n, "activation_bytes_per_layer": act / n, "peak_over_base_bytes": peak,
               "fwd_bwd_s_per_layer": t / n, "wall_s": round(time.time() - t0, 1)}
        out.append(row)
        log(f"[titan_layers] gqa_native={gqa_native} ac={mode} compiled={compiled}: "
            f"{act / n / 2**20:.0f} MiB/layer kept, fwd+bwd {t / n * 1e3:.2f} ms/layer, "
            f"peak over base {peak / 2**30:.2f} GiB ({row['wall_s']} s)")
        del blocks, x, g
    return out


@section("loss")
def loss_memory():
    """Bytes per logit held by torchtitan's loss, cross_entropy(logits.float(), labels), at its peak.

    Two cases: ``eager`` (torchtitan before 2024-10-22 and from 2024-12-18 to 2025-04-02, or without
    compile) and ``compiled`` (``torch.compile`` of the loss function alone, the output projection left
    eager: torchtitan from 2025-04-02, commit bbb1b616e, whenever compile is on)."""
    n, h, v = 8192, 4096, 128256
    out = {}

    def ce(pred, labels):
        return F.cross_entropy(pred.float(), labels)

    for mode in ("eager", "compiled"):
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        loss_fn = torch.compile(ce) if mode == "compiled" else ce
        x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_(True)
        labels = torch.randint(0, v, (n,), device="cuda")
        for _ in range(2):  # warm-up: compiles, and leaves .grad buffers allocated as in training
            loss_fn(x @ w.t(), labels).backward()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = loss_fn(x @ w.t(), labels)
        kept = torch.cuda.memory_allocated() - base
        fwd_peak = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        bwd_peak = torch.cuda.max_memory_allocated() - base
        res = {"tokens": n, "vocab": v, "kept_bytes_per_logit": kept / (n * v),
               "forward_peak_bytes_per_logit": fwd_peak / (n * v),
               "backward_peak_bytes_per_logit": bwd_peak / (n * v)}
        out[mode] = res
        log(f"[loss] {mode}: {json.dumps(res)}")
        del x, w, labels, loss
    return out


class SmallLlama(torch.nn.Module):
    """torchtitan's Llama 3 Transformer at a size one GPU trains: embedding, TitanBlocks, norm, output."""

    def __init__(self, layers, hidden, heads, kv_heads, ffn, vocab, seq, mode):
        super().__init__()
        d = hidden // heads
        self.tok_embeddings = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(
            [Wrapped(TitanBlock(hidden, heads, kv_heads, ffn, False), mode) for _ in range(layers)])
        self.norm = torch.nn.RMSNorm(hidden)
        self.output = torch.nn.Linear(hidden, vocab, bias=False)
        angles = torch.outer(torch.arange(seq).float(), 1.0 / (500000 ** (torch.arange(0, d, 2).float() / d)))
        self.freqs = torch.polar(torch.ones_like(angles), angles).view(1, seq, 1, d // 2)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs)
        return self.output(self.norm(h))


@section("small_run")
def small_run(compile_too: bool):
    """A real training step under FSDP2 on one rank, the way torchtitan builds it (per-block AC, then
    per-block torch.compile, then fully_shard of each block and the root, bf16 params / fp32 reduce,
    fused AdamW, loss cross_entropy(logits.float()), compiled with the model when compile is on): peak
    allocated and reserved bytes, to compare with ``clusterplan evaluate`` on one device
    (benchmarks/results/small_run_model.yaml)."""
    import os
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    layers, hidden, heads, kv, ffn, vocab, seq, mb = 16, 2048, 32, 8, 8192, 128256, 8192, 1
    # (activation checkpointing, compiled, micro-batches per step): with several, the gradients of the
    # first micro-batch are held while the second one's activations are
    cases = [("none", False, 1), ("op_sac", False, 1), ("full", False, 1), ("none", False, 2)]
    cases += [("op_sac", True, 1)] if compile_too else []
    out = []

    def ce(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    for mode, compiled, accum in cases:
        t0 = time.time()
        gc.collect()  # FSDP modules hold reference cycles: free the last case's model before measuring
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        model = SmallLlama(layers, hidden, heads, kv, ffn, vocab, seq, mode).cuda()
        model.freqs = model.freqs.cuda()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            if compiled:
                block = torch.compile(block)
                model.layers[i] = block
            fully_shard(block, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mp_policy=mp)
        loss_fn = torch.compile(ce) if compiled else ce
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        tokens = torch.randint(0, vocab, (mb, seq), device="cuda")
        params = sum(p.numel() for p in model.parameters())
        step_s, phases = [], {}

        def mark(name):  # allocated now and the peak since the last mark, in bytes
            torch.cuda.synchronize()
            phases[name] = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated(),
                            "reserved_peak": torch.cuda.max_memory_reserved()}
            torch.cuda.reset_peak_memory_stats()

        for step in range(4):
            if step == 1:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            s0 = time.time()
            mark("start") if step == 3 else None
            for j in range(accum):
                tag = "" if accum == 1 else str(j + 1)
                logits = model(tokens)
                mark("forward" + tag) if step == 3 else None
                loss = loss_fn(logits, tokens)
                del logits
                mark("loss_forward" + tag) if step == 3 else None
                loss.backward()
                mark("backward" + tag) if step == 3 else None
            opt.step()
            mark("optimizer") if step == 3 else None
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            step_s.append(time.time() - s0)
        row = {"ac": mode, "compiled": compiled, "micro_batches": accum, "layers": layers, "hidden": hidden, "heads": heads,
               "kv_heads": kv, "ffn": ffn, "vocab": vocab, "seq": seq, "micro_batch": mb, "params": params,
               "peak_allocated_bytes": max([torch.cuda.max_memory_allocated()] + [v["peak"] for v in phases.values()]),
               "phases": phases,
               "peak_reserved_bytes": max([torch.cuda.max_memory_reserved()]
                                          + [v["reserved_peak"] for v in phases.values()]),
               "step_s": step_s[-1], "wall_s": round(time.time() - t0, 1)}
        out.append(row)
        log(f"[small_run] ac={mode} compiled={compiled} micro-batches={accum}: params {params / 1e9:.3f} B, peak allocated "
            f"{row['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved {row['peak_reserved_bytes'] / 2**30:.2f} GiB, "
            f"step {row['step_s']:.3f} s ({row['wall_s']} s); by phase (GiB allocated at the end / peak within): "
            + ", ".join(f"{k} {v['allocated'] / 2**30:.2f}/{v['peak'] / 2**30:.2f}" for k, v in phases.items()))
        del model, opt, loss, tokens
    return out


# name, hidden, local experts, top_k, expert FFN width, tokens (one rank's micro-batch, ep = 1 or the
# experts of one rank): Qwen3-30B-A3B's MoE MLP, a DeepSeek-V3-like MLP with 32 local experts (256 /
# ep 8) and Mixtral 8x7B's (8 large experts, top 2). Uniform routing (random router weights), as the
# force-balanced benchmarks run.
MOE_CASES = [
    ("qwen3-30b-a3b-moe-t4096", 2048, 128, 8, 768, 4096),
    ("qwen3-30b-a3b-moe-t16384", 2048, 128, 8, 768, 16384),
    ("dsv3-like-moe-e32-t8192", 7168, 32, 8, 2048, 8192),
    ("mixtral-8x7b-moe-t8192", 4096, 8, 2, 14336, 8192),
]


class MoEMLP(torch.nn.Module):
    """A token-choice MoE MLP as Megatron-Core's alltoall dispatcher runs it on one rank: router,
    top-k, permute into expert order, one grouped SwiGLU GEMM pair over the local experts
    (``torch._grouped_mm`` where PyTorch has it, else one GEMM per expert), un-permute weighted by
    the router probabilities and summed per token. No all-to-all (one rank)."""

    def __init__(self, hidden, experts, top_k, ffn, combine="scatter_add"):
        super().__init__()
        self.k, self.e, self.combine = top_k, experts, combine
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        # (experts, out, in), passed transposed, as torchtitan's MoE does (grouped_mm wants B column-major)
        self.w_up = torch.nn.Parameter(torch.randn(experts, 2 * ffn, hidden) * 0.02)
        self.w_down = torch.nn.Parameter(torch.randn(experts, hidden, ffn) * 0.02)

    def _grouped(self, x, w, offs, counts):
        if hasattr(torch, "_grouped_mm") and x.is_cuda:
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        return torch.cat([a @ w[i].T for i, a in enumerate(torch.split(x, counts))])

    def forward(self, x):
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weight, idx = torch.topk(probs, self.k, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        token_of = order // self.k
        counts_t = torch.bincount(flat, minlength=self.e)
        offs = torch.cumsum(counts_t, 0).to(torch.int32)
        counts = counts_t.tolist()
        xs = x.index_select(0, token_of)
        a, b = self._grouped(xs, self.w_up, offs, counts).chunk(2, dim=-1)
        y = self._grouped(F.silu(a) * b, self.w_down, offs, counts)
        y = y * weight.flatten()[order].unsqueeze(-1)
        if self.combine == "index_add":  # autograd keeps ``y`` for index_add_'s backward (it reads source's shape)
            return torch.zeros_like(x).index_add_(0, token_of, y)
        # Megatron-Core's unpermute: scatter_add_, whose backward is a gather and keeps no ``y``
        return torch.zeros_like(x).scatter_add_(0, token_of.unsqueeze(-1).expand(-1, x.shape[-1]), y)


FP8_LINEARS = (("qkv", 4096, 6144), ("proj", 4096, 4096), ("fc1", 4096, 28672), ("fc2", 14336, 4096))
"""Llama 3 8B's linear layers as (name, in features K, out features N); fc1 is gate and up fused."""


def _cast_transpose_kernel():
    """A one-pass FP8 cast that writes the row-major copy and the transposed copy and folds the tile's
    absolute maximum into a global amax (Transformer Engine's delayed-scaling ``cast_transpose``: the
    scale comes from earlier steps' amax, so one read of the 16-bit input suffices)."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, y_ptr, yt_ptr, amax_ptr, scale_ptr, M, N, fp8_max,
               BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        y = tl.minimum(tl.maximum(x * tl.load(scale_ptr), -fp8_max), fp8_max).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
        tl.store(yt_ptr + rn[:, None] * M + rm[None, :], tl.trans(y), mask=tl.trans(mask))

    def cast_transpose(x, dtype, tile=(64, 64, 4)):
        m, n = x.shape
        bm, bn, warps = tile
        y = torch.empty((m, n), device=x.device, dtype=dtype)
        yt = torch.empty((n, m), device=x.device, dtype=dtype)
        amax = torch.zeros((), device=x.device, dtype=torch.float32)
        scale = torch.ones((), device=x.device, dtype=torch.float32)
        kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](x, y, yt, amax, scale, m, n, torch.finfo(dtype).max,
                                                         BM=bm, BN=bn, num_warps=warps)
        return y, yt, amax
    return cast_transpose


CAST_TILES = ((64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8), (32, 128, 4), (128, 32, 4))
"""Tile shapes (rows, columns, warps) tried for the cast-transpose; the fastest per tensor is kept."""


def _best_cast_s(cast_transpose, x, dtype) -> tuple[float, list]:
    times = [(timed(lambda: cast_transpose(x, dtype, tile), 20), tile) for tile in CAST_TILES]
    return min(times)[0], sorted(times)


def _fp8_linear_row(name, k, n, tokens, cast_transpose) -> dict:
    """One linear layer's FP8 forward and backward as Transformer Engine runs it on Hopper: a
    cast-transpose of the input and of the output gradient, then three tensorwise-scaled FP8 GEMMs
    (forward, input gradient, weight gradient; Hopper's FP8 GEMMs take only the TN layout, hence the
    transposed copies); weights cast once per step and not timed here."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device="cuda")
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    w8 = torch.randn(n, k, device="cuda").to(e4)
    wt8 = w8.t().contiguous()
    x8, xt8, _ = cast_transpose(x, e4)
    dy8, dyt8, _ = cast_transpose(dy, e5)
    mm = functools.partial(torch._scaled_mm, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    gemms = {"fwd": lambda: mm(x8, w8.t()), "dgrad": lambda: mm(dy8, wt8.t()), "wgrad": lambda: mm(dyt8, xt8.t())}
    gemm_s = {key: timed(fn, 20) for key, fn in gemms.items()}
    (cast_x, tiles_x), (cast_dy, tiles_dy) = _best_cast_s(cast_transpose, x, e4), _best_cast_s(cast_transpose, dy, e5)
    cast_s = {"x": cast_x, "dy": cast_dy}
    eager_s = timed(lambda: ((x.float() * one).clamp(-448, 448).to(e4).t().contiguous(), x.abs().amax()), 20)
    rowwise_s = None
    try:
        sa, sb = torch.ones(tokens, 1, device="cuda"), torch.ones(1, n, device="cuda")
        rowwise_s = timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), 20)
    except Exception as exc:  # noqa: BLE001 - a probe reports what it can
        log(f"[fp8_linear] rowwise scaled_mm: {exc!r}")
    flops = 2 * tokens * k * n
    return {"name": name, "tokens": tokens, "k": k, "n": n, "gemm_s": gemm_s, "cast_transpose_s": cast_s,
            "gemm_tflops": {key: round(flops / t / 1e12, 1) for key, t in gemm_s.items()},
            "cast_bytes_per_s": {"x": 4 * tokens * k / cast_s["x"], "dy": 4 * tokens * n / cast_s["dy"]},
            "eager_cast_transpose_amax_s": eager_s, "rowwise_fwd_s": rowwise_s, "cast_tiles": {"x": tiles_x, "dy": tiles_dy},
            "cast_share": sum(cast_s.values()) / (sum(cast_s.values()) + sum(gemm_s.values()))}


@section("fp8_linear")
def fp8_linear(seconds: float):
    """Llama 3 8B's four linear layers at 8192 tokens in FP8 as Transformer Engine runs them: GEMM
    time, cast-transpose time (one fused pass, 2 B read and 2 B written per element) and their share,
    the rowwise-scaled forward GEMM beside the tensorwise one, then the whole chain run back to back
    for ``seconds`` (the GEMMs' sustained rate at real layer shapes under the power limit)."""
    cast_transpose = _cast_transpose_kernel()
    rows = []
    for name, k, n in FP8_LINEARS:
        row = _fp8_linear_row(name, k, n, 8192, cast_transpose)
        rows.append(row)
        log(f"[fp8_linear] {name} K{k} N{n}: GEMM TFLOP/s {row['gemm_tflops']}, cast-transpose "
            f"{ {key: round(v / 1e9) for key, v in row['cast_bytes_per_s'].items()} } GB/s, cast share "
            f"{row['cast_share']:.1%}, rowwise fwd {row['rowwise_fwd_s']}, eager cast {row['eager_cast_transpose_amax_s']:.2e} s")
        torch.cuda.empty_cache()
    chain = [gemm_fn(8192, n, k, "fp8") for _, k, n in FP8_LINEARS]
    flops = sum(2 * 8192 * k * n for _, k, n in FP8_LINEARS)
    steady = _sustain("fp8_linear", lambda: [fn() for fn in chain], flops, seconds, 60)
    return {"rows": rows, "chain_sustained": steady}


@section("sustained_layer")
def sustained_layer(seconds: float):
    """Llama 3 8B decoder layers (eager, bf16, 8192 tokens) trained fwd+bwd back to back for
    ``seconds``: whether a real layer's mix of GEMMs, attention and element-wise kernels slows under
    the power limit as much as a GEMM alone does (``sustained_fraction``)."""
    name, hidden, heads, kv, ffn, style, seq, mb, n = LAYER_CASES[0]
    stack = torch.nn.Sequential(*[Layer(hidden, heads, kv, ffn, style) for _ in range(n)]).cuda().bfloat16()
    x = torch.randn(mb, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    params = sum(p.numel() for p in stack.parameters())
    flops = 3 * 2 * mb * seq * params + 3.5 * 4 * mb * heads * seq * seq * (hidden // heads) / 2 * n
    res = _sustain("sustained_layer", lambda: stack(x).backward(g), flops, seconds, 20)
    res["case"] = name
    res["layers"] = n
    return res


EXPERT_GEMM_CASES = [
    # name, hidden, expert ffn, local experts, rows per expert (one rank of Megatron-Bridge's tables)
    ("qwen3-30b-a3b-ep8-mbs2", 2048, 768, 16, 4096),
    ("qwen3-235b-a22b-ep8-mbs1", 4096, 1536, 16, 2048),
    ("gpt-oss-120b-ep8-mbs4", 2880, 2880, 16, 4096),
    ("deepseek-v3-ep64-mbs1", 7168, 2048, 4, 8192),
]


def _expert_gemm_fns(rows, k, n, experts, dtype):
    """The experts' GEMMs of one projection (``experts`` GEMMs of ``rows x k x n``) launched four ways:
    one after another on one stream; round-robin over four streams joined by events (Transformer
    Engine's ``general_grouped_gemm`` up to 2026: one cuBLAS GEMM per expert, ``num_compute_streams``
    = 4, ``transformer_engine/common/gemm/cublaslt_gemm.cu`` at v2.9); as one grouped launch
    (``torch._grouped_mm``, bf16 only); and as a single GEMM of all the rows (the ideal)."""
    if dtype == "fp8":
        one = torch.ones((), device="cuda")
        xs = [torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(experts)]
        ws = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(experts)]
        mm = lambda a, b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        big_x = torch.randn(rows * experts, k, device="cuda").to(torch.float8_e4m3fn)
        big = lambda: mm(big_x, ws[0])  # noqa: E731
        grouped = None
    else:
        xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(experts)]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(experts)]
        mm = lambda a, b: a @ b.t()  # noqa: E731
        big_x = torch.cat(xs)
        big = lambda: big_x @ ws[0].t()  # noqa: E731
        w3 = torch.stack(ws)
        offs = torch.arange(rows, rows * experts + 1, rows, device="cuda", dtype=torch.int32)
        grouped = (lambda: torch._grouped_mm(big_x, w3.transpose(-2, -1), offs=offs)) if hasattr(torch, "_grouped_mm") else None
    streams = [torch.cuda.Stream() for _ in range(4)]

    def sequential():
        for a, b in zip(xs, ws):
            mm(a, b)

    def four_streams():
        main = torch.cuda.current_stream()
        for st in streams:
            st.wait_stream(main)
        for i, (a, b) in enumerate(zip(xs, ws)):
            with torch.cuda.stream(streams[i % 4]):
                mm(a, b)
        for st in streams:
            main.wait_stream(st)
    return {"sequential": sequential, "four_streams": four_streams, "grouped": grouped, "one_gemm": big}


@section("expert_gemms")
def expert_gemms():
    """MoE expert GEMMs at the per-rank shapes of Megatron-Bridge's MoE rows, bf16 and FP8, launched
    as Transformer Engine did until 2026 (one GEMM per expert over four streams), one after another,
    as one grouped launch and as one GEMM of all rows: TFLOP/s of each (``models.ops.moe_ops`` prices
    them as one grouped launch)."""
    out = []
    for name, hidden, ffn, experts, rows in EXPERT_GEMM_CASES:
        for proj, k, n in (("up", hidden, 2 * ffn), ("down", ffn, hidden)):
            for dtype in ("bf16", "fp8"):
                fns = _expert_gemm_fns(rows, k, n, experts, dtype)
                flops = 2 * rows * k * n * experts
                row = {"case": name, "proj": proj, "dtype": dtype, "rows": rows, "k": k, "n": n, "experts": experts}
                for key, fn in fns.items():
                    row[f"{key}_tflops"] = round(flops / timed(fn, 20) / 1e12, 1) if fn else None
                out.append(row)
                log(f"[expert_gemms] {name} {proj} {dtype}: " + ", ".join(f"{k_} {v}" for k_, v in row.items() if k_.endswith("tflops")))
                del fns
                torch.cuda.empty_cache()
    return out


WGRAD_CASES = (  # (name, tokens, k, n): a weight gradient's K x N output, tokens the reduction
    ("llama3-8b-mlp-up", 8192, 4096, 14336),
    ("llama3-8b-mlp-up-2k", 2048, 4096, 14336),
    ("llama3-70b-tp8-mlp-up", 4096, 8192, 3584),
    ("llama3-70b-tp8-mlp-up-16k", 16384, 8192, 3584),
    ("gpt-oss-expert-up", 1024, 2880, 5760),
)


def _wgrad_fns(tokens, k, n):
    """The weight-gradient GEMM of one linear layer, three ways (``wgrad_accum``)."""
    x_t = torch.randn(k, tokens, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(k, n, device="cuda", dtype=torch.float32)
    fns = {"bf16_out": lambda: x_t @ dy, "unfused_fp32_add": lambda: acc.add_(x_t @ dy)}
    try:  # a GEMM that reads and writes the fp32 buffer itself (PyTorch 2.8+: out_dtype)
        torch.addmm(acc, x_t, dy, out_dtype=torch.float32)
        fns["fused_fp32_accum"] = lambda: torch.addmm(acc, x_t, dy, out_dtype=torch.float32, out=acc)
        fns["fused_fp32_accum"]()
    except (TypeError, RuntimeError) as exc:
        log(f"[wgrad_accum] no fused fp32 accumulate in this PyTorch: {exc}")
    return fns


@section("wgrad_accum")
def wgrad_accum():
    """Weight-gradient GEMMs with a bf16 output, with a fused fp32 accumulate and with a separate fp32
    add: the time each takes, and the extra seconds per output element over the bf16 output."""
    out = []
    for name, tokens, k, n in WGRAD_CASES:
        fns = _wgrad_fns(tokens, k, n)
        row = {"case": name, "tokens": tokens, "k": k, "n": n}
        for key, fn in fns.items():
            row[f"{key}_s"] = timed(fn, 20)
        base = row["bf16_out_s"]
        row["tflops_bf16_out"] = round(2 * tokens * k * n / base / 1e12, 1)
        for key in ("fused_fp32_accum", "unfused_fp32_add"):
            if f"{key}_s" in row:
                row[f"{key}_extra_s_per_element"] = (row[f"{key}_s"] - base) / (k * n)
        out.append(row)
        log(f"[wgrad_accum] {name}: " + ", ".join(f"{key} {v:.3g}" for key, v in row.items() if key.endswith("_s")))
        del fns
        torch.cuda.empty_cache()
    return out


def _ds_gather_copies(numels, world):
    """The copies DeepSpeed ZeRO-3 made around one module's parameter all-gather before v0.5.6
    (``partition_parameters._allgather_params`` until PR #1188, 2021-10-31): PyTorch's list
    ``all_gather`` copies the flat NCCL output into each of the ``world`` partitions (the implicit
    memcpy the PR names), then a Python loop copies each partition's slice of each parameter into the
    parameter's full tensor. The NCCL call itself is left out (one GPU)."""
    parts = [math.ceil(n / world) for n in numels]
    size = sum(parts)
    flat = torch.empty(size * world, device="cuda", dtype=torch.float16)
    partitions = [flat.narrow(0, size * i, size) for i in range(world)]
    nccl_out = torch.empty_like(flat)

    def fetch():
        for i in range(world):  # the list all_gather's copy-back
            partitions[i].copy_(nccl_out.narrow(0, size * i, size))
        offset = 0
        for numel, part in zip(numels, parts):
            full = torch.empty(numel, device="cuda", dtype=torch.float16)
            for i in range(world):
                start = i * part
                if start < numel:
                    n = min(numel - start, part)
                    full.narrow(0, start, n).copy_(partitions[i].narrow(0, offset, n))
            offset += part
    return fetch


def _ds_reduce_scatter_views(numel, world):
    """The Python side of DeepSpeed ZeRO-3's per-parameter gradient reduce-scatter before v0.6.0
    (``partition_parameters._reduce_scatter_gradient`` at v0.3.15): one ``narrow`` view of the
    gradient per rank, collected into the list ``torch.distributed.reduce_scatter`` takes (which
    then copies each into a flat buffer from C++; not timed here)."""
    part = math.ceil(numel / world)
    grad = torch.empty(numel, device="cuda", dtype=torch.float16)

    def views():
        out = []
        for i in range(world):
            start = i * part
            if start < numel and start + part <= numel:
                out.append(grad.view(-1).narrow(0, start, part))
            else:
                out.append(torch.zeros(part, dtype=grad.dtype, device=grad.device))
        return out
    return views


@section("zero3_list_copies")
def zero3_list_copies():
    """Host time of DeepSpeed ZeRO-3's per-partition copies around each module's all-gather before
    v0.5.6, at GPT-3 175B's module sizes and 384-1536 ranks (the 2021 ZeRO-3 runs of Narayanan et
    al. 2021, Table 2): seconds per fetch and per copy (``semantics.zero3_fetch_history``)."""
    modules = {"qkv (w, b)": (3 * 12288 * 12288, 3 * 12288), "fc1 (w, b)": (4 * 12288 * 12288, 4 * 12288),
               "layernorm (w, b)": (12288, 12288)}
    out = []
    for world in (384, 768, 1536):
        for name, numels in modules.items():
            fetch = _ds_gather_copies(numels, world)
            t = timed(fetch, 5, warmup=1)
            copies = world * (1 + len(numels))
            out.append({"world": world, "module": name, "numels": numels, "fetch_s": t, "copies": copies,
                        "s_per_copy": t / copies})
            log(f"[zero3_list_copies] {world} ranks, {name}: {t * 1e3:.2f} ms per fetch, {copies} copies, "
                f"{t / copies * 1e6:.2f} us each")
            del fetch
            views = _ds_reduce_scatter_views(numels[0], world)
            t0 = time.perf_counter()
            for _ in range(5):
                views()
            t_views = (time.perf_counter() - t0) / 5
            out[-1].update({"reduce_scatter_views_s": t_views, "s_per_view": t_views / world})
            log(f"[zero3_list_copies] {world} ranks, {name}: reduce-scatter views {t_views * 1e3:.2f} ms, "
                f"{t_views / world * 1e6:.2f} us each")
            del views
            torch.cuda.empty_cache()
    return out


def _kernel_times(fn, iters: int) -> list[dict]:
    """GPU kernels of ``iters`` calls of ``fn`` under torch.profiler: seconds and calls per call,
    longest first (where the time of a block goes)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = getattr(e, "cuda_time_total", 0) if us is None else us
        if us:
            rows.append({"name": e.key, "s": us / 1e6 / iters, "calls": e.count / iters})
    return sorted(rows, key=lambda r: -r["s"])


@section("moe")
def moe():
    out = []
    cases = [c + ("scatter_add",) for c in MOE_CASES] + [MOE_CASES[0] + ("index_add",)]
    for name, hidden, experts, top_k, ffn, tokens, combine in cases:
        torch.cuda.empty_cache()
        block = MoEMLP(hidden, experts, top_k, ffn, combine).cuda().bfloat16()
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn_like(x)
        t = timed(lambda: block(x).backward(g), 5, warmup=2)
        t_fwd = timed(lambda: block(x).detach(), 5, warmup=1)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        y = block(x)
        act = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
        y.backward(g)
        del y
        row = {"case": name if combine == "scatter_add" else f"{name}-index-add", "hidden": hidden,
               "experts": experts, "top_k": top_k, "expert_ffn": ffn, "combine": combine,
               "tokens": tokens, "grouped_mm": hasattr(torch, "_grouped_mm"), "fwd_bwd_s": t, "fwd_s": t_fwd,
               "activation_bytes": act, "kernels": _kernel_times(lambda: block(x).backward(g), 3)}
        flops = 3 * 2 * tokens * top_k * hidden * 3 * ffn
        out.append(row)
        log(f"[moe] {row['case']}: fwd+bwd {t * 1e3:.2f} ms, fwd {t_fwd * 1e3:.2f} ms, expert GEMMs "
            f"{flops / t / 1e12:.0f} TFLOP/s, activations {act / 2**20:.0f} MiB; kernels (ms per fwd+bwd, calls): "
            + "; ".join(f"{k['name'][:60]} {k['s'] * 1e3:.3f} x{k['calls']:g}" for k in row["kernels"][:12]))
        del block, x, g
    return out


def _side_kernels():
    """Two Triton kernels that hold ``grid`` SMs for a set time: ``copy`` streams a buffer through
    memory as an NCCL channel does (one block per channel), ``spin`` only computes on registers."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, reps, delay, sink, BLOCK: tl.constexpr):
        pid, progs = tl.program_id(0), tl.num_programs(0)
        chunks = tl.cdiv(n, BLOCK)
        wait = tl.zeros((BLOCK,), dtype=tl.float32)
        for r in range(0, reps):
            for c in range(pid, chunks, progs):
                offs = c * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
                for i in range(0, delay):  # register-only work between chunks: a slower stream
                    wait = wait * 0.999 + 0.001
        tl.store(sink + pid * BLOCK + tl.arange(0, BLOCK), wait)

    @triton.jit
    def spin(out, iters, BLOCK: tl.constexpr):
        x = tl.arange(0, BLOCK).to(tl.float32)
        for i in range(0, iters):
            x = x * 0.999 + 0.001
        tl.store(out + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), x)
    return copy, spin


# GEMM shapes (m, n, k) overlapped: a square one, and one tensor-parallel rank's Llama-3-70B MLP at
# tp 8 (8192 tokens, 28672 / 8 = 3584 wide), forward.
OVERLAP_GEMMS = [(8192, 8192, 8192), (8192, 3584, 8192)]


def _attention_fn(tokens=8192, heads=32, head_dim=128):
    """Causal attention forward and backward through SDPA (cuDNN or flash), one sequence."""
    q, k, v = (torch.randn(1, heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(1, heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)


@section("overlap")
def overlap():
    return _overlap([(f"{m}x{n}x{k}", [m, n, k], gemm_fn(m, n, k, "bf16"), 2 * m * n * k) for m, n, k in OVERLAP_GEMMS],
                    [("copy", c, 0) for c in (4, 8, 16, 32)] + [("spin", c, 0) for c in (4, 8, 16, 32)]
                    + [("copy", 16, d) for d in (64, 256, 1024, 4096)]  # one channel count, slower streams
                    + [("copy_narrow", 16, 0), ("spin_wide", 16, 0)])  # the same count, another footprint


@section("overlap_more")
def overlap_more():
    """The tail effect on a smaller GEMM (fewer waves) and on causal attention (fwd+bwd)."""
    return _overlap([("4096x3584x8192", [4096, 3584, 8192], gemm_fn(4096, 3584, 8192, "bf16"), 2 * 4096 * 3584 * 8192),
                     ("sdpa-causal-8k-h32-d128", None, _attention_fn(), 3.5 * 4 * 8192 * 8192 * 32 * 128 / 2)],
                    [("copy", c, 0) for c in (8, 16, 32)] + [("copy_narrow", 16, 0), ("spin_wide", 16, 0)])


@section("overlap_waves")
def overlap_waves():
    """How the tail effect depends on the GEMM's size: M = K = 8192 and N from 1,792 to 28,672 (3.4
    to 54 waves of 128x256 tiles on 132 SMs), bf16 and one fp8 case, beside 16 and 32 copy blocks."""
    computes = [(f"8192x{n}x8192", [8192, n, 8192], gemm_fn(8192, n, 8192, "bf16"), 2 * 8192 * n * 8192)
                for n in (1792, 3584, 7168, 14336, 28672)]
    computes.append(("fp8 8192x8192x8192", [8192, 8192, 8192], gemm_fn(8192, 8192, 8192, "fp8"), 2 * 8192**3))
    return _overlap(computes, [("copy", 16, 0), ("copy", 32, 0)])


def _overlap(computes, cases):
    copy, spin = _side_kernels()
    n = 64 * 2**20  # 128 MiB of bf16 each way, past the 50 MiB L2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    spin_out = torch.empty(64 * 4096, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block = 4096

    sink = torch.empty(64 * block, device="cuda")

    # kind: (kernel, elements per block-step, warps). One NCCL channel is one block of 512 threads
    # (16 warps); "_narrow" and "_wide" change the footprint of a block on its SM, not the count.
    kinds = {"copy": (copy, block, 16), "copy_narrow": (copy, 1024, 4), "spin": (spin, 512, 16),
             "spin_wide": (spin, block, 16)}
    footprint = {}

    def side(kind, ctas, amount, delay=0):
        kernel, elems, warps = kinds[kind]
        if kernel is copy:
            k = copy[(ctas,)](src, dst, n, amount, delay, sink, BLOCK=elems, num_warps=warps)
        else:
            k = spin[(ctas,)](spin_out, amount, BLOCK=elems, num_warps=warps)
        if kind not in footprint:
            footprint[kind] = {"registers_per_thread": getattr(k, "n_regs", None),
                               "shared_bytes": getattr(getattr(k, "metadata", None), "shared", None),
                               "threads": 32 * warps}

    def wall_s(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    side("copy", 8, 1)
    assert torch.equal(src, dst), "copy kernel is wrong"
    dst.zero_()
    side("copy", 8, 1, 3)
    assert torch.equal(src, dst), "delayed copy kernel is wrong"
    # Compile every variant before anything is timed: Triton specializes an integer argument on
    # == 1, divisible by 16 and neither, so each kernel is launched once in each class of its counts
    # (an uncompiled class inside copy_s once made a 16-block copy read 96 GB/s instead of 550).
    for kind in kinds:
        for amount in ((1, 2, 16) if kind.startswith("copy") else (10, 16)):
            side(kind, 8, amount)
    torch.cuda.synchronize()
    spin_rate = 2e6 / wall_s(lambda: side("spin_wide", 8, 2_000_000))  # iterations per second (the slower)
    side_stream = torch.cuda.Stream()

    @functools.lru_cache(maxsize=None)
    def copy_s(kind, ctas, delay):
        """Seconds of one pass of a copy kernel alone, timed over at least 0.1 s."""
        one = wall_s(lambda: side(kind, ctas, 1, delay))
        reps = math.ceil(0.1 / one)
        return one if reps <= 1 else wall_s(lambda: side(kind, ctas, reps, delay)) / reps

    def trial(gemm, iters, kind, ctas, delay):
        """GEMM loop alone, then beside the side kernel: (slowdown, alone s, together s, side bytes/s,
        nvidia-smi during the GEMMs alone, and beside)."""
        alone = timed(gemm, iters, warmup=3)
        for _ in range(iters):
            gemm()
        clocks_alone = smi()  # sampled while the loop above runs
        torch.cuda.synchronize()
        if kind.startswith("copy"):
            one = copy_s(kind, ctas, delay)
            rate, amount = 2 * n * 2 / one, max(1, math.ceil(1.5 * alone * iters / one))
        else:
            rate, amount = None, int(1.5 * alone * iters * spin_rate)  # outlasts the GEMM loop
        torch.cuda.synchronize()
        g0, g1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side_stream):
            side(kind, ctas, amount, delay)  # launched first: its blocks hold their SMs, as NCCL's do
        time.sleep(0.005)
        g0.record()
        for _ in range(iters):
            gemm()
        g1.record()
        clocks_together = smi()
        torch.cuda.synchronize()
        together = g0.elapsed_time(g1) / 1e3 / iters
        return together / alone - 1, alone, together, rate, clocks_alone, clocks_together

    rows = []
    for label, shape, gemm, flops in computes:
        iters = max(10, round(0.25 / timed(gemm, 5)))  # a quarter of a second of it
        for kind, ctas, delay in cases:
            trials = sorted((trial(gemm, iters, kind, ctas, delay) for _ in range(3)), key=lambda t: t[0])
            slow, alone, together, rate, clk_a, clk_t = trials[1]  # the median of three
            row = {"compute": label, "side": kind, "ctas": ctas, "delay": delay, "sm_share": ctas / sms,
                   "gemm_alone_s": alone, "gemm_together_s": together, "gemm_slowdown": slow,
                   "slowdowns": [t[0] for t in trials], "side_alone_bytes_per_s": rate,
                   "gemm_alone_tflops": flops / alone / 1e12, "smi_alone": clk_a, "smi_together": clk_t,
                   "side_kernel": footprint.get(kind)}
            if shape:
                row["gemm"] = shape
            rows.append(row)
            log(f"[overlap] {label} ({row['gemm_alone_tflops']:.0f} TFLOP/s alone) beside a {kind} "
                f"kernel of {ctas} blocks ({ctas / sms:.1%} of the SMs)" + (f", delay {delay}" if delay else "")
                + f": slowed {slow:.1%} (trials " + ", ".join(f"{t[0]:.1%}" for t in trials) + ")"
                + (f", copy alone {rate / 1e9:.0f} GB/s" if rate else "")
                + f"; SM MHz / W alone {clk_a.get('clocks.sm')}/{clk_a.get('power.draw')},"
                f" beside {clk_t.get('clocks.sm')}/{clk_t.get('power.draw')}")
    log(f"[overlap] side kernels: {footprint}")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_probe.json")
    p.add_argument("--sustain-s", type=float, default=40.0)
    p.add_argument("--quick", action="store_true", help="one GEMM shape, 5 s sustained: a smoke test")
    p.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases of titan_layers")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    RESULTS["device"] = {"name": props.name, "sm_count": props.multi_processor_count,
                         "memory_bytes": props.total_memory, "torch": torch.__version__,
                         "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), **smi()}
    log(f"[device] {RESULTS['device']}")
    torch.backends.cuda.matmul.allow_tf32 = False

    def save():
        with open(a.out, "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)

    sections = {"loss": (loss_memory, ()), "small_run": (small_run, (not a.no_compile,)),
                "launch": (launch, ()), "memory_bandwidth": (memory_bandwidth, ()), "mamf": (mamf, (a.quick,)),
                "attention": (attention, ()), "layers": (layers, ()), "titan_layers": (titan_layers, (not a.no_compile,)),
                "tp_shard": (tp_shard, ()), "tp_shard_unfused": (tp_shard_unfused, ()), "moe": (moe, ()), "overlap": (overlap, ()), "overlap_more": (overlap_more, ()), "overlap_waves": (overlap_waves, ()), "allocator": (allocator, ()), "sustained": (sustained, (5.0 if a.quick else a.sustain_s,)),
                "sustained_fp8": (sustained_fp8, (5.0 if a.quick else a.sustain_s,)),
                "fp8_linear": (fp8_linear, (5.0 if a.quick else a.sustain_s / 2,)),
                "sustained_layer": (sustained_layer, (5.0 if a.quick else a.sustain_s / 2,)),
                "expert_gemms": (expert_gemms, ()), "zero3_list_copies": (zero3_list_copies, ()),
                "wgrad_accum": (wgrad_accum, ())}
    only = [x for x in a.only.split(",") if x]
    for name in only:
        if name not in sections:
            print(f"error: --only: unknown section {name!r}; allowed: {', '.join(sections)}", file=sys.stderr)
            return 2
    for name, (fn, args) in sections.items():
        if not only or name in only:
            fn(*args)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
