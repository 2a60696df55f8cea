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
  of the layer input, ``2 n h`` bytes.

Run: ``python benchmarks/xla_tpu_probe.py [--out FILE.json]`` (about 10 minutes on 2 cores).
Results of 2026-11-29 (jax 0.10.2, libtpu 0.0.42.1): ``benchmarks/results/xla_tpu_probe_v6e_2026-11-29.json``.
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
        up = jax.nn.silu(jnp.einsum("bsh,hf->bsf", y, w["wi0"])) * jnp.einsum("bsh,hf->bsf", y, w["wi1"])
        return x + jnp.einsum("bsf,fh->bsh", up, w["wo"])
    return layer


def _policy(mode: str):
    import jax
    named = {"offload_input": ["decoder_layer_input"],
             "offload_qkvo": ["decoder_layer_input", "query_proj", "key_proj", "value_proj", "out_proj"]}
    if mode == "full":
        return None
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=named[mode],
        offload_src="device", offload_dst="pinned_host")


def remat_probe(dev, mode: str, layers: int) -> dict:
    import jax
    import jax.numpy as jnp
    s, h, f = LAYER["seq"], LAYER["hidden"], LAYER["ffn"]
    body = jax.checkpoint(_layer(), policy=_policy(mode), prevent_cse=False)

    def model(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (body(c, w), None), x, ws)
        return (y.astype(jnp.float32) ** 2).mean()

    shapes = {"query": (h, h), "key": (h, h), "value": (h, h), "out": (h, h), "wi0": (h, f), "wi1": (h, f), "wo": (f, h)}
    ws = {k: _spec(dev, (layers,) + v, jnp.bfloat16) for k, v in shapes.items()}
    mem = jax.jit(jax.grad(model)).lower(ws, _spec(dev, (1, s, h), jnp.bfloat16)).compile().memory_analysis()
    return {"mode": mode, "layers": layers, "temp_bytes": mem.temp_size_in_bytes,
            "host_temp_bytes": getattr(mem, "host_temp_size_in_bytes", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    dev = _device()
    loss = [loss_probe(dev, b) for b in (1, 2, 3, 4)]
    for row in loss:
        print(f"loss batch {row['batch']}: {row['temp_bytes'] / row['logits']:.3f} B per logit")
    # from 2 sequences on (1 sequence compiles to a smaller constant part): the bytes each logit adds
    slope = (loss[-1]["temp_bytes"] - loss[1]["temp_bytes"]) / (loss[-1]["logits"] - loss[1]["logits"])
    print(f"loss: {slope:.3f} B per additional logit (2 to 4 sequences)")
    layer_input = 2 * LAYER["seq"] * LAYER["hidden"]
    remat = {}
    for mode in ("full", "offload_input", "offload_qkvo"):
        few, many = remat_probe(dev, mode, 8), remat_probe(dev, mode, 24)
        per_layer = {k: (many[k] - few[k]) / 16 / layer_input for k in ("temp_bytes", "host_temp_bytes")}
        remat[mode] = {"runs": [few, many], "per_layer_in_layer_inputs": per_layer}
        print(f"remat {mode}: device {per_layer['temp_bytes']:.2f}, host {per_layer['host_temp_bytes']:.2f} "
              "layer inputs per layer")
    if args.out:
        import jax
        with open(args.out, "w") as fh:
            json.dump({"jax": jax.__version__, "loss": loss, "loss_bytes_per_logit": slope, "remat": remat,
                       "layer": LAYER}, fh, indent=1)


if __name__ == "__main__":
    main()
