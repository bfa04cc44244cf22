"""The distillation data's cache: prompt rounds are drawn afresh and cached one by one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decoding.distill.cache import data_path, generations_path, round_configs
from decoding.distill.data import DataConfig
from decoding.distill.run import checkpoint_path
from decoding.distill.train import TrainConfig
from tests.conftest import TinyFactory


def test_rounds_draw_fresh_prompts_and_reuse_the_rounds_made_before(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    two = DataConfig(seed=3, rounds=2)
    first, second = round_configs(two)
    assert (first.seed, second.seed) == (3, 4) and first.rounds == second.rounds == 1
    assert first.text_sequences == two.text_sequences > 0 and second.text_sequences == 0  # text comes once
    # round 0 of two is the one-round set of its seed, and round 1's generations those of the next seed:
    # a run with more rounds finds the files of the runs before it
    assert data_path(target, first) == data_path(target, DataConfig(seed=3))
    assert generations_path(target, second) == generations_path(target, DataConfig(seed=4))
    assert data_path(target, second) != data_path(target, first)
    assert [c.seed for c in round_configs(DataConfig(seed=3))] == [3]


def test_a_data_set_needs_a_round() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        DataConfig(rounds=0)


def test_a_resume_with_a_longer_time_limit_finds_its_checkpoint(tiny_model: TinyFactory) -> None:
    target = tiny_model(vocab_size=16, dtype=torch.float32, seed=2)
    data = DataConfig(seed=3, rounds=2)
    config = TrainConfig(design="eagle", minutes=30)
    assert checkpoint_path(target, data, replace(config, minutes=45)) == checkpoint_path(target, data, config)
    assert checkpoint_path(target, data, replace(config, lr=config.lr / 2)) != checkpoint_path(target, data, config)
    assert checkpoint_path(target, replace(data, rounds=3), config) != checkpoint_path(target, data, config)
