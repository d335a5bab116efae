"""A patch's spatial neighbourhood as a token mask: what MaiT's masks keep and what ALS measures.

One definition below both users: :mod:`locvit.models.mait` masks attention with it, and
:mod:`locvit.analysis` scores any family's attention against it (MaiT's ALS, Eq. 3).
"""

from __future__ import annotations

import torch


def neighbourhood_mask(grid: tuple[int, int], kernel: tuple[int, int] = (3, 3), num_prefix: int = 1) -> torch.Tensor:
    """Boolean (T, T) mask, T = num_prefix + H*W: which key each query row keeps.

    Patch ``p`` at (r, c) keeps patches within ``kh // 2`` rows and ``kw // 2`` columns
    (``kernel = (kh, kw)``, both odd; no wrap at the borders). Prefix rows (class,
    distillation tokens) keep every key; patch rows keep no prefix column.
    """
    kh, kw = kernel
    if kh % 2 == 0 or kw % 2 == 0 or kh < 1 or kw < 1:
        raise ValueError(f"mask_kernel must be odd sizes like (3, 3) or (3, 5), got {kernel}")
    h, w = grid
    rows = torch.arange(h, device="cpu").repeat_interleave(w)  # (N,) row of each patch; built on the CPU
    cols = torch.arange(w, device="cpu").repeat(h)
    near = ((rows[:, None] - rows[None, :]).abs() <= kh // 2) & ((cols[:, None] - cols[None, :]).abs() <= kw // 2)
    t = num_prefix + h * w
    mask = torch.zeros(t, t, dtype=torch.bool, device="cpu")
    mask[:num_prefix] = True
    mask[num_prefix:, num_prefix:] = near
    return mask
