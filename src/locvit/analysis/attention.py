"""Attention maps of any model family, read from one ordinary forward pass.

``collect_attention`` hooks every attention layer the model's family declares
(``locvit.models.family``: the layers, the patch grid each sees, and a reader per
layer), runs the model once in eval mode, and recomputes each layer's attention weights
from the layer's own input with the layer's own projections: the weights the layer
applies to its values, whatever kernel (fused SDPA or eager) the layer itself runs.
Hooks only read, so the logits are those of a plain forward pass; no flag of the model
is touched. Record kinds, shapes and properties: ``locvit.models.family``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from locvit.models.family import AttentionMap, MapKind, family_of, map_kind

__all__ = ["AttentionMap", "MapKind", "collect_attention", "map_kind"]


@torch.no_grad()
def collect_attention(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[AttentionMap]]:
    """Run ``model`` once in eval mode; return its logits and one record per attention layer.

    Records come in forward order. The model is left as it was: hooks removed, every
    module's train/eval mode restored. A model no family claims is read by
    ``locvit.models.family.generic_family`` (a CNN has no records). Raises ``ValueError`` for an
    attention layer its family cannot read, or a map of a kind no family declares.
    """
    names = {module: name for name, module in model.named_modules()}
    records: list[AttentionMap] = []

    def hook_for(site):
        def hook(module, args, kwargs, output):
            if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
                raise ValueError(f"{names[module]}: an attn_mask / is_causal given at call time is not supported")
            extra = {k: v for k, v in kwargs.items() if k not in ("attn_mask", "is_causal")}  # Swin's mask
            kind, probs = site.read(module, *args, **extra)
            declared = map_kind(kind)  # a kind no family declares is an error here, not a wrong analysis later
            tokens = args[0].shape[-2]  # the layer's input tokens: prefix + patches (per block for NesT)
            patches = site.grid[0] * site.grid[1]
            prefix = tokens - patches if site.num_prefix is None else site.num_prefix
            keys = probs.shape[-1]  # fewer keys than patches: attention within windows (LSA), not a prefix's fault
            if declared.grid and declared.keys == "tokens" and keys >= patches and keys != prefix + patches:
                raise ValueError(
                    f"{names[module]}: its {kind} maps have {probs.shape[-1]} keys, not num_prefix {prefix} + the "
                    f"{patches} patches of its grid {tuple(site.grid)}; set the family's AttentionSite.num_prefix "
                    f"(left out, it is the layer's {tokens} input tokens less the grid's patches)"
                )
            records.append(AttentionMap(names[module], len(records), probs.float().cpu(), site.grid, prefix, kind))

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
