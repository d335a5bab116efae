"""Attention maps of any model family, read from one ordinary forward pass.

:func:`collect_attention` hooks every attention layer the model's family declares
(:mod:`locvit.models.family`: the layers, the patch grid each sees, and a reader per
layer), runs the model once in eval mode, and recomputes each layer's attention weights
from the layer's own input with the layer's own projections: the weights the layer
applies to its values, whatever kernel (fused SDPA or eager) the layer itself runs.
Hooks only read, so the logits are those of a plain forward pass; no flag of the model
is touched. Record kinds and shapes: :mod:`locvit.models.family`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from locvit.models.family import GRID_KINDS, KINDS, ROW_STOCHASTIC, AttentionMap, family_of

__all__ = ["AttentionMap", "GRID_KINDS", "KINDS", "ROW_STOCHASTIC", "collect_attention"]


@torch.no_grad()
def collect_attention(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[AttentionMap]]:
    """Run ``model`` once in eval mode; return its logits and one record per attention layer.

    Records come in forward order. The model is left as it was: hooks removed, every
    module's train/eval mode restored. Raises ``ValueError`` for a model of no registered
    family, or an attention layer its family cannot read.
    """
    names = {module: name for name, module in model.named_modules()}
    records: list[AttentionMap] = []

    def hook_for(site):
        def hook(module, args, kwargs, output):
            if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
                raise ValueError(f"{names[module]}: an attn_mask / is_causal given at call time is not supported")
            kind, probs = site.read(module, *args)
            tokens = args[0].shape[-2]  # the layer's input tokens: prefix + patches (per block for NesT)
            records.append(AttentionMap(names[module], len(records), probs.float().cpu(), site.grid,
                                        tokens - site.grid[0] * site.grid[1], kind))
        return hook

    sites = family_of(model).sites(model)  # raises for a model or a layer its family cannot read
    modes = [(m, m.training) for m in model.modules()]
    handles = [site.module.register_forward_hook(hook_for(site), with_kwargs=True) for site in sites]
    try:
        model.eval()
        logits = model(images)
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes:
            m.training = training
    return logits, records
