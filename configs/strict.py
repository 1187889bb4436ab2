"""Numbers that refuse booleans: pydantic reads ``true`` as 1 for an int or float field, so
``--set trainer.iterations=true`` would start a one-iteration run instead of failing."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationInfo, field_validator

NUMBERS = (int, float)


def bool_as_number(annotation: Any, value: Any) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` takes a number and no boolean, at the top or as
    an item of a list, tuple, set or mapping value (``curriculum.horizons=[true, 3]``)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return bool_as_number(get_args(annotation)[0], value)
    if origin in (Union, types.UnionType):
        members = get_args(annotation)
        if isinstance(value, bool):
            return bool not in members and any(bool_as_number(member, value) for member in members)
        # a container value: refused only when every container type it could be validated as refuses it
        verdicts = [bool_as_number(member, value) for member in members if is_container(member, value)]
        return bool(verdicts) and all(verdicts)
    if isinstance(value, bool):
        return annotation in NUMBERS
    if isinstance(value, dict) and origin is dict:
        item = get_args(annotation)[1] if get_args(annotation) else Any
        return any(bool_as_number(item, v) for v in value.values())
    if isinstance(value, list | tuple | set) and origin in (list, tuple, set, frozenset):
        items = [a for a in get_args(annotation) if a is not Ellipsis] or [Any]
        return any(bool_as_number(item, v) for item in items for v in value)
    return False


def is_container(annotation: Any, value: Any) -> bool:
    """Whether ``annotation`` is a container type that ``value`` (a container) could be validated as."""
    origin = get_origin(annotation)
    if isinstance(value, dict):
        return origin is dict
    return isinstance(value, list | tuple | set) and origin in (list, tuple, set, frozenset)


class StrictNumbers(BaseModel):
    """A model whose int and float fields refuse ``true`` and ``false`` (a bool field, or ``int | bool``,
    still takes them)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is not None and bool_as_number(cls.model_fields[info.field_name].annotation, value):
            raise ValueError("takes a number, not a boolean")
        return value
