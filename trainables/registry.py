"""Name -> class registries for tasks and models.

Adding a task or model is: subclass the base, decorate with ``@TASKS.register`` or
``@MODELS.register``. An unknown name is an error that lists the valid choices, and
the contract test in ``tests/test_contract.py`` picks up every registered pair.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from trainables.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named set of classes, each with a class attribute ``name``."""

    def __init__(self, kind: str, field: str) -> None:
        self.kind = kind
        self.field = field
        self._items: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        name = cls.name  # type: ignore[attr-defined]
        if name in self._items and self._items[name] is not cls:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = cls
        return cls

    def get(self, name: str) -> type[T]:
        _load_builtins()
        if name not in self._items:
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise ConfigError(
                self.field, f"unknown {self.kind} {name!r}", f"use one of: {valid}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        _load_builtins()
        return sorted(self._items)

    def __iter__(self) -> Iterator[type[T]]:
        _load_builtins()
        return iter([self._items[n] for n in sorted(self._items)])


_BUILTIN_MODULES = (
    "trainables.tasks.symbol_rewriting",
    "trainables.tasks.dyck",
    "trainables.tasks.scan",
    "trainables.tasks.mnist_pairs",
    "trainables.tasks.toy2d",
    "trainables.models.seq2seq",
    "trainables.models.rnn_tagger",
    "trainables.models.convnet",
    "trainables.models.mlp",
)
_loaded = False


def _load_builtins() -> None:
    """Import the built-in task and model modules (those that exist) exactly once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise



from trainables.models.base import Model  # noqa: E402
from trainables.tasks.base import Task  # noqa: E402

TASKS: Registry[Task] = Registry("task", "task.name")
MODELS: Registry[Model] = Registry("model", "model.name")
