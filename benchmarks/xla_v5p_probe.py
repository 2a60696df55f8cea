"""Does MaxText's 32B v5p-128 recipe fit? XLA's own answer, compiled ahead of time for a TPU v5p-128
slice (64 chips) without the chips (JAX's TPU topology description, as ``benchmarks/xla_tpu_probe.py``;
``pip install 'jax[tpu]'``).

The program is a small JAX train step written for this script (no MaxText code) that holds what
MaxText's ``MaxText/configs/v5p/32b.sh`` step holds: fp32 parameters cast to bf16 at use (``linears.py``
at 76bd53b0 creates each kernel in float32; base.yml says ``weight_dtype: float32`` from 2024-02-16),
a scan over the decoder layers under
``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims`` (``remat_policy=minimal`` at the
time), Pallas flash attention, the logits and an fp32 log-softmax, and an Adam-style update of fp32
moments; the mesh is ``fsdp`` x ``tensor`` (``ici_fsdp_parallelism=-1 ici_tensor_parallelism=4``),
parameters sharded on their embed dimension over fsdp and on heads / MLP width over tensor,
activations on batch over fsdp and on the embed dimension over tensor (base.yml logical_axis_rules).

Cases (``--cases``; default all):

* ``record``: the bundled row ``maxtext-32b-v5p-128`` as written until 2026-11-29: base.yml of 2024-02-14 (3b2ac811:
  Llama-style SwiGLU, emb 2048, 16 heads of 128, mlp 7168, scale 32 -> h 8192, 64 heads, f 28672, 32
  layers, vocab 32000) at ``per_device_batch_size=7`` (the script of 2024-02-01, e301755d).
* ``record-pdbs6``: the same model at 6, what the script says from 2024-02-20 (7081e2c0, the commit
  that added ahead-of-time compile checks of these scripts).
* ``readme-2023``: what ran when the README's 328 TFLOP/s was written (76bd53b0, 2023-12-15), what the row
  carries since 2026-11-29 (here with an untied output matrix): base.yml
  of then (emb 2560, 8 heads of 256, mlp 8192, one relu up-projection, vocab 32768; scale 32 -> h
  10240, 32 heads of 256, f 32768, 32 layers) at ``per_device_batch_size=8``.

Prints one JSON object per case: XLA's memory analysis (``peak_memory_in_bytes``), or the
compiler's out-of-memory message. ``--available`` prints instead the HBM XLA leaves to a program on
one device of each TPU topology (its out-of-memory message for a 164 GiB program; results of
2026-11-29 in docs/cost-model.md, section 2, the runtime outside the allocator). Results of 2026-11-29 (jax 0.10.2, libtpu 0.0.42.1):
``benchmarks/results/xla_v5p_probe_2026-11-29.json``. About 3 minutes a case on 2 cores.
"""

from __future__ import annotations

import argparse
import json

CASES = {
    "record": dict(pdbs=7, h=8192, heads=64, hd=128, f=28672, vocab=32000, mlp="swiglu"),
    "record-pdbs6": dict(pdbs=6, h=8192, heads=64, hd=128, f=28672, vocab=32000, mlp="swiglu"),
    "readme-2023": dict(pdbs=8, h=10240, heads=32, hd=256, f=32768, vocab=32768, mlp="relu"),
}
LAYERS, SEQ, TP = 32, 2048, 4


def _mesh():
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5p:4x4x4", chip_config_name="default",
                                        chips_per_host_bounds=(2, 2, 1), num_slices=1)
    return Mesh(np.array(topo.devices).reshape(len(topo.devices) // TP, TP), ("fsdp", "tensor"))


def _params(c: dict) -> dict:
    """Shapes and shardings of the parameters (stacked over the layers)."""
    from jax.sharding import PartitionSpec as P
    h, a, d, f, v, n = c["h"], c["heads"], c["hd"], c["f"], c["vocab"], LAYERS
    params = {"emb": ((v, h), P("tensor", "fsdp")), "out": ((h, v), P("fsdp", "tensor")), "fnorm": ((h,), P(None)),
              "wq": ((n, h, a, d), P(None, "fsdp", "tensor", None)), "wk": ((n, h, a, d), P(None, "fsdp", "tensor", None)),
              "wv": ((n, h, a, d), P(None, "fsdp", "tensor", None)), "wo": ((n, a, d, h), P(None, "tensor", None, "fsdp")),
              "w0": ((n, h, f), P(None, "fsdp", "tensor")), "w2": ((n, f, h), P(None, "tensor", "fsdp")),
              "n1": ((n, h), P(None, None)), "n2": ((n, h), P(None, None))}
    if c["mlp"] == "swiglu":
        params["w1"] = ((n, h, f), P(None, "fsdp", "tensor"))
    return params


def _layer(mesh, c: dict):
    """One decoder layer (pre-norm attention and MLP), activations constrained as MaxText shards them."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    from jax.sharding import NamedSharding, PartitionSpec as P
    act, heads = NamedSharding(mesh, P("fsdp", None, "tensor")), P("fsdp", None, "tensor", None)
    pin = jax.lax.with_sharding_constraint
    bf = lambda t: t.astype(jnp.bfloat16)

    def norm(x, w):
        x32 = x.astype(jnp.float32)
        return bf(x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)) * bf(w)

    def attend(q, k, v):
        def local(q, k, v):
            q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
            return flash_attention(q, k, v, causal=True, sm_scale=c["hd"] ** -0.5).transpose(0, 2, 1, 3)
        return jax.shard_map(local, mesh=mesh, in_specs=(heads,) * 3, out_specs=heads, check_vma=False)(q, k, v)

    def layer(x, w):
        y = norm(x, w["n1"])
        q, k, v = (pin(jnp.einsum("bsh,hnd->bsnd", y, bf(w[n])), NamedSharding(mesh, heads)) for n in ("wq", "wk", "wv"))
        x = pin(x + jnp.einsum("bsnd,ndh->bsh", attend(q, k, v), bf(w["wo"])), act)
        y = norm(x, w["n2"])
        z = jnp.einsum("bsh,hf->bsf", y, bf(w["w0"]))
        z = jax.nn.silu(z) * jnp.einsum("bsh,hf->bsf", y, bf(w["w1"])) if "w1" in w else jax.nn.relu(z)
        return pin(x + jnp.einsum("bsf,fh->bsh", z, bf(w["w2"])), act)
    return layer


def _train_step(mesh, c: dict):
    """Loss over a scan of remat'd layers, its gradient and an Adam-style update of fp32 state."""
    import jax
    import jax.numpy as jnp
    layer = _layer(mesh, c)
    body = jax.checkpoint(lambda x, w: (layer(x, w), None),
                          policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, prevent_cse=False)

    def loss(p, tokens):
        x, _ = jax.lax.scan(body, p["emb"].astype(jnp.bfloat16)[tokens],
                            {k: p[k] for k in ("wq", "wk", "wv", "wo", "w0", "w1", "w2", "n1", "n2") if k in p})
        logits = jnp.einsum("bsh,hv->bsv", x, p["out"].astype(jnp.bfloat16)).astype(jnp.float32)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1).mean()

    def step(state, tokens):
        p, m, v = state
        value, g = jax.value_and_grad(loss)(p, tokens)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.95 * v + 0.05 * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - 1e-4 * (m / (jnp.sqrt(v) + 1e-8) + 0.1 * p), p, m, v)
        return (p, m, v), value
    return step


TOPOLOGIES = {"v4:2x2x1": (2, 2, 1), "v5e:1x1": (1, 1, 1), "v5p:2x2x1": (2, 2, 1), "v6e:1x1": (1, 1, 1),
              "tpu7x:2x2x1": (2, 2, 1)}


def available_hbm(topology: str) -> str:
    """XLA's out-of-memory message for 41 live 4 GiB buffers on one device of ``topology``: it names
    the HBM available to a program ("exceeds available HBM (...G)", in GiB)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology, chip_config_name="default",
                                        chips_per_host_bounds=TOPOLOGIES[topology], num_slices=1)
    x = jax.ShapeDtypeStruct((1024, 1024, 1024), jnp.float32, sharding=SingleDeviceSharding(topo.devices[0]))
    try:
        jax.jit(lambda x: tuple(jnp.sin(x * i) for i in range(40))).lower(x).compile()
    except jax.errors.JaxRuntimeError as err:
        return str(err).splitlines()[0]
    return "compiled (more HBM than 164 GiB)"


def probe(name: str) -> dict:
    """Compile one case; XLA's memory analysis, or its out-of-memory message."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    c, mesh = CASES[name], _mesh()
    params = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec)) for k, (s, spec) in _params(c).items()}
    tokens = jax.ShapeDtypeStruct((c["pdbs"] * len(mesh.devices.flat), SEQ), jnp.int32,
                                  sharding=NamedSharding(mesh, P("fsdp", None)))
    out = {"case": name, **c, "layers": LAYERS, "seq": SEQ, "tp": TP, "chips": len(mesh.devices.flat)}
    try:
        with jax.set_mesh(mesh):
            mem = jax.jit(_train_step(mesh, c), donate_argnums=(0,)).lower((params, params, params), tokens).compile().memory_analysis()
    except jax.errors.JaxRuntimeError as err:
        return {**out, "error": str(err).splitlines()[0]}
    return {**out, **{k: getattr(mem, k) for k in ("peak_memory_in_bytes", "argument_size_in_bytes", "temp_size_in_bytes")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--out", help="write the results as a JSON list to this file")
    parser.add_argument("--available", action="store_true", help="print the HBM XLA leaves to a program per TPU")
    args = parser.parse_args()
    import jax
    if args.available:
        for name in TOPOLOGIES:
            print(name, available_hbm(name))
        return
    results = [probe(name) for name in args.cases]
    for r in results:
        print(json.dumps(r))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"jax": jax.__version__, "cases": results}, fh, indent=1)


if __name__ == "__main__":
    main()
