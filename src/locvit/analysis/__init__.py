"""Analysis of trained models: attention maps of every family, and what is measured on them
(locality score, mean attention distance, cross-layer similarity, rollout).

Record kinds, their shapes and properties (:class:`MapKind`, declared by the families):
:mod:`locvit.models.family`; family-specific outputs (IBiT's
learned masks, MaiT's soft-mask alphas) come from each family's declared ``extras``. The
neighbourhood ALS scores against is :func:`locvit.models.family.neighbourhood_mask`'s, the one MaiT's masks keep.

Modules: ``attention`` (:func:`~locvit.analysis.attention.collect_attention`), ``metrics`` (the
scores), ``analyse`` (the analyse step), ``profile``, ``throughput`` (the throughput job), ``search``
(the mask search's rounds, pure Python). The package imports none of them: a module that needs one
imports it, so the mask search's training job runs no attention code (and its DVC stage does not
depend on it, :func:`locvit.versioning.import_graph`).
"""
