"""locvit: one pipeline to train and compare vision transformers with locality biases.

Importing :mod:`locvit.models` registers every model family with timm; everything
else builds models by name with ``timm.create_model``.
"""

__version__ = "0.1.0"
