"""Numbers and images from attention maps: locality, cross-layer similarity, rollout.

``attention_locality_score``: MaiT's ALS (Eq. 3), mass inside ``family.neighbourhood_mask``;
``mean_attention_distance``: ViT's Fig. 7 (Dosovitskiy et al. 2021; Raghu et al. 2021), and
``pooled_distance`` for keys on a pooled grid; ``cross_layer_similarity``: MaiT App. A.3 (DeepViT's);
``attention_rollout``: Abnar & Zuidema (2020), as IBiT's Fig. 5.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from locvit.models.family import AttentionMap, map_kind

_FUSE = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}  # over the heads
HEAD_FUSIONS = tuple(_FUSE)

__all__ = [
    "attention_locality_score",
    "attention_rollout",
    "cross_layer_similarity",
    "mean_attention_distance",
    "patch_distances",
    "pooled_distance",
    "rollout_blocker",
]


def attention_locality_score(attn: torch.Tensor, mask: torch.Tensor, num_prefix: int = 1) -> torch.Tensor:
    """MaiT's attention locality score (Eq. 3): (..., T, T) maps -> (...) scores.

    For each patch row n, ``ALS_n = sum_i (M * A)[n, i]``, the weight inside the row's
    neighbourhood ``M`` (bool (T, T), e.g. ``locvit.models.family.neighbourhood_mask``); the score is the
    mean over the N patch rows, the ``num_prefix`` class/distillation rows excluded. Leading
    dims (batch, layer, head) are kept. Meant for row-stochastic maps: a uniform map
    scores (neighbours) / T, one attending only inside the neighbourhood scores 1.
    """
    if mask.shape != attn.shape[-2:]:
        raise ValueError(f"mask {tuple(mask.shape)} does not match the maps' last two dims {tuple(attn.shape[-2:])}")
    inside = (attn * mask.to(attn.device, attn.dtype)).sum(dim=-1)  # (..., T): mass inside each row's neighbourhood
    return inside[..., num_prefix:].mean(dim=-1)


def patch_distances(grid: tuple[int, int]) -> torch.Tensor:
    """Euclidean distances between the patches of a ``(gh, gw)`` grid, row-major: (N, N), in patches."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], dim=-1)  # (N, 2)
    return torch.cdist(pos, pos)


def mean_attention_distance(
    attn: torch.Tensor, grid: tuple[int, int], num_prefix: int = 1, spacing: float = 1.0
) -> torch.Tensor:
    """Mean attention distance (ViT paper Fig. 7): (..., T, T) maps -> (...) distances in pixels.

    For each patch query n, ``d_n = sum_m A[n, m] |p_n - p_m| / sum_m A[n, m]`` over the N
    patch keys m on ``grid`` (``|.|``: Euclidean distance between patch centres, times
    ``spacing``, the pixels between neighbouring patches); the result is the mean over the
    N patch queries. The ``num_prefix`` class/distillation tokens have no position: their
    rows are left out and the patch rows renormalised over the patch keys (the weight a
    patch gives a class token says nothing about distance). Maps that are not row-stochastic
    (IBiT's Frobenius-normalised maps, CaiT's talking heads) should be passed as ``|A|``.
    Uniform attention gives the grid's mean pairwise distance; attention to self only, 0.
    """
    n = grid[0] * grid[1]
    if attn.shape[-1] != num_prefix + n or attn.shape[-2] != num_prefix + n:
        raise ValueError(
            f"maps of shape {tuple(attn.shape)} do not have {num_prefix} prefix + {n} patch tokens (grid {grid})"
        )
    a = attn[..., num_prefix:, num_prefix:].double()  # (..., N, N): patch queries over patch keys
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    dist = patch_distances(grid).to(a.device) * spacing
    return (a * dist).sum(dim=-1).mean(dim=-1).to(attn.dtype)


def pooled_distance(attn: torch.Tensor, grid: tuple[int, int], spacing: float = 1.0) -> torch.Tensor:
    """Mean attention distance of maps whose keys lie on a pooled grid: (..., N, M) -> (...) in pixels.

    The N queries are the patches of ``grid`` (gh, gw), row-major; the M keys the cells of that grid
    pooled by R in each direction (PVT's spatial reduction, Twins' sub-sampling: a stride-R conv), so
    ``M = (gh / R) * (gw / R)``; a key sits at its cell's centre. As ``mean_attention_distance``,
    the attention-weighted Euclidean distance (times ``spacing``, the pixels between neighbouring
    patches) averaged over the queries; with R = 1 the two agree.
    """
    gh, gw = grid
    n, m = attn.shape[-2], attn.shape[-1]
    r = round((n / m) ** 0.5) if m else 0
    if n != gh * gw or m == 0 or gh % r or gw % r or m != (gh // r) * (gw // r):
        raise ValueError(
            f"maps of shape {tuple(attn.shape)} do not have the {gh}x{gw} grid's patches as queries "
            f"and a pooled grid's cells as keys"
        )
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    queries = torch.stack([ys.flatten(), xs.flatten()], dim=-1)  # (N, 2), in patches
    cy, cx = torch.meshgrid(
        torch.arange(gh // r, dtype=torch.float64), torch.arange(gw // r, dtype=torch.float64), indexing="ij"
    )
    keys = (torch.stack([cy.flatten(), cx.flatten()], dim=-1) + 0.5) * r - 0.5  # (M, 2): cell centres
    a = attn.double()
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    dist = torch.cdist(queries, keys).to(a.device) * spacing
    return (a * dist).sum(dim=-1).mean(dim=-1).to(attn.dtype)


def cross_layer_similarity(attn: torch.Tensor) -> torch.Tensor:
    """MaiT App. A.3 (DeepViT's metric): (..., L, H, Tq, Tk) maps -> (H, L, L) similarities.

    ``S[h, i, j]`` is the cosine similarity of the rows ``A^i[h, t, :]`` and ``A^j[h, t, :]``,
    averaged over the Tq query tokens t. Leading dims (e.g. a batch) are averaged after the
    similarity is taken per map, so pass per-image maps ``(B, L, H, T, T)`` rather than
    their batch mean. An all-zero row has similarity 0 with every row.
    """
    if attn.dim() < 4:
        raise ValueError(f"cross_layer_similarity needs maps (..., L, H, Tq, Tk), got shape {tuple(attn.shape)}")
    rows = F.normalize(attn.float(), dim=-1)  # unit rows
    sim = torch.einsum("...ihqk,...jhqk->...hij", rows, rows) / attn.shape[-2]  # (..., H, L, L)
    return sim.reshape(-1, *sim.shape[-3:]).mean(dim=0)


def _layer_transition(record: AttentionMap, prefix: int, head_fusion: str) -> torch.Tensor:
    """One layer's rollout factor (B, T, T) over all ``prefix + N`` tokens: 0.5 A + 0.5 I.

    Tokens the layer does not update (CaiT's patches in class attention) or does not see
    (a class token that joins later: CaiT, ConViT) keep an identity row.
    """
    a = record.probs if map_kind(record.kind).rows_sum_to_one else record.probs.abs()  # (B, H, Tq, Tk)
    a = _FUSE[head_fusion](a, dim=1)  # (B, Tq, Tk)
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    b, tq, _ = a.shape
    t = prefix + record.grid[0] * record.grid[1]
    lo = prefix - record.num_prefix  # the layer's tokens are the last T - lo; its queries the first tq of those
    full = torch.eye(t).repeat(b, 1, 1)  # (B, T, T)
    full[:, lo : lo + tq] = 0.0
    full[:, lo : lo + tq, lo:] = a
    return 0.5 * full + 0.5 * torch.eye(t)


def rollout_blocker(maps: Sequence[AttentionMap]) -> str | None:
    """Why rollout cannot follow these layers, in words; None where it can: a class token over one patch
    grid, every map's keys the layer's own tokens, one map per image (not per window)."""
    if not maps:
        return "no attention layers"
    if max(m.num_prefix for m in maps) == 0:
        return "no class token to follow"
    if len({m.grid for m in maps}) > 1:
        grids = ", ".join("x".join(map(str, g)) for g in sorted({m.grid for m in maps}))
        return f"its layers see different grids ({grids})"
    odd = sorted({m.kind for m in maps if map_kind(m.kind).keys != "tokens" or map_kind(m.kind).windows})
    if odd:
        return f"its {', '.join(odd)} maps are not over the layer's own tokens, one per image"
    return None


def rollout_applies(maps: Sequence[AttentionMap]) -> bool:
    """Whether the layers follow a class token over one patch grid (``rollout_blocker``)."""
    return rollout_blocker(maps) is None


def attention_rollout(maps: Sequence[AttentionMap], head_fusion: str = "mean") -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020; IBiT Fig. 5): records -> (B, gh, gw) in [0, 1].

    Per layer: fuse the heads (``mean``, ``max`` or ``min``), renormalise the rows, add the
    residual as ``0.5 A + 0.5 I``; multiply the layers in forward order (``R = A_L ... A_1``)
    and read the class token's row (token 0) over the patches, scaled to max 1 (an all-zero
    row stays zero). The prefix-token count comes from the records. Maps that are not
    row-stochastic (``frobenius``: IBiT's signed, Frobenius-normalised maps; ``talking``:
    CaiT's post-softmax head mix) enter as ``|A|`` with its rows renormalised.

    Raises ``ValueError`` for models without a class token (LSA, NesT) or whose layers see
    different grids: rollout follows the class token over one patch grid.
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion: {head_fusion!r}; allowed values: {', '.join(HEAD_FUSIONS)}")
    if not maps:
        raise ValueError("attention_rollout: no attention maps given")
    prefix = max(m.num_prefix for m in maps)
    grids = {m.grid for m in maps}
    if not rollout_applies(maps):
        raise ValueError(
            f"attention_rollout follows a class token over one patch grid; these maps have "
            f"{prefix} prefix tokens, grids {sorted(grids)} and kinds {sorted({m.kind for m in maps})}"
        )
    rollout = None
    for record in maps:
        step = _layer_transition(record, prefix, head_fusion)  # (B, T, T)
        rollout = step if rollout is None else step @ rollout
    cls = rollout[:, 0, prefix:]  # (B, N): the class token's share of each patch
    cls = cls / cls.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(cls.dtype).tiny)
    return cls.reshape(-1, *grids.pop())
