"""A user's model family written outside locvit, with a kind of attention map locvit does not know.

Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): ``phi(q) (phi(k)^T v)`` normalised
by ``phi(q) sum_j phi(k_j)``, with ``phi = elu + 1``, computed in linear time without forming the map.
Its map ``phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`` has rows that sum to one and no softmax:
a kind of its own (``linear``), declared here with its properties; nothing in locvit's src/ names it.
Tests copy this file into a study's working directory and name it in params.yaml's ``model_modules``.
"""

import torch.nn.functional as F
from timm.layers import Attention
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from locvit.models.family import Family, MapKind, register_family, vit_blocks, vit_sites

LINEAR = MapKind(
    "linear",
    grid=True,
    rows_sum_to_one=True,
    keys="tokens",
    description="linear attention: phi(q) phi(k)^T normalised per row, phi = elu + 1",
)


class LinearAttention(Attention):
    def features(self, x):
        """phi(q), phi(k), v: (B, H, T, hd) each."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return F.elu(q) + 1, F.elu(k) + 1, v

    def maps(self, x):
        q, k, _ = self.features(x)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T), positive
        return scores / scores.sum(-1, keepdim=True)

    def forward(self, x, attn_mask=None, **kwargs):
        b, t, c = x.shape
        q, k, v = self.features(x)
        kv = k.transpose(-2, -1) @ v  # (B, H, hd, hd): linear in T
        norm = q @ k.sum(-2, keepdim=True).transpose(-2, -1)  # (B, H, T, 1)
        return self.proj(((q @ kv) / norm).transpose(1, 2).reshape(b, t, c))


class LinearViT(VisionTransformer):
    def __init__(self, **kwargs):
        super().__init__(attn_layer=LinearAttention, **kwargs)


@register_model
def linear_vit(pretrained=False, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("pretrained_") and k != "cache_dir"}
    return LinearViT(**kwargs)


register_family(
    Family(
        "linear",
        "LinearViT",
        LinearViT,
        "none: global linear attention (no softmax)",
        vit_blocks,
        lambda m: vit_sites(m, {LinearAttention: lambda attn, x: ("linear", attn.maps(x))}),
        models=("linear_",),
        kinds=(LINEAR,),
    )
)
