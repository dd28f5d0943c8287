import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from fedvit.core.config import ModelConfig
from fedvit.core.model import PretrainedWeightsError, build_model, get_weights, role_params, set_weights
from fedvit.core.params import PARAM_ROLES

TINY = ModelConfig()


def test_overrides_apply():
    m = build_model(dataclasses.replace(TINY, embed_dim=48, depth=3, num_heads=3, patch_size=4), num_classes=7)
    assert m.pos_embed.shape == (1, 1 + (32 // 4) ** 2, 48)
    assert len(m.blocks) == 3 and m.head.out_features == 7


def test_roles_name_existing_parameters():
    m = build_model(TINY, num_classes=10)
    names = dict(m.named_parameters())
    for role in PARAM_ROLES:
        assert all(n in names for n in role_params(m, role))
    assert role_params(m, "position-embedding") == ["pos_embed"]
    assert names["blocks.0.attn.qkv.weight"].shape == (3 * 64, 64)


def test_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = get_weights(build_model(TINY, 10, seed=5))
    after = torch.rand(1)
    b = get_weights(build_model(TINY, 10, seed=5))
    assert before == after
    assert all((a[k] == b[k]).all() for k in a)


def test_local_pretrained_file_is_loaded(tmp_path):
    source = build_model(TINY, 10, seed=9)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    loaded = build_model(dataclasses.replace(TINY, pretrained=str(path)), 10, seed=0)
    for k, v in get_weights(source).items():
        assert (get_weights(loaded)[k] == v).all(), k


def test_missing_weights_file_is_a_clear_error(tmp_path):
    with pytest.raises(PretrainedWeightsError, match="no such file"):
        build_model(dataclasses.replace(TINY, pretrained=str(tmp_path / "nope.safetensors")), 10)


def test_offline_hub_says_how_to_supply_a_file(monkeypatch):
    # What an offline machine sees, without waiting for network retries.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(PretrainedWeightsError, match="model.pretrained="):
        build_model(dataclasses.replace(TINY, pretrained="hub"), 10)


def test_set_weights_rejects_wrong_shapes():
    m = build_model(TINY, 10)
    w = get_weights(m)
    w["head.bias"] = w["head.bias"][:3]
    with pytest.raises(ValueError, match="head.bias"):
        set_weights(m, w)
