"""Base class for every config block: frozen, strict, documented, with a stable identity.

Each field carries its docstring (pydantic's ``use_attribute_docstrings``), so the
documentation travels with the schema and shows in error messages and ``study plugins``.

**Stable identities.** A run's ``trial_id`` hashes its *resolved* config
(:meth:`FrozenConfig.identity`), so moving a default changes no id as long as the
resolved values stay the same (a study file that relied on the old default must then
state the value). A field added to a config that existing studies already use must not
change their ids either, so it is declared with :func:`added_field`: while its value is
the one that reproduces the behaviour from before the field existed (its
``identity_default``), it is left out of the hash. The rule, for built-ins and plugins:

1. never rename or remove a field of a released config, and never change what a value
   means;
2. a new field is an :func:`added_field` whose ``identity_default`` keeps the old
   behaviour (it may have another ``default``: studies that never set it then get a new
   id, which is right, since they now compute something else);
3. ``tests/study/test_identity.py`` pins the ``trial_id`` of every shipped study file.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

_ADDED = "fineline_identity_default"


def added_field(default: Any, *, identity_default: Any = ..., **kwargs: Any) -> Any:
    """A pydantic ``Field`` for a field added after its config was first released.

    ``identity_default`` (default: ``default``) is the value that computes what configs did
    before the field existed; at that value the field stays out of :meth:`FrozenConfig.identity`.
    Other keyword arguments go to ``Field`` (``ge``, ``gt``, ...).
    """
    ident = default if identity_default is ... else identity_default
    extra = dict(kwargs.pop("json_schema_extra", None) or {})
    extra[_ADDED] = {"value": ident}
    return Field(default, json_schema_extra=extra, **kwargs)


class FrozenConfig(BaseModel):
    """A frozen, extra-forbidding pydantic model whose attribute docstrings document fields."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,  # .inf / .nan are refused in every float field (and tuples of them)
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse ``true`` / ``false`` where the field takes no boolean (pydantic's lax mode
        would read them as 1 / 0): ``lr: true`` is a mistake, never a learning rate."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _holds_bool(value) and not _admits_bool(field.annotation):
            raise PydanticCustomError("bool_not_number", "a boolean where a number or text is expected")
        return value

    def identity(self) -> dict[str, Any]:
        """The JSON form of this config for hashing: ``model_dump(mode="json")`` less every
        :func:`added_field` at its identity default (nested configs likewise)."""
        dumped = self.model_dump(mode="json")
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if isinstance(value, FrozenConfig):
                dumped[name] = value.identity()
            extra = info.json_schema_extra
            marker = extra.get(_ADDED) if isinstance(extra, dict) else None
            if isinstance(marker, dict) and _json(info, marker["value"]) == dumped[name]:
                del dumped[name]
        return dumped


def _admits_bool(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` may hold a boolean (anywhere inside it).

    Nested configs validate their own fields, so a model type counts as admitting one."""
    if annotation is bool or annotation is Any or annotation is None:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _admits_bool(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) or args:
        return any(_admits_bool(a) for a in args if a is not Ellipsis)
    return False


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


def _json(info: Any, value: Any) -> Any:
    """``value`` as ``model_dump(mode="json")`` writes it for a field like ``info``."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple):
        return list(value)
    return value
