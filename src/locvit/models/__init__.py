"""locvit's model families, registered with timm on import.

Every model is then built by name: ``timm.create_model("<name>", **kwargs)``.
The families (MaiT, LSA, IBiT) arrive in their own modules; the baselines (DeiT,
CaiT, ConViT, NesT) come straight from timm.
"""

from locvit.models import ibit  # noqa: F401  (registers ibit_* entrypoints)
from locvit.models import mait  # noqa: F401  (registers mait_* entrypoints)
from locvit.models import lsa  # noqa: F401  (registers lsa_* entrypoints)
