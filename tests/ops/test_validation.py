"""Tests for the Great Expectations data-quality gates in ``lopd.ops.validation``."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from lopd.ops.validation import DataValidationError, validate_bank, validate_rollouts

N = 20
THRESHOLD = 0.5
DIM = 4


def rollouts() -> pd.DataFrame:
    """A valid rollouts frame: rewards alternate below/above the threshold."""
    reward = np.where(np.arange(N) % 2 == 0, 0.25, 0.75)
    return pd.DataFrame(
        {
            "rollout_id": [f"r{i}" for i in range(N)],
            "task_id": [f"t{i % 5}" for i in range(N)],
            "family": "arith",
            "reward": reward,
            "success": reward >= THRESHOLD,
            "actions_text": "answer 4",
            "n_turns": 1,
            "n_gen_tokens": 7,
            "n_tokens": 30,
        }
    )


def bank() -> pd.DataFrame:
    """A valid bank frame with ``DIM``-long embeddings."""
    return pd.DataFrame(
        {
            "bank_id": [f"b{i}" for i in range(N)],
            "task_id": [f"train{i}" for i in range(N)],
            "family": "arith",
            "app": "calc",
            "task_text": "what is 2+2?",
            "lite_text": "2+2",
            "reward": 1.0,
            "success": True,
            "embedding": [np.full(DIM, 0.5, dtype=np.float32) for _ in range(N)],
        }
    )


def failures(check: Callable[[], None]) -> list[tuple[str, int]]:
    """Run a gate expected to fail; return its (expectation, unexpected_count) pairs.

    Also checks the message has exactly one line per failure.
    """
    with pytest.raises(DataValidationError) as info:
        check()
    error = info.value
    assert len(str(error).splitlines()) == len(error.failures)
    return [(failure["expectation"], failure["unexpected_count"]) for failure in error.failures]


def test_valid_frames_pass() -> None:
    assert validate_rollouts(rollouts(), THRESHOLD) is None
    assert validate_bank(bank(), THRESHOLD, {"dev1", "test1"}, DIM) is None


def test_reward_out_of_range() -> None:
    df = rollouts()
    df.loc[[1, 3, 5], "reward"] = 1.5  # still a success, so only the range check fails
    with pytest.raises(DataValidationError) as info:
        validate_rollouts(df, THRESHOLD)
    assert str(info.value).startswith(
        "rollouts: expect_column_values_to_be_between(reward) failed on 3 of 20 rows"
    )
    assert [(f["expectation"], f["unexpected_count"]) for f in info.value.failures] == [
        ("expect_column_values_to_be_between(reward)", 3)
    ]


def test_success_inconsistent_with_threshold() -> None:
    df = rollouts()
    df.loc[[0, 2], "success"] = True  # reward 0.25 < 0.5
    assert failures(lambda: validate_rollouts(df, THRESHOLD)) == [
        ("expect_column_pair_values_a_to_be_greater_than_b(reward_reaches_threshold, success_int)", 2)
    ]


def test_an_episode_cut_at_the_turn_limit_may_reach_the_threshold_without_success() -> None:
    df = rollouts()
    df.loc[1, "success"] = False  # reward 0.75 >= 0.5, but the episode never finished
    validate_rollouts(df, THRESHOLD)


def test_threshold_is_applied() -> None:
    # Rewards of 0.75 are not successes at a 0.8 threshold.
    assert failures(lambda: validate_rollouts(rollouts(), 0.8)) == [
        ("expect_column_pair_values_a_to_be_greater_than_b(reward_reaches_threshold, success_int)", N // 2)
    ]


def test_no_action() -> None:
    df = rollouts()
    df.loc[4, "n_turns"] = 0
    assert failures(lambda: validate_rollouts(df, THRESHOLD)) == [("expect_column_values_to_be_between(n_turns)", 1)]
    df = rollouts()
    df.loc[4, "actions_text"] = ""  # an empty action is a policy's output, not broken data
    validate_rollouts(df, THRESHOLD)


def test_duplicate_rollout_ids() -> None:
    df = rollouts()
    df.loc[1, "rollout_id"] = "r0"
    assert failures(lambda: validate_rollouts(df, THRESHOLD)) == [
        ("expect_column_values_to_be_unique(rollout_id)", 2)
    ]


def test_zero_tokens() -> None:
    df = rollouts()
    df.loc[[0, 1], "n_gen_tokens"] = 0
    df.loc[2, "n_tokens"] = 0
    assert failures(lambda: validate_rollouts(df, THRESHOLD)) == [
        ("expect_column_values_to_be_between(n_gen_tokens)", 2),
        ("expect_column_values_to_be_between(n_tokens)", 1),
    ]


def test_null_value() -> None:
    df = rollouts()
    df.loc[6, "family"] = None
    assert failures(lambda: validate_rollouts(df, THRESHOLD)) == [
        ("expect_column_values_to_not_be_null(family)", 1)
    ]


def test_unevaluable_column_is_reported() -> None:
    df = rollouts().astype({"reward": str})
    with pytest.raises(DataValidationError) as info:
        validate_rollouts(df, THRESHOLD)
    assert str(info.value).startswith(
        "rollouts: expect_column_values_to_be_between(reward) could not be evaluated: "
    )


def test_missing_column() -> None:
    with pytest.raises(DataValidationError) as info:
        validate_rollouts(rollouts().drop(columns=["actions_text"]), THRESHOLD)
    assert str(info.value) == (
        "rollouts: expect_column_to_exist(actions_text) failed: column is missing"
    )


def test_empty_frame() -> None:
    with pytest.raises(DataValidationError) as info:
        validate_rollouts(rollouts().iloc[:0], THRESHOLD)
    assert str(info.value) == "rollouts: frame is empty (0 rows)"


def test_error_survives_pickling() -> None:
    failure = {"expectation": "x", "unexpected_count": 1, "detail": "d"}
    error = DataValidationError("bank", [failure])
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.suite, copy.failures) == (str(error), error.suite, error.failures)


def test_several_failures_one_line_each() -> None:
    df = rollouts()
    df.loc[1, "reward"] = -0.5  # also inconsistent with success=True
    df.loc[3, "n_turns"] = 0
    assert sorted(failures(lambda: validate_rollouts(df, THRESHOLD))) == [
        ("expect_column_pair_values_a_to_be_greater_than_b(reward_reaches_threshold, success_int)", 1),
        ("expect_column_values_to_be_between(n_turns)", 1),
        ("expect_column_values_to_be_between(reward)", 1),
    ]


def test_bank_forbidden_task_id() -> None:
    df = bank()
    df.loc[[2, 9], "task_id"] = ["dev1", "test1"]
    with pytest.raises(DataValidationError) as info:
        validate_bank(df, THRESHOLD, forbidden_task_ids={"dev1", "test1"})
    assert str(info.value).startswith(
        "bank: expect_column_values_to_not_be_in_set(task_id) failed on 2 of 20 rows"
    )


def test_bank_reward_below_threshold() -> None:
    df = bank()
    df.loc[[0, 1, 2], "reward"] = 0.4
    assert failures(lambda: validate_bank(df, THRESHOLD)) == [
        ("expect_column_values_to_be_between(reward)", 3)
    ]


def test_bank_success_must_be_true() -> None:
    df = bank()
    df.loc[5, "success"] = False
    assert failures(lambda: validate_bank(df, THRESHOLD)) == [
        ("expect_column_values_to_be_in_set(success)", 1)
    ]


def test_bank_empty_text() -> None:
    df = bank()
    df.loc[7, "lite_text"] = ""
    assert failures(lambda: validate_bank(df, THRESHOLD)) == [
        ("expect_column_value_lengths_to_be_between(lite_text)", 1)
    ]


def test_bank_wrong_embedding_length() -> None:
    df = bank()
    df.at[3, "embedding"] = np.zeros(DIM + 1)
    df.at[4, "embedding"] = [0.0]
    assert failures(lambda: validate_bank(df, THRESHOLD, embedding_dim=DIM)) == [
        ("expect_column_values_to_be_between(embedding_len)", 2)
    ]


def test_bank_nan_in_embedding() -> None:
    df = bank()
    df.at[8, "embedding"] = np.array([0.1, np.nan, 0.3, 0.4])
    assert failures(lambda: validate_bank(df, THRESHOLD, embedding_dim=DIM)) == [
        ("expect_column_values_to_be_in_set(embedding_has_nan)", 1)
    ]


def test_bank_embedding_column_required_only_with_dim() -> None:
    df = bank().drop(columns=["embedding"])
    assert validate_bank(df, THRESHOLD) is None
    assert failures(lambda: validate_bank(df, THRESHOLD, embedding_dim=DIM)) == [
        ("expect_column_to_exist(embedding)", N)
    ]
