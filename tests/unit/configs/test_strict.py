"""Numbers refuse booleans in every config section (the algorithms' hyperparameters: tests/unit/learner)."""

from typing import Annotated, Any, Literal

import pytest
from pydantic import Field, ValidationError

from agentgym_rl.configs import Config, ConfigError, load_config
from agentgym_rl.configs.strict import bool_as_number

# (annotation, value, refused)
CASES = [
    (int, True, True),
    (float, False, True),
    (Annotated[int, Field(ge=1)], True, True),
    (int | None, True, True),
    (int | Literal["auto"], True, True),
    (list[int], [3, True], True),
    (list[int] | None, [True], True),
    (tuple[int, ...], (1, True), True),
    (dict[str, float], {"a": True}, True),
    (bool, True, False),
    (bool | int, True, False),
    (Literal[True, 1], True, False),
    (str, True, False),
    (Any, True, False),
    (dict[str, Any], {"a": True}, False),
    (list[str], [True], False),
    (int, 3, False),
    (int | None, [1], False),
    (list[int], [3, 4], False),
]


@pytest.mark.parametrize(("annotation", "value", "refused"), CASES)
def test_bool_as_number(annotation: Any, value: Any, refused: bool):
    assert bool_as_number(annotation, value) is refused


@pytest.mark.parametrize("key", ["trainer.iterations", "sampler.count", "serve.port", "sampler.sampling.top_p"])
def test_a_boolean_for_a_number_is_refused_naming_the_key(key: str):
    with pytest.raises(ConfigError, match=rf"{key}: takes a number, not a boolean \(got True\)"):
        load_config(None, [f"{key}=true"])


def test_booleans_still_set_flags_and_assignments_are_checked_too():
    assert load_config(None, ["logging.progress=false"]).logging.progress is False
    config = Config()
    with pytest.raises(ValidationError, match="takes a number, not a boolean"):
        config.trainer.iterations = True
