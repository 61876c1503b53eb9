"""Data-quality gates for rollout and bank frames, backed by Great Expectations (GX Core 1.x).

Callers validate a frame *before* writing it anywhere: the gates only return ``None`` or raise
:class:`DataValidationError`, whose message has one line per failed expectation with the exact
number of failing rows. GX is imported lazily (it takes seconds), analytics and progress bars are
off, and one ephemeral context with a single whole-dataframe batch definition is reused for every
call. Not thread-safe: the shared batch definition is used by one validation at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

if TYPE_CHECKING:
    from great_expectations.core import ExpectationValidationResult
    from great_expectations.core.batch_definition import BatchDefinition
    from great_expectations.expectations import Expectation

__all__ = ["DataValidationError", "experience_reasons", "validate_bank", "validate_rollouts"]

ROLLOUT_COLUMNS = (
    "rollout_id",
    "task_id",
    "family",
    "reward",
    "success",
    "actions_text",
    "n_turns",
    "n_gen_tokens",
    "n_tokens",
)
BANK_COLUMNS = ("bank_id", "task_id", "family", "app", "task_text", "lite_text", "reward", "success")
# A deployed trajectory as `lopd ingest` reads it (docs/operate.md), and what the ingest derives beside it.
EXPERIENCE_COLUMNS = ("task_id", "messages", "verdict", "reward")
EXPERIENCE_DERIVED = ("task_split", "replay_ok", "verdict_matches", "lite_text_ok", "duplicate")

# How many failing values each message line shows. GX's BASIC result format (values, not row
# labels) is used: SUMMARY adds row labels but costs ~50 ms more per call.
_SAMPLE_VALUES = 3


class DataValidationError(ValueError):
    """Raised when a frame fails its suite.

    ``str()`` lists each failed expectation with how many rows failed, one per line, prefixed by
    the suite name. ``failures`` holds one dict per line: ``expectation`` (type and column),
    ``unexpected_count`` (failing rows; every row when a column is missing or GX could not
    evaluate the expectation) and ``detail`` (the line without the suite prefix).
    """

    def __init__(self, suite: str, failures: list[dict]) -> None:
        self.suite = suite
        self.failures = failures
        super().__init__("\n".join(f"{suite}: {failure['detail']}" for failure in failures))

    def __reduce__(self) -> tuple[type[DataValidationError], tuple[str, list[dict]]]:
        """Pickle by constructor arguments (e.g. when a Prefect task re-raises it elsewhere)."""
        return (type(self), (self.suite, self.failures))


def validate_rollouts(df: pd.DataFrame, success_threshold: float) -> None:
    """Validate a rollouts frame; raise :class:`DataValidationError` listing every failure.

    Checks: required columns present and non-null, ``rollout_id`` unique, ``reward`` in [0, 1],
    ``success`` only where ``reward >= success_threshold`` (row-wise; not the converse: an episode
    cut at the turn limit is no success whatever its reward), at least one action (``n_turns``;
    an action's text may be empty: a policy can end a turn at once) and positive
    ``n_gen_tokens`` / ``n_tokens``.
    """
    import great_expectations.expectations as gxe

    suite = "rollouts"
    _check_shape(suite, df, ROLLOUT_COLUMNS)
    reward = pd.to_numeric(df["reward"], errors="coerce")
    # success needs reward >= threshold; the converse fails for an episode cut at the turn limit
    frame = df.assign(reward_reaches_threshold=(reward >= success_threshold).astype(int), success_int=df["success"].astype(int))
    expectations = [
        *_not_null(ROLLOUT_COLUMNS),
        gxe.ExpectColumnValuesToBeUnique(column="rollout_id", description="ids must be unique"),
        gxe.ExpectColumnValuesToBeBetween(
            column="reward", min_value=0.0, max_value=1.0, description="reward must be in [0, 1]"
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="reward_reaches_threshold",
            column_B="success_int",
            or_equal=True,
            description=f"success needs reward >= {success_threshold}",
        ),
        *(
            gxe.ExpectColumnValuesToBeBetween(
                column=column, min_value=0, strict_min=True, description="count must be > 0"
            )
            for column in ("n_turns", "n_gen_tokens", "n_tokens")
        ),
    ]
    _run_suite(suite, frame, expectations)


def validate_bank(
    df: pd.DataFrame,
    success_threshold: float,
    forbidden_task_ids: AbstractSet[str] = frozenset(),
    embedding_dim: int | None = None,
) -> None:
    """Validate a bank frame; raise :class:`DataValidationError` listing every failure.

    Checks: required columns present and non-null, ``bank_id`` unique, non-empty ``task_text``
    and ``lite_text``, ``reward`` in [success_threshold, 1], ``success`` all True; ``task_id`` not
    in ``forbidden_task_ids`` (dev/test ids) when given; and when ``embedding_dim`` is given, an
    ``embedding`` column whose values have exactly that length and contain no NaN.
    """
    import great_expectations.expectations as gxe

    suite = "bank"
    required = BANK_COLUMNS + (("embedding",) if embedding_dim is not None else ())
    _check_shape(suite, df, required)
    expectations = [
        *_not_null(required),
        gxe.ExpectColumnValuesToBeUnique(column="bank_id", description="ids must be unique"),
        *(
            gxe.ExpectColumnValueLengthsToBeBetween(
                column=column, min_value=1, description="text must be non-empty"
            )
            for column in ("task_text", "lite_text")
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="reward",
            min_value=success_threshold,
            max_value=1.0,
            description=f"reward must be in [{success_threshold}, 1]",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="success", value_set=[True], description="only successes enter the bank"
        ),
    ]
    if forbidden_task_ids:
        expectations.append(
            gxe.ExpectColumnValuesToNotBeInSet(
                column="task_id",
                value_set=sorted(forbidden_task_ids),
                description="dev/test task ids must never enter the bank",
            )
        )
    frame = df
    if embedding_dim is not None:
        frame = df.assign(
            embedding_len=df["embedding"].map(_length, na_action="ignore").astype("Int64"),
            embedding_has_nan=df["embedding"].map(_has_nan, na_action="ignore"),
        )
        expectations += [
            gxe.ExpectColumnValuesToBeBetween(
                column="embedding_len",
                min_value=embedding_dim,
                max_value=embedding_dim,
                description=f"embedding must have length {embedding_dim}",
            ),
            gxe.ExpectColumnValuesToBeInSet(
                column="embedding_has_nan", value_set=[False], description="embedding has NaN"
            ),
        ]
    _run_suite(suite, frame, expectations)


def experience_reasons(df: pd.DataFrame, success_threshold: float) -> dict[Any, list[str]]:
    """Validate deployed trajectories row by row; return ``{row label: [reasons]}`` for the rows that fail.

    Unlike the other gates this one does not raise: every row is kept, valid or not, and each failing
    row gets the descriptions of the expectations it fails, in suite order. The frame holds
    :data:`EXPERIENCE_COLUMNS` (null where a row lacks the field) and :data:`EXPERIENCE_DERIVED`, which
    the caller computes by replaying the row in the environment (null where it could not). Checks:
    the fields are present; ``verdict`` is ``success`` or ``failure``; ``reward`` a number in [0, 1]; success only
    where ``reward >= success_threshold``; the task is a known train task (not dev, not test); the
    messages replay in the environment; the environment's verdict and reward are the row's; a given
    ``lite_text`` is the environment's; the trajectory is no duplicate of a bank entry or of an earlier row.
    """
    import great_expectations as gx
    import great_expectations.expectations as gxe

    missing = [c for c in EXPERIENCE_COLUMNS + EXPERIENCE_DERIVED if c not in df.columns]
    if missing:
        raise ValueError(f"experience frame lacks columns {missing}")
    if len(df) == 0:
        return {}
    reward = pd.to_numeric(df["reward"], errors="coerce")
    is_number = df["reward"].map(lambda v: isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)), na_action="ignore")
    frame = df.assign(reward_num=reward, reward_is_number=is_number, reward_reaches_threshold=(reward >= success_threshold).astype(int),
                      success_int=(df["verdict"] == "success").astype(int))
    frame["messages"] = frame["messages"].astype(object)  # lists: not-null is all that is checked here
    expectations = [
        *(gxe.ExpectColumnValuesToNotBeNull(column=c, description=f"missing field '{c}'") for c in EXPERIENCE_COLUMNS),
        gxe.ExpectColumnValuesToBeInSet(column="verdict", value_set=["success", "failure"], description="verdict must be 'success' or 'failure'"),
        gxe.ExpectColumnValuesToBeInSet(column="reward_is_number", value_set=[True], description="reward must be a number"),
        gxe.ExpectColumnValuesToBeBetween(column="reward_num", min_value=0.0, max_value=1.0, description="reward must be in [0, 1]"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="reward_reaches_threshold", column_B="success_int", or_equal=True,
                                                    description=f"a success needs reward >= {success_threshold}"),
        gxe.ExpectColumnValuesToNotBeInSet(column="task_split", value_set=["dev", "test"], description="a dev or test task never enters the bank"),
        gxe.ExpectColumnValuesToNotBeInSet(column="task_split", value_set=["unknown"], description="unknown task id"),
        gxe.ExpectColumnValuesToBeInSet(column="replay_ok", value_set=[True], description="the messages do not replay in the environment"),
        gxe.ExpectColumnValuesToBeInSet(column="verdict_matches", value_set=[True],
                                        description="the environment's verdict or reward on replay differs from the row's"),
        gxe.ExpectColumnValuesToBeInSet(column="lite_text_ok", value_set=[True], description="lite_text differs from the environment's"),
        gxe.ExpectColumnValuesToBeInSet(column="duplicate", value_set=[False], description="duplicate of a bank entry or an earlier row"),
    ]
    batch = _batch_definition().get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(gx.ExpectationSuite(name="experience", expectations=expectations), result_format={"result_format": "COMPLETE"})
    reasons: dict[Any, list[str]] = {}
    by_description = {e.description: i for i, e in enumerate(expectations)}
    for outcome in sorted(result.results, key=lambda r: by_description.get(r.expectation_config.description, 0)):
        if outcome.success:
            continue
        error = _exception_message(outcome.exception_info)
        rows = frame.index if error is not None else outcome.result.get("unexpected_index_list") or []
        for label in rows:
            reasons.setdefault(label, []).append(outcome.expectation_config.description + (f" ({error})" if error else ""))
    return reasons


def _check_shape(suite: str, df: pd.DataFrame, required: Sequence[str]) -> None:
    """Raise if the frame is empty or lacks a required column (derived columns need them)."""
    if len(df) == 0:
        raise DataValidationError(
            suite,
            [
                {
                    "expectation": "expect_table_row_count_to_be_between",
                    "unexpected_count": 0,
                    "detail": "frame is empty (0 rows)",
                }
            ],
        )
    missing = [column for column in required if column not in df.columns]
    if missing:
        raise DataValidationError(
            suite,
            [
                {
                    "expectation": f"expect_column_to_exist({column})",
                    "unexpected_count": len(df),
                    "detail": f"expect_column_to_exist({column}) failed: column is missing",
                }
                for column in missing
            ],
        )


def _not_null(columns: Sequence[str]) -> list[Expectation]:
    """One not-null expectation per column."""
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column=column, description="no nulls allowed")
        for column in columns
    ]


def _length(value: Any) -> int:
    """Length of one embedding value (-1 when it is not a sequence, so the length check fails)."""
    return len(value) if hasattr(value, "__len__") else -1


def _has_nan(value: Any) -> bool:
    """Whether one embedding value contains NaN (or is not numeric at all)."""
    try:
        return bool(np.isnan(np.asarray(value, dtype=float)).any())
    except (TypeError, ValueError):
        return True


@cache
def _batch_definition() -> BatchDefinition:
    """Lazily build the shared ephemeral context's whole-dataframe batch definition."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("lopd_validation").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("whole_frame")


def _run_suite(suite: str, frame: pd.DataFrame, expectations: list[Expectation]) -> None:
    """Validate ``frame`` against ``expectations`` with GX; raise on any failure."""
    import great_expectations as gx

    batch = _batch_definition().get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(
        gx.ExpectationSuite(name=suite, expectations=expectations),
        result_format={"result_format": "BASIC", "partial_unexpected_count": _SAMPLE_VALUES},
    )
    if result.success:
        return
    failures = [_failure(outcome, len(frame)) for outcome in result.results if not outcome.success]
    raise DataValidationError(suite, failures)


def _failure(outcome: ExpectationValidationResult, n_rows: int) -> dict:
    """Turn one failed GX expectation result into a failure dict."""
    config = outcome.expectation_config
    kwargs = config.kwargs
    if "column" in kwargs:
        columns = kwargs["column"]
    else:
        columns = f"{kwargs['column_A']}, {kwargs['column_B']}"
    label = f"{config.type}({columns})"
    error = _exception_message(outcome.exception_info)
    if error is not None:
        return {
            "expectation": label,
            "unexpected_count": n_rows,
            "detail": f"{label} could not be evaluated: {error}",
        }
    count = int(outcome.result["unexpected_count"])
    sample = [_plain(value) for value in outcome.result.get("partial_unexpected_list", [])]
    detail = f"{label} failed on {count} of {n_rows} rows ({config.description}; e.g. {sample})"
    return {"expectation": label, "unexpected_count": count, "detail": detail}


def _plain(value: Any) -> Any:
    """NumPy scalars (also inside pair tuples) as Python ones, for a readable message."""
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return value.item() if isinstance(value, np.generic) else value


def _exception_message(exception_info: dict | None) -> str | None:
    """The first exception message GX recorded for a result, if any.

    GX stores either one ``{"raised_exception": ...}`` dict or one such dict per metric.
    """
    if not exception_info:
        return None
    infos = [exception_info] if "raised_exception" in exception_info else exception_info.values()
    for info in infos:
        if info.get("raised_exception"):
            return str(info.get("exception_message")).partition("\n")[0]
    return None
