"""Analysis of trained models: attention maps of every family, and what MaiT, IBiT and
DeepViT measure on them (locality score, cross-layer similarity, rollout, learned masks).

Record kinds and shapes: :mod:`locvit.analysis.attention`.
"""

from locvit.analysis.attention import KINDS, ROW_STOCHASTIC, AttentionMap, collect_attention
from locvit.analysis.masks import learned_masks, soft_mask_alphas
from locvit.analysis.metrics import (HEAD_FUSIONS, attention_locality_score, attention_rollout,
                                     cross_layer_similarity, neighbourhood_mask)

__all__ = ["AttentionMap", "HEAD_FUSIONS", "KINDS", "ROW_STOCHASTIC", "attention_locality_score", "attention_rollout",
           "collect_attention", "cross_layer_similarity", "learned_masks", "neighbourhood_mask", "soft_mask_alphas"]
