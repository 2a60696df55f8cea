"""What XLA keeps in TPU memory for MaxText's loss and remat policies, compiled ahead of time for a
TPU v6e chip without the chip (JAX's TPU topology description; ``pip install 'jax[tpu]'``: libtpu
compiles for a named topology on any host, as MaxText's ``train_compile.py`` does).

Two probes, each a small JAX program written for this script that does what MaxText's training step
does at tag tpu-recipes-v0.1.4 (no MaxText code):

* ``loss``: the unembedding matmul in bf16 from fp32 parameters (``dtype: bfloat16``,
  ``weight_dtype: float32``), the logits cast to fp32 (``cast_logits_to_fp32: True``), a one-hot
  target and a cross-entropy with a custom VJP that keeps the shifted exponentials, their sum and the
  log-softmax (``max_utils.cross_entropy_with_logits``), differentiated for the hidden states and the
  parameters. Prints XLA's temporary bytes per logit.
* ``remat``: a Llama-style layer scanned over L layers under a remat policy (``full``, or the layer
  input alone, or with its q/k/v/out projections, offloaded to ``pinned_host`` by
  ``save_and_offload_only_these_names``, as MaxText's ``remat_policy: custom`` with ``offload``).
  Prints the device and host temporary bytes per layer (the slope between two layer counts) in units
  of the layer input, ``2 n h`` bytes, and what the jaxpr itself saves per layer (its forward scan's
  residuals, before XLA plans any buffer). ``minimal`` is MaxText's ``remat_policy: minimal`` as it was
  until 2025-08 (``checkpoint_dots_with_no_batch_dims``), ``minimal_names`` as it is since (the same
  outputs saved by name); the layer names its tensors as MaxText does.

Run: ``python benchmarks/xla_tpu_probe.py [--out FILE.json] [--no-loss] [--modes ...]`` (about 10
minutes on 2 cores). Results of 2026-11-29 (jax 0.10.2, libtpu 0.0.42.1):
``benchmarks/results/xla_tpu_probe_v6e_2026-11-29.json``; the ``minimal`` policies (``--no-loss --modes
full minimal minimal_names``, 3 minutes): ``benchmarks/results/xla_tpu_probe_v6e_minimal_2026-11-29.json``.
"""

from __future__ import annotations

import argparse
import json

SEQ, HIDDEN, VOCAB = 8192, 4096, 128256  # Llama 3.1 8B's unembedding
LAYER = dict(seq=2048, hidden=2048, ffn=8192, heads=16)


def _device():
    from jax.experimental import topologies
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v6e:1x1", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    return topo.devices[0]


def _spec(dev, shape, dtype):
    import jax
    from jax.sharding import SingleDeviceSharding
    return jax.ShapeDtypeStruct(shape, dtype, sharding=SingleDeviceSharding(dev))


def _xent():
    """A cross-entropy whose backward reads the residuals MaxText's custom VJP keeps."""
    import jax
    import jax.numpy as jnp

    def forward(logits, targets):
        shifted = logits - logits.max(-1, keepdims=True)
        exps = jnp.exp(shifted)
        total = exps.sum(-1, keepdims=True)
        log_probs = shifted - jnp.log(total)
        return -(targets * log_probs).sum(-1), (logits, targets, exps, total, log_probs)

    def backward(res, g):
        logits, targets, exps, total, log_probs = res
        return ((g[..., None] * (exps / total - targets)).astype(logits.dtype),
                (-g[..., None] * log_probs).astype(targets.dtype))

    xent = jax.custom_vjp(lambda logits, targets: forward(logits, targets)[0])
    xent.defvjp(forward, backward)
    return xent


def loss_probe(dev, batch: int) -> dict:
    import jax
    import jax.numpy as jnp
    xent = _xent()

    def head(w, y, target):
        logits = jnp.einsum("bsh,hv->bsv", y, w.astype(jnp.bfloat16)).astype(jnp.float32)
        return xent(logits, jax.nn.one_hot(target, w.shape[1])).sum()

    args = (_spec(dev, (HIDDEN, VOCAB), jnp.float32), _spec(dev, (batch, SEQ, HIDDEN), jnp.bfloat16),
            _spec(dev, (batch, SEQ), jnp.int32))
    mem = jax.jit(jax.grad(head, argnums=(0, 1))).lower(*args).compile().memory_analysis()
    return {"batch": batch, "logits": batch * SEQ * VOCAB, "temp_bytes": mem.temp_size_in_bytes}


def _layer():
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    s, h, heads = LAYER["seq"], LAYER["hidden"], LAYER["heads"]

    def norm(x):
        return x * jax.lax.rsqrt((x.astype(jnp.float32) ** 2).mean(-1, keepdims=True) + 1e-6).astype(x.dtype)

    def layer(x, w):
        x = checkpoint_name(x, "decoder_layer_input")
        y = norm(x)
        q, k, v = (checkpoint_name(jnp.einsum("bsh,hd->bsd", y, w[n]), f"{n}_proj") for n in ("query", "key", "value"))
        heads_of = (lambda t: t.reshape(1, s, heads, h // heads))
        a = jax.nn.dot_product_attention(heads_of(q), heads_of(k), heads_of(v), is_causal=True)
        x = x + checkpoint_name(jnp.einsum("bsd,dh->bsh", a.reshape(1, s, h), w["out"]), "out_proj")
        y = norm(x)
        wi = [checkpoint_name(jnp.einsum("bsh,hf->bsf", y, w[f"wi{i}"]), f"mlpwi_{i}") for i in (0, 1)]
        return x + checkpoint_name(jnp.einsum("bsf,fh->bsh", jax.nn.silu(wi[0]) * wi[1], w["wo"]), "mlpwo")
    return layer


def _policy(mode: str):
    import jax
    named = {"offload_input": ["decoder_layer_input"],
             "offload_qkvo": ["decoder_layer_input", "query_proj", "key_proj", "value_proj", "out_proj"]}
    if mode == "full":
        return None
    if mode == "minimal":  # MaxText's 'minimal' until 2025-08 (models.py at 4378403a, 2024-06)
        return jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    if mode == "minimal_names":  # its 'minimal' since 6426085e (2025-08-29, decoders.py minimal_policy)
        return jax.checkpoint_policies.save_only_these_names(
            "query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=named[mode],
        offload_src="device", offload_dst="pinned_host")


def _scanned_model(mode: str):
    import jax
    import jax.numpy as jnp
    body = jax.checkpoint(_layer(), policy=_policy(mode), prevent_cse=False)

    def model(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (body(c, w), None), x, ws)
        return (y.astype(jnp.float32) ** 2).mean()
    return model


def _weight_shapes(layers: int) -> dict:
    h, f = LAYER["hidden"], LAYER["ffn"]
    shapes = {"query": (h, h), "key": (h, h), "value": (h, h), "out": (h, h), "wi0": (h, f), "wi1": (h, f), "wo": (f, h)}
    return {k: (layers,) + v for k, v in shapes.items()}


def remat_probe(dev, mode: str, layers: int) -> dict:
    import jax
    import jax.numpy as jnp
    ws = {k: _spec(dev, v, jnp.bfloat16) for k, v in _weight_shapes(layers).items()}
    x = _spec(dev, (1, LAYER["seq"], LAYER["hidden"]), jnp.bfloat16)
    mem = jax.jit(jax.grad(_scanned_model(mode))).lower(ws, x).compile().memory_analysis()
    return {"mode": mode, "layers": layers, "temp_bytes": mem.temp_size_in_bytes,
            "host_temp_bytes": getattr(mem, "host_temp_size_in_bytes", 0)}


def jaxpr_residuals(mode: str) -> float:
    """What JAX itself saves per layer under a policy, before XLA plans any buffer: the elements of
    the forward scan's stacked outputs (its residuals for backward) per layer, in layer inputs."""
    import jax
    import jax.numpy as jnp
    layers = 4
    ws = {k: jax.ShapeDtypeStruct(v, jnp.bfloat16) for k, v in _weight_shapes(layers).items()}
    x = jax.ShapeDtypeStruct((1, LAYER["seq"], LAYER["hidden"]), jnp.bfloat16)
    fwd = next(e for e in jax.make_jaxpr(jax.grad(_scanned_model(mode)))(ws, x).jaxpr.eqns if e.primitive.name == "scan")
    stacked = [v.aval for v in fwd.outvars if v.aval.ndim and v.aval.shape[0] == layers]
    return sum(a.size for a in stacked) / layers / (LAYER["seq"] * LAYER["hidden"])


REMAT_MODES = ("full", "offload_input", "offload_qkvo", "minimal", "minimal_names")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--modes", nargs="+", choices=REMAT_MODES, default=REMAT_MODES,
                        help="the remat policies to compile (default: all)")
    parser.add_argument("--no-loss", action="store_true", help="skip the loss probe")
    args = parser.parse_args()
    dev = _device()
    loss, slope = [], None
    if not args.no_loss:
        loss = [loss_probe(dev, b) for b in (1, 2, 3, 4)]
        for row in loss:
            print(f"loss batch {row['batch']}: {row['temp_bytes'] / row['logits']:.3f} B per logit")
        # from 2 sequences on (1 sequence compiles to a smaller constant part): the bytes each logit adds
        slope = (loss[-1]["temp_bytes"] - loss[1]["temp_bytes"]) / (loss[-1]["logits"] - loss[1]["logits"])
        print(f"loss: {slope:.3f} B per additional logit (2 to 4 sequences)")
    layer_input = 2 * LAYER["seq"] * LAYER["hidden"]
    remat = {}
    for mode in args.modes:
        few, many = remat_probe(dev, mode, 8), remat_probe(dev, mode, 24)
        per_layer = {k: (many[k] - few[k]) / 16 / layer_input for k in ("temp_bytes", "host_temp_bytes")}
        saved = jaxpr_residuals(mode)
        remat[mode] = {"runs": [few, many], "per_layer_in_layer_inputs": per_layer, "jaxpr_residuals": saved}
        print(f"remat {mode}: device {per_layer['temp_bytes']:.2f}, host {per_layer['host_temp_bytes']:.2f} "
              f"layer inputs per layer; the jaxpr's residuals {saved:.2f}")
    if args.out:
        import jax
        with open(args.out, "w") as fh:
            json.dump({"jax": jax.__version__, "loss": loss, "loss_bytes_per_logit": slope, "remat": remat,
                       "layer": LAYER}, fh, indent=1)


if __name__ == "__main__":
    main()
