"""The checks of selective recompute by module (zero.recompute_modules, Megatron-Core's --recompute-modules):
which modules zsim models, with which granularity and on which models (docs/parallel-layouts.md, "By module").
"""

from __future__ import annotations

from zsim.config.schema import ScenarioFile
from zsim.errors import Fail


# Megatron-Core's other --recompute-modules (transformer_config.py recompute_modules), and why zsim has none
UNMODELLED_RECOMPUTE = {
    "shared_experts": "recomputing the shared experts",
}
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mlp", "moe", "mla_up_proj")


def check_recompute_modules(spec: ScenarioFile, fail: Fail) -> None:
    """zero.recompute_modules: with selective granularity only; each name one zsim models, once; the MoE ones
    on a model with MoE blocks (Megatron-Core's Transformer Engine layers fuse a dense block's norms into the
    linear after them, gpt_layer_specs.py, so only a MoE block's pre-MLP norm is a module to recompute).

    Raises:
        ConfigError (through `fail`, naming zero.recompute_modules): modules without selective granularity, a
        module zsim does not model or does not know, one named twice, or one the model has nothing for."""
    zero, key = spec.zero, "zero.recompute_modules"
    modules = zero.recompute_modules
    if modules is None:
        return
    if zero.recompute_granularity != "selective":
        raise fail(key, f"{modules} chooses what selective recompute recomputes, but zero.recompute_granularity is "
                   f"{zero.recompute_granularity} (set it to selective, as Megatron-Core's --recompute-modules needs)")
    for name in modules:
        if name in UNMODELLED_RECOMPUTE:
            raise fail(key, f"{name!r} ({UNMODELLED_RECOMPUTE[name]}) is Megatron-Core's but not modelled; zsim "
                       f"models {', '.join(RECOMPUTE_MODULES)}")
        if name not in RECOMPUTE_MODULES:
            raise fail(key, f"{name!r} is not a module to recompute; choose from {', '.join(RECOMPUTE_MODULES)}")
    if len(set(modules)) != len(modules):
        raise fail(key, f"{modules} names a module twice")
    if "mla_up_proj" in modules and spec.model.mla is None:  # Megatron-Core asserts multi_latent_attention
        raise fail(key, "'mla_up_proj' recomputes multi-head latent attention's up projections, but the model has "
                   "none (model.mla)")
    if spec.model.moe is None:
        for name in ("layernorm", "moe_act", "moe"):
            if name in modules:
                raise fail(key, f"{name!r} recomputes a part of a MoE block, but the model has none (model.moe)"
                           + ("; a dense block's norms are fused into the linear after them (Megatron-Core with "
                              "Transformer Engine), so there is nothing to recompute" if name == "layernorm" else ""))
    elif "mlp" in modules and spec.model.moe.dense_layers == 0:
        raise fail(key, "'mlp' recomputes a dense block's MLP, but every block of this model is a MoE block; "
                   "'moe' recomputes those")
