"""Name -> class registries for tasks and models.

Adding a task or model is: subclass :class:`~trainables.tasks.base.Task` or
:class:`~trainables.models.base.Model`, decorate it with ``@TASKS.register`` or
``@MODELS.register``, and make its module a plugin (:mod:`trainables.plugins`: an entry
point in the group ``fineline.plugins``, or a study file's ``plugins:`` list). fineline's
own tasks and models are entry points of its distribution, found the same way.

A lookup loads the installed plugins first, so a registry is complete wherever it is
read (driver, Ray worker, test). An unknown name is an error that lists the valid
choices; a name registered by two different classes is an error naming both sources; a
class that lacks what its family needs is refused when it registers. The shipped
contract suite (:mod:`trainables.testing`) checks what registration cannot.

This module imports neither tasks nor models (their base classes import it).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, get_args

from trainables.configbase import FrozenConfig
from trainables.data import DataKind
from trainables.errors import ConfigError
from trainables.plugins import (
    LOADER,
    NameClash,
    Origin,
    PluginError,
    current_origin,
    load_entry_points,
)

if TYPE_CHECKING:
    from trainables.models.base import Model
    from trainables.tasks.base import Task

T = TypeVar("T")
DATA_KINDS: tuple[str, ...] = get_args(DataKind)


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered class and where it came from."""

    cls: type[T]
    origin: Origin | None
    """The plugin whose import registered it (None: registered outside plugin loading)."""

    @property
    def source(self) -> str:
        """``module.Class (how it was loaded)``, crediting the plugin module that is the
        class's own module or a package holding it (even where another import got there
        first), else the plugin being loaded when it registered."""
        where = f"{self.cls.__module__}.{self.cls.__qualname__}"
        parts = self.cls.__module__.split(".")
        owners = [LOADER.loaded.get(".".join(parts[:n])) for n in range(len(parts), 0, -1)]
        origin = next((o for o in owners if o is not None), self.origin)
        return f"{where} ({origin.how})" if origin is not None else where


class Registry(Generic[T]):
    """A named set of classes, each with a class attribute ``name``."""

    def __init__(self, kind: str, field: str, required: tuple[str, ...], base: str) -> None:
        self.kind = kind
        self.field = field
        self.required = required
        """Class attributes a registered class must define."""
        self.base = base
        """``module:Class`` every registered class subclasses (imported at first registration:
        the base modules import this one)."""
        self._items: dict[str, Entry[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: check ``cls`` and add it under ``cls.name``."""
        self._check(cls)
        name: str = cls.name  # type: ignore[attr-defined]
        entry = Entry(cls, current_origin())
        old = self._items.get(name)
        if old is not None and _same_class(old.cls, cls):
            self._items[name] = entry  # the same class again (a module imported twice)
            return cls
        if old is not None:
            raise NameClash(
                f"{self.kind} {name!r} is registered twice: by {old.source} and by {entry.source}. "
                f"Fix: give one of them another `name`, or drop one of the two plugins"
            )
        self._items[name] = entry
        return cls

    def _check(self, cls: type[T]) -> None:
        where = f"{self.kind} class {cls.__module__}.{cls.__qualname__}"
        module, _, base_name = self.base.partition(":")
        base = getattr(importlib.import_module(module), base_name)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(
                f"{where} does not subclass {module}.{base_name}. Fix: derive it from {base_name} "
                f"(`class {getattr(cls, '__name__', 'Mine')}({base_name}): ...`; docs/plugins.md)"
            )
        missing = [a for a in self.required if not hasattr(cls, a)]
        if missing:
            raise PluginError(f"{where} lacks {', '.join(missing)}. Fix: set them as class attributes")
        name = cls.name  # type: ignore[attr-defined]
        if not isinstance(name, str) or not name.replace("_", "").isalnum():
            raise PluginError(f"{where}: name {name!r} is not a word. Fix: use letters, digits and '_'")
        config = cls.Config  # type: ignore[attr-defined]
        if not (isinstance(config, type) and issubclass(config, FrozenConfig)):
            raise PluginError(
                f"{where}: Config must subclass trainables.configbase.FrozenConfig (frozen, unknown "
                f"fields refused, a docstring per field). Fix: `class Config(FrozenConfig): ...`"
            )
        bare = [n for n, f in config.model_fields.items() if not f.description]
        if bare:
            raise PluginError(
                f"{where}: config field(s) {', '.join(bare)} of {config.__qualname__} have no docstring. Fix: "
                f"write one under each field (`{bare[0]}: int = 9` then a line `\"\"\"What it sets.\"\"\"`); "
                "`study plugins --fields` shows them"
            )
        if cls.data_kind not in DATA_KINDS:  # type: ignore[attr-defined]
            raise PluginError(
                f"{where}: data_kind {cls.data_kind!r} is unknown. Fix: use one of "  # type: ignore[attr-defined]
                f"{', '.join(DATA_KINDS)} (the containers in trainables.data)"
            )
        if self.kind == "task":
            names = cls.declared_metrics()  # type: ignore[attr-defined]  # a PluginError says what to declare
            primary = cls.primary_metric  # type: ignore[attr-defined]
            if primary not in names:
                raise PluginError(f"{where}: primary_metric {primary!r} is not in its metrics "
                                  f"({', '.join(names)}). Fix: add it to `metrics`, or name one of them")
        if inspect.isabstract(cls):
            todo = ", ".join(sorted(cls.__abstractmethods__))  # type: ignore[attr-defined]
            raise PluginError(f"{where} does not implement {todo}. Fix: define them")

    def _live(self) -> dict[str, Entry[T]]:
        """The entries, less those of installed plugins that failed to import (a class they
        registered before failing belongs to a half-loaded module)."""
        load_entry_points()
        if not LOADER.broken:
            return self._items
        return {n: e for n, e in self._items.items() if e.origin is None or str(e.origin) not in LOADER.broken}

    def get(self, name: str) -> type[T]:
        items = self._live()
        if name not in items and (stray := self._unregistered(name)) is not None:
            decorator = "TASKS" if self.kind == "task" else "MODELS"
            raise ConfigError(
                self.field, f"unknown {self.kind} {name!r}: class {stray} has that name but is not registered",
                f"decorate it with @{decorator}.register (from trainables.registry import {decorator})",
            )
        if name not in items:
            valid = ", ".join(sorted(items)) or "(none)"
            broken = "; ".join(LOADER.broken.values())
            raise ConfigError(
                self.field,
                f"unknown {self.kind} {name!r}"
                + (f" (an installed plugin that may provide it failed to import: {broken})" if broken else ""),
                f"use one of: {valid}; a {self.kind} from another package must be installed "
                f"(entry point) or listed under `plugins:` in the study file (docs/plugins.md)",
            )
        return items[name].cls

    def _unregistered(self, name: str) -> str | None:
        """``module.Class`` of a class named ``name`` in a loaded plugin module that subclasses
        this registry's base but was never registered (a forgotten decorator), else None."""
        module, _, base_name = self.base.partition(":")
        base = getattr(importlib.import_module(module), base_name)
        for mod_name in LOADER.loaded:
            for obj in getattr(sys.modules.get(mod_name), "__dict__", {}).values():
                if isinstance(obj, type) and issubclass(obj, base) and obj.__dict__.get("name") == name:
                    return f"{obj.__module__}.{obj.__qualname__}"
        return None

    def entry(self, name: str) -> Entry[T]:
        self.get(name)
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._live())

    def entries(self) -> list[Entry[T]]:
        items = self._live()
        return [items[n] for n in sorted(items)]

    def __iter__(self) -> Iterator[type[T]]:
        return iter([e.cls for e in self.entries()])


def _same_class(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


TASKS: Registry[Task] = Registry(
    "task", "task.name", ("name", "Config", "data_kind", "primary_metric", "metrics"), "trainables.tasks.base:Task"
)
MODELS: Registry[Model] = Registry(
    "model", "model.name", ("name", "Config", "data_kind", "reductions"), "trainables.models.base:Model"
)



def registers(module: str) -> bool:
    """Whether a task or model is registered from ``module``: its class lives in it (or in a
    module of its package), or it registered while ``module`` was being imported."""
    owners = [(e.cls.__module__, e.origin.module if e.origin else "") for r in (TASKS, MODELS) for e in r.entries()]
    return any(home == module or home.startswith(module + ".") or by == module for home, by in owners)
