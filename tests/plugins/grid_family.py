"""A user's model family written outside locvit whose attention groups are strided across the image.

Grid attention (Tu et al. 2022, "MaxViT", Sec. 3.2): the patch grid is cut into groups of ``G x G`` tokens
that lie ``gh / G`` patches apart, spread over the whole image, and each token attends inside its group.
Its maps are a windowed kind whose windows are dilated (``grid``), declared here; nothing in locvit's src/
names it. Tests import it as a study's ``model_modules`` entry is imported.
"""

from timm.layers import Attention
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from locvit.models.family import AttentionSite, Family, MapKind, register_family, vit_blocks

GRID = MapKind(
    "grid",
    grid=True,
    rows_sum_to_one=True,
    windows=True,
    dilated=True,
    description="MaxViT's grid attention: softmax inside groups of tokens strided across the image",
)


class GridAttention(Attention):
    grid, group = (1, 1), 1  # the model's patch grid (gh, gw); G, a group's side

    def partition(self, x):
        """(B, N, C) tokens -> (B * K, G * G, C) groups; group k = a * (gw / G) + b holds the tokens at
        (i * gh / G + a, j * gw / G + b), (i, j) row-major in the group."""
        b, _, c = x.shape
        (gh, gw), g = self.grid, self.group
        x = x.view(b, g, gh // g, g, gw // g, c).permute(0, 2, 4, 1, 3, 5)  # (B, gh/G, gw/G, G, G, C)
        return x.reshape(-1, g * g, c)

    def unpartition(self, x, b):
        (gh, gw), g = self.grid, self.group
        x = x.view(b, gh // g, gw // g, g, g, -1).permute(0, 3, 1, 4, 2, 5)  # (B, G, gh/G, G, gw/G, C)
        return x.reshape(b, gh * gw, -1)

    def maps(self, groups):
        """Each group's softmax map (B * K, H, G * G, G * G), and its values."""
        n, t, _ = groups.shape
        q, k, v = self.qkv(groups).reshape(n, t, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return ((q * self.scale) @ k.transpose(-2, -1)).softmax(-1), v

    def forward(self, x, attn_mask=None, **kwargs):
        b, _, c = x.shape
        a, v = self.maps(self.partition(x))
        out = (a @ v).transpose(1, 2).reshape(-1, self.group**2, c)  # (B * K, G * G, C)
        return self.proj(self.unpartition(out, b))


class GridViT(VisionTransformer):
    """A ViT without a class token whose every block attends inside grid groups of ``group x group`` tokens."""

    def __init__(self, group=2, **kwargs):
        super().__init__(attn_layer=GridAttention, class_token=False, global_pool="avg", **kwargs)
        for block in self.blocks:
            block.attn.grid, block.attn.group = tuple(self.patch_embed.grid_size), group


@register_model
def grid_vit(pretrained=False, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("pretrained_") and k != "cache_dir"}
    return GridViT(**kwargs)


def read_grid(attn, x):
    return "grid", attn.maps(attn.partition(x))[0]


register_family(
    Family(
        "grid",
        "GridViT",
        GridViT,
        "attention inside groups of tokens strided across the image (MaxViT's grid attention)",
        vit_blocks,
        lambda m: [AttentionSite(b.attn, (b.attn.group,) * 2, read_grid, num_prefix=0) for b in m.blocks],
        models=("grid_",),
        kinds=(GRID,),
    )
)
