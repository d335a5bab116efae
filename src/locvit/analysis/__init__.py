"""Analysis of trained models: attention maps of every family and what is measured on them.

Map kinds and extras are the families' declarations (``locvit.models.family``). Modules: ``attention``,
``metrics``, ``analyse`` (the step), ``profile``, ``throughput``, ``search`` (the mask search's rounds). The
package imports none of them, so the mask search's training job runs no attention code.
"""
