"""locvit: one pipeline to train and compare vision transformers with locality biases.

Importing ``locvit.models`` registers every family with timm; the rest builds models by name. The layers the
imports keep (``LAYERS``, lowest first; a module imports its own layer or a lower one, and no two packages
import each other: ``tests/test_imports.py`` reads ``locvit.versioning.import_graph``): 1. ``errors``, ``io``,
``layout``, ``device``, ``model_modules``, ``checkpoint`` (no model, no config); 2. ``data``, ``models``;
3. ``config``, ``versioning``; 4. ``tracking``; 5. ``train``; 6. ``analysis``; 7. ``report`` (the throughput CSV
read through ``io``, without torch), ``status``; 8. ``cli``, ``__main__``. What a lower layer needs from a higher
one moves down.
"""

__version__ = "0.1.0"

#: The layers of ``locvit``'s top-level modules and packages, lowest first (see above).
LAYERS = (
    ("errors", "io", "layout", "device", "model_modules", "checkpoint"),
    ("data", "models"),
    ("config", "versioning"),
    ("tracking",),
    ("train",),
    ("analysis",),
    ("report", "status"),
    ("cli", "__main__"),
)
