"""The masks a model learned: IBiT's low-rank masks and MaiT's soft-mask alphas."""

from __future__ import annotations

import torch
import torch.nn as nn

from locvit.models.ibit import LearnedMaskAttention
from locvit.models.mait import MaskedAttention, MaskedTalkingHeadAttn


@torch.no_grad()
def learned_masks(model: nn.Module) -> torch.Tensor:
    """IBiT's learned masks as images: (L, H, gh, gw) float32 on the CPU.

    Per layer and head, the row of the mask ``M`` (``full_mask()``, before the 1/sqrt(d)
    scale) that belongs to the centre patch ``(gh // 2, gw // 2)``, over the patch keys:
    at initialisation the radial kernel ``exp(-0.5 d)`` around that patch (IBiT Sec. 3.3).
    """
    attns = [m for m in model.modules() if isinstance(m, LearnedMaskAttention)]
    if not attns:
        raise ValueError(f"learned_masks: {type(model).__name__} has no IBiT learned-mask attention layer")
    images = []
    for attn in attns:
        (gh, gw), p = attn.fit.grid, attn.num_prefix
        centre = p + (gh // 2) * gw + gw // 2  # the centre patch's token
        images.append(attn.full_mask()[:, centre, p:].reshape(-1, gh, gw))  # (H, gh, gw)
    return torch.stack(images).float().cpu()


@torch.no_grad()
def soft_mask_alphas(model: nn.Module) -> torch.Tensor:
    """MaiT's soft-mask alphas (Sec. 4.3): (L, H) float32 on the CPU, NaN for heads without one.

    ``alpha = sigmoid(a)`` scales a soft-masked head's logits outside the neighbourhood; L
    counts MaiT's (or masked CaiT's self-attention) layers, soft-masked or not.
    """
    attns = [m for m in model.modules() if isinstance(m, (MaskedAttention, MaskedTalkingHeadAttn))]
    if not any(attn.masks.alpha() is not None for attn in attns):
        raise ValueError(f"soft_mask_alphas: {type(model).__name__} has no MaiT soft mask "
                         f"(build it with mask_type='soft')")
    alphas = torch.full((len(attns), attns[0].num_heads), float("nan"))
    for layer, attn in enumerate(attns):
        alpha = attn.masks.alpha()
        if alpha is not None:
            alphas[layer, attn.masks.heads.cpu()] = alpha.float().cpu()
    return alphas
