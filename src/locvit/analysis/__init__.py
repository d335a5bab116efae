"""Analysis of trained models: attention maps of every family, and what is measured on them
(locality score, mean attention distance, cross-layer similarity, rollout).

Record kinds, their shapes and properties (:class:`MapKind`, declared by the families):
:mod:`locvit.models.family`; family-specific outputs (IBiT's
learned masks, MaiT's soft-mask alphas) come from each family's declared ``extras``. The
neighbourhood ALS scores against is :mod:`locvit.neighbourhood`'s, the one MaiT's masks keep.
"""

from locvit.analysis.attention import AttentionMap, MapKind, collect_attention, map_kind
from locvit.analysis.metrics import (HEAD_FUSIONS, attention_locality_score, attention_rollout,
                                     cross_layer_similarity, mean_attention_distance)
from locvit.neighbourhood import neighbourhood_mask

__all__ = ["AttentionMap", "HEAD_FUSIONS", "MapKind", "attention_locality_score", "attention_rollout",
           "collect_attention", "map_kind", "cross_layer_similarity", "mean_attention_distance", "neighbourhood_mask"]
