"""The base of every config section: strict pydantic models.

Unknown keys are refused, and every number must fit the dtype it becomes on the device: each
int (also inside lists and dicts, e.g. `hidden_sizes` or `env.params`) must fit int32 (a field
named in `uint32_fields` must fit uint32 instead) and each float must be finite and fit
float32 (a nonzero one not flushed to 0).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32 (XLA flushes the rest)


def check_number(value: Any, low: int = -(2**31), high: int = INT32_MAX) -> None:
    """Raise ValueError when an int in `value` (a number, list or dict) is outside [low, high]
    or a float is not finite or does not fit float32."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not low <= value <= high:
            dtype = "uint32" if low == 0 and high == UINT32_MAX else "int32"
            raise ValueError(f"{value} is out of range: must fit {dtype} ({low} to {high})")
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
            raise ValueError(
                f"{value!r} is out of range: must be finite and fit float32 (|x| <= 3.4e38)"
            )
        if value != 0 and abs(value) < FLOAT32_TINY:
            raise ValueError(
                f"{value!r} is out of range: it becomes 0 in float32 (a nonzero value needs "
                "|x| >= 1.2e-38)"
            )
    elif isinstance(value, list | tuple):
        for item in value:
            check_number(item, low, high)
    elif isinstance(value, dict):
        for item in value.values():
            check_number(item, low, high)


_FIELD_TAG = "\x00field:"


def field_error(field: str, message: str) -> ValueError:
    """The error a model validator raises for one of its fields: the message then names
    `<section>.<field>` as the config key at fault (pydantic would name only the section)."""
    return ValueError(f"{_FIELD_TAG}{field}{_FIELD_TAG}{message}")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    uint32_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, data: Any) -> Any:
        """`seed=true` or `env.num_envs: yes` is refused, not read as 1 (pydantic's lax mode
        takes a boolean for an int or a float)."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is None or not isinstance(value, bool):
                    continue
                annotation = field.annotation
                kinds = set(get_args(annotation)) if get_origin(annotation) else {annotation}
                if bool not in kinds and kinds & {int, float}:
                    raise field_error(
                        key, f"a number is needed, not the boolean {str(value).lower()}"
                    )
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _fits_device_dtypes(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name in cls.uint32_fields:
            check_number(value, 0, UINT32_MAX)
        else:
            check_number(value)
        return value


def check_int32_count(what: str, value: int) -> None:
    """Raise ValueError when a count of the run (`what`: how the config keys give it) does not
    fit the engine's int32 counters (`core.state.Counters`)."""
    if value > INT32_MAX:
        raise ValueError(
            f"{what} = {value}: more than the engine's int32 counters hold ({INT32_MAX})"
        )


def run_epochs(total_env_steps: int, num_steps: int, num_envs: int) -> int:
    """Whole epochs of `num_steps * num_envs` env steps covering `total_env_steps`."""
    return -(-total_env_steps // (num_steps * num_envs))


MAX_EPISODES = 10_000_000  # an evaluation's episodes (their returns and lengths: 80 MB)


def check_eval_request(episodes: Any, seed: Any) -> None:
    """ValueError unless `episodes` is 1 to MAX_EPISODES and `seed` a uint32 (`jaxrl-engine
    eval`, `evaluate_run`): answered before JAX is imported."""
    if (
        isinstance(episodes, bool)
        or not isinstance(episodes, int)
        or not 1 <= episodes <= MAX_EPISODES
    ):
        raise ValueError(
            f"episodes={episodes}: give 1 to {MAX_EPISODES:,} (every episode's return and "
            "length are kept for the statistics)"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:
        raise ValueError(f"seed={seed}: a seed is an int from 0 to {2**32 - 1}")
