"""locvit's model families, registered with timm on import.

Every model is then built by name: ``timm.create_model("<name>", **kwargs)``.
The families (MaiT, LSA, IBiT) live in their own modules; the baselines (DeiT,
CaiT, ConViT, NesT) come straight from timm, with their 32x32 settings (and the
NesT paper's CIFAR NesT-T, ``nest_tiny_cifar``) in ``baselines``.
"""

from locvit.models import ibit  # noqa: F401  (registers ibit_* entrypoints)
from locvit.models import mait  # noqa: F401  (registers mait_* entrypoints)
from locvit.models import lsa  # noqa: F401  (registers lsa_* entrypoints)
from locvit.models import baselines  # noqa: F401  (registers nest_tiny_cifar)
