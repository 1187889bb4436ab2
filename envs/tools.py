"""Actions as functions: the shape in which an env offers its actions to a tool-calling agent.

An env that describes its actions as :class:`Function` s (OpenAI's function-calling shape: a name and a JSON
Schema of the arguments) can be played in ``env.action_format: tools``: the functions are offered to the model,
each reply's :class:`ToolCall` is turned into the env's own action text by ``TextEnv.action_of_call``, and the
env steps on that text as it would in text format.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class Function(BaseModel):
    """One function an agent may call: what a tool-calling model is shown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN, description="Function name (letters, digits, `_`, `-`; at most 64).")
    description: str = Field("", description="What the function does, for the model to read.")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema of the arguments: an object schema.",
    )

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        if parameters.get("type") != "object":
            raise ValueError(f"a function's parameters must be a JSON Schema of type 'object', got {parameters!r}")
        import jsonschema  # here, not at the top: an env actor that never builds a function never loads it (0.1 s)

        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"a function's parameters are not a valid JSON Schema: {exc.message}") from exc
        return parameters

    def openai(self) -> dict[str, Any]:
        """The function as an entry of OpenAI's ``tools`` list."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def argument_error(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit this function's schema, in words; None when they do."""
        import jsonschema

        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.parameters)(self.parameters).iter_errors(arguments)
        )
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        return f"arguments of {self.name}{f' at {where}' if where else ''}: {error.message}"


class ToolCall(BaseModel):
    """One call a reply makes: which function, with which arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="The call's id (`call_...`), which the `tool` message answering it names.")
    name: str = Field(description="The function called.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The arguments, parsed from JSON.")

    def same_call(self, other: ToolCall) -> bool:
        """The same function with the same arguments (ids aside): how a client's echo of a call is compared,
        whatever JSON spacing or key order it re-serialized the arguments with."""
        return self.name == other.name and self.arguments == other.arguments

    def arguments_json(self) -> str:
        """The arguments as OpenAI's ``function.arguments`` string."""
        return json.dumps(self.arguments, ensure_ascii=False)


def function_named(functions: list[Function], name: str) -> Function | None:
    """The function called ``name`` among ``functions``; None when there is none."""
    return next((f for f in functions if f.name == name), None)
