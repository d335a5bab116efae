"""locvit: one pipeline to train and compare vision transformers with locality biases.

Importing :mod:`locvit.models` registers every model family with timm; everything
else builds models by name with ``timm.create_model``.

The layers the imports keep (:data:`LAYERS`), lowest first; a module imports modules of its own
layer or of a lower one, never of a higher one, and no two packages import each other
(``tests/test_imports.py`` reads the import graph, :func:`locvit.versioning.import_graph`):

1. the core: ``errors``, ``io``, ``layout``, ``device``, ``model_modules``, ``checkpoint``: no torch model,
   no config;
2. the data and the models: ``data``, ``models``;
3. the config: ``config`` (params.yaml, its schema, the run and job configs, the model checks),
   ``versioning``;
4. ``tracking`` (MLflow);
5. ``train`` (training and evaluation);
6. ``analysis`` (attention analyses, profiles, throughput, the mask search's rounds);
7. ``report`` (tables and figures from the files the steps wrote; the throughput CSV is read
   through ``io``, without torch or the models);
8. the command line: ``cli``, ``__main__``.

Whatever a lower layer needs from a higher one moves down (as the throughput CSV's reader did).
"""

__version__ = "0.1.0"

#: The layers of :mod:`locvit`'s top-level modules and packages, lowest first (see above).
LAYERS = (
    ("errors", "io", "layout", "device", "model_modules", "checkpoint"),
    ("data", "models"),
    ("config", "versioning"),
    ("tracking",),
    ("train",),
    ("analysis",),
    ("report",),
    ("cli", "__main__"),
)
