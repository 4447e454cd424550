"""Base class for every config block: frozen, strict, documented.

Each field carries its docstring (pydantic's ``use_attribute_docstrings``), so the
documentation travels with the schema and shows in error messages and ``study
config-help``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenConfig(BaseModel):
    """A frozen, extra-forbidding pydantic model whose attribute docstrings document fields."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )
