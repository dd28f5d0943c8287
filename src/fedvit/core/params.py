"""Parameter names and roles in timm's VisionTransformer: defences and attacks address parameters only by name."""

from __future__ import annotations

POS_EMBED = "pos_embed"
PATCH_EMBED_WEIGHT = "patch_embed.proj.weight"
PATCH_EMBED_BIAS = "patch_embed.proj.bias"
CLS_TOKEN = "cls_token"
QKV0_WEIGHT = "blocks.0.attn.qkv.weight"
QKV0_BIAS = "blocks.0.attn.qkv.bias"
HEAD_WEIGHT = "head.weight"
HEAD_BIAS = "head.bias"
VIS_HEAD = "head_vis"  # the second head of model.head = "cls+vis"

PARAM_ROLES: dict[str, tuple[str, ...]] = {
    "position-embedding": (POS_EMBED,),
    "patch-embedding": (PATCH_EMBED_WEIGHT, PATCH_EMBED_BIAS),
    "class-token": (CLS_TOKEN,),
    "qkv-block-0": (QKV0_WEIGHT, QKV0_BIAS),
    "classifier-head": (HEAD_WEIGHT, HEAD_BIAS),
}

# The only parameters the encrypted-vit key touches (patch embedding: E_a, position embedding: E_b).
ENCRYPTED = (PATCH_EMBED_WEIGHT, POS_EMBED)
