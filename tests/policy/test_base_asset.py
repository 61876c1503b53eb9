"""The committed embedded base (lopd/assets/base): small, float16, what the demo profile asks for,
and its recorded dev success reproduces."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from lopd.config import load_params
from lopd.policy import base_asset
from lopd.stages.bootstrap import measure

pytestmark = pytest.mark.skipif(not (base_asset.ASSET_DIR / base_asset.RECORD).exists(),
                                reason="no committed base in lopd/assets/base (lopd export-base writes one)")


def test_the_committed_base_is_small_float16_safetensors_with_a_model_card():
    weights = base_asset.ASSET_DIR / "model.safetensors"
    assert weights.stat().st_size <= 8 * 2**20
    with safe_open(weights, "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    card = (base_asset.ASSET_DIR / base_asset.CARD).read_text()
    record = base_asset.read_record()
    assert record["command"] in card and "lopd export-base" in record["command"] and "bootstrap.source=train" in record["command"]
    assert f"{record['metrics']['dev_success_rate']:.3f}" in card
    assert not any(str(v).startswith("/") for v in record["recipe"].values())  # no machine paths
    json.dumps(record)


def test_the_demo_profile_uses_the_committed_base_and_its_dev_success_reproduces():
    p = load_params("params.yaml", "demo", [])
    assert p.bootstrap.source == "committed"
    record = base_asset.check_recipe(p)  # the demo profile asks for exactly this base
    got = measure(p, base_asset.ASSET_DIR)
    want = record["metrics"]
    assert got["eval"] == want["eval"]
    assert (got["dev_success_rate"], got["dev_success_by_group"], got["dev_mean_reward"]) == (
        want["dev_success_rate"], want["dev_success_by_group"], want["dev_mean_reward"])
    assert got["dev_chance"] == want["dev_chance"]  # the policies that learn nothing, on the same dev tasks
    assert 0.25 <= got["dev_success_rate"] <= 0.65  # mediocre on purpose
    assert got["dev_success_by_group"]["pretrain"] > got["dev_success_by_group"]["new"]
    # it knows the pre-training apps' conventions, far beyond any fixed guess
    assert got["dev_success_by_group"]["pretrain"] >= got["dev_chance"]["success_by_group"]["pretrain"] + 0.25
