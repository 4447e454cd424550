"""Finding user code: tasks and models from other packages, loaded the same way everywhere.

A *plugin* is a Python module whose import registers tasks and models with
``@TASKS.register`` / ``@MODELS.register`` (:mod:`trainables.registry`). There are two
ways to name one, and the built-ins use the first:

* **Entry points** in the group ``fineline.plugins`` (an installed distribution's
  ``[project.entry-points."fineline.plugins"]`` table, each value a module name). Every
  process loads all of them once, before its first registry lookup: the driver, and each
  Ray worker on any node *where the distribution is installed* (install a plugin on every
  node, as you install fineline itself).
* **A study file's** ``plugins:`` list of importable module names, for code that is not
  installed. A name is looked up first in the study file's folder, then on ``sys.path``
  (``PYTHONPATH`` included). The driver imports them before it validates anything; the
  modules that are not installed (not under a site-packages folder) travel to every Ray
  worker with the job, through Ray's ``runtime_env`` ``py_modules``, and each worker
  imports them again before any lookup (:func:`import_modules`).

A plugin that fails to import is one :class:`PluginError` that names it, where it came
from and the fix; a name registered twice names both sources (see the registry). An
installed plugin (entry point) that fails to import is a warning instead: its tasks and
models are unavailable, and a study that names one of them is refused with that error.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import logging
import sys
import sysconfig
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trainables.errors import FinelineError

log = logging.getLogger(__name__)

GROUP = "fineline.plugins"
"""The entry-point group fineline reads."""
BUILTIN_DIST = "fineline"
"""The distribution whose entry points register the built-in tasks and models."""


class PluginError(FinelineError):
    """A plugin could not be loaded, or registers something invalid or twice."""


class NameClash(PluginError):
    """Two classes registered under one name: never a mere warning, since a study naming it
    could otherwise run the other class."""


@dataclass(frozen=True)
class Origin:
    """Where a plugin module came from, for messages and ``study plugins``."""

    module: str
    how: str
    """``entry point NAME of DIST VERSION`` or ``study file plugins: (PATH)``."""
    dist: str = ""
    """``DIST VERSION`` of the distribution whose entry point it is ("" for ``plugins:``)."""

    def __str__(self) -> str:
        return f"{self.module} ({self.how})"


class _Loader:
    """The process's plugin state: which modules were loaded, and from where.

    One instance per process (:data:`LOADER`), like the registries it feeds; it only
    grows, and loading a module twice is a no-op.
    """

    def __init__(self) -> None:
        self.entry_points_loaded = False
        self.loaded: dict[str, Origin] = {}
        self.current: Origin | None = None
        self.broken: dict[str, str] = {}
        """Installed plugins that failed to import: origin -> the error (a warning, not fatal:
        a study that names none of their tasks and models runs without them)."""

    @contextlib.contextmanager
    def loading(self, origin: Origin) -> Iterator[None]:
        before, self.current = self.current, origin
        try:
            yield
        finally:
            self.current = before

    def import_module(self, name: str, origin: Origin, fix: str, found_fix: str | None = None) -> ModuleType:
        """Import ``name`` with registrations attributed to ``origin``; errors -> PluginError
        whose fix is ``fix`` where ``name`` itself is not found, else ``found_fix`` (default
        ``fix``): the module was found and raised, or imports a package that is missing."""
        if name in self.loaded and name in sys.modules:
            return sys.modules[name]
        with self.loading(origin):
            try:
                module = importlib.import_module(name)
            except PluginError:
                raise
            except FinelineError as exc:
                raise PluginError(f"plugin {origin}: {exc}") from None
            except SystemExit as exc:  # a script's sys.exit() or argparse at import time
                raise PluginError(
                    f"plugin {origin} called sys.exit({exc.code!r}) while being imported"
                    f"{_last_frame(exc, name)}. Fix: a plugin module only defines and registers: move its "
                    f"script code under `if __name__ == \"__main__\":`; or {found_fix or fix}"
                ) from None
            except Exception as exc:
                # a SyntaxError's traceback ends in importlib: its own filename and line are the place
                where = (f" (at {exc.filename}:{exc.lineno})" if isinstance(exc, SyntaxError) and exc.filename
                         else _last_frame(exc, name))
                absent = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
                if absent and (name == absent or name.startswith(absent + ".")):
                    advice = fix
                elif absent:
                    advice = f"install the package that provides `{absent}` (the plugin imports it)"
                else:
                    advice = found_fix or fix
                raise PluginError(
                    f"plugin {origin} failed to import: {type(exc).__name__}: {exc}{where}. "
                    f"Fix: {advice}"
                ) from None
        self.loaded[name] = origin
        return module

    def load_entry_points(self) -> None:
        """Import every ``fineline.plugins`` entry point's module, once per process."""
        if self.entry_points_loaded:
            return
        self.entry_points_loaded = True
        eps = sorted(md.entry_points(group=GROUP), key=lambda ep: (_dist(ep) != BUILTIN_DIST, ep.name))
        if not any(_dist(ep) == BUILTIN_DIST for ep in eps):
            self.entry_points_loaded = False
            raise PluginError(
                f"no {GROUP} entry points of {BUILTIN_DIST!r} found, so no built-in task or model "
                "is registered (fineline's metadata is missing or stale). Fix: install fineline "
                "with `python3 -m pip install -e .` (or `pip install fineline`) in this environment"
            )
        for ep in eps:
            dist = ep.dist
            label = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
            origin = Origin(ep.value, f"entry point {ep.name!r} of {label}", label if dist is not None else "")
            uninstall = f"uninstall it (`pip uninstall {dist.name if dist else ep.name}`) to run without it"
            fix = f"fix the module or reinstall {label}; or {uninstall}"
            if _dist(ep) == BUILTIN_DIST:
                self.import_module(ep.value.split(":")[0], origin, fix)
                continue
            try:  # another package's plugin: a broken one must not stop studies that do not use it
                module = self.import_module(ep.value.split(":")[0], origin, fix)
            except NameClash:
                raise
            except PluginError as exc:  # what it registered before failing is hidden (Registry)
                text = str(exc) if uninstall in str(exc) else f"{exc}; or {uninstall}"
                self.broken[str(origin)] = text
                log.warning("warning: %s (its tasks and models are unavailable)", text)
                continue
            if problem := _entry_point_problem(ep.value, module):
                log.warning("warning: %s names %r, but %s. Fix: point it at the module that registers "
                            "them (pyproject.toml [project.entry-points.\"%s\"]), then reinstall %s",
                            origin.how, ep.value, problem, GROUP, label)


LOADER = _Loader()


def _entry_point_problem(value: str, module: ModuleType) -> str | None:
    """What is wrong with an installed entry point whose module imported: the object after
    ``:`` is missing, or nothing from the module registered a task or model (a wrong module
    name imports without a word, then "unknown task" says the package must be installed)."""
    from trainables.registry import registers

    name, _, attr = value.partition(":")
    obj: Any = module
    for part in filter(None, attr.split(".")):
        if not hasattr(obj, part):
            return f"{name} has no {attr!r}"
        obj = getattr(obj, part)
    return None if registers(name) else f"{name} registers no task or model"


def _dist(ep: md.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ""


_FINELINE = tuple(str(Path(__file__).resolve().parents[1] / d) + "/" for d in ("trainables", "study", "analysis"))
_LIBRARY = tuple(str(Path(sysconfig.get_paths()[k]).resolve()) + "/" for k in ("stdlib", "purelib", "platlib"))
NOT_PLUGIN_CODE = _FINELINE + _LIBRARY
"""Path prefixes of code that is neither a plugin's nor a user's: fineline's packages, the
standard library and the installed libraries."""


def plugin_frame(exc: BaseException, tops: Sequence[str]) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc`` in a plugin's own files (the top-level packages or
    modules named in ``tops``), else the innermost in code that is neither fineline's, nor
    the standard library's, nor an installed library's (a pydantic error raised for a
    plugin's class names the plugin's line, not pydantic's), else None."""
    frames = [(f, str(Path(f.filename).resolve())) for f in reversed(traceback.extract_tb(exc.__traceback__))
              if not f.filename.startswith("<")]  # importlib's frozen frames
    for f, path in frames:
        if any(f"/{t}/" in path or path.endswith(f"/{t}.py") for t in tops if t):
            return f
    return next((f for f, path in frames if not path.startswith(NOT_PLUGIN_CODE)), None)


def _last_frame(exc: BaseException, module: str) -> str:
    """`` (at FILE:LINE)`` of :func:`plugin_frame` for plugin ``module``, else of the
    innermost frame outside importlib and this file, else ""."""
    f = plugin_frame(exc, [module.split(".")[0]])
    if f is None:
        rest = [f for f in traceback.extract_tb(exc.__traceback__)
                if not f.filename.startswith("<") and f.filename != __file__]
        f = rest[-1] if rest else None
    return f" (at {f.filename}:{f.lineno})" if f is not None else ""


def load_entry_points() -> None:
    """Load the installed plugins (the built-ins included); see the module doc."""
    LOADER.load_entry_points()


def import_modules(
    names: Sequence[str], search_dir: Path | None, source: str, fix: str | None = None
) -> list[ModuleType]:
    """Import a study file's ``plugins:`` modules (entry points first).

    ``search_dir`` (the study file's folder) is searched before ``sys.path``; ``source``
    says where the list came from (e.g. the study file's path); ``fix`` replaces the
    default advice of an import error. Returns the modules.
    """
    load_entry_points()
    if names and search_dir is not None and str(search_dir) not in sys.path:
        sys.path.insert(0, str(search_dir))
    where = f"{search_dir} or " if search_dir is not None else ""
    modules = []
    for name in names:
        advice = fix or (
            f"make `{name}` importable: put {name}.py (or a package {name}/) in {where}a folder "
            "on PYTHONPATH, or pip install the package that provides it; or remove it from "
            "`plugins:`"
        )
        found = fix or "fix the error at the place shown (the module was found but raised); or remove it from `plugins:`"
        modules.append(LOADER.import_module(name, Origin(name, f"plugins: of {source}"), advice, found))
    return modules


def is_installed(module: ModuleType) -> bool:
    """True if ``module`` lives under a site-packages folder (then every node installs it
    like fineline itself, and it is not shipped with the job)."""
    path = getattr(module, "__file__", None)
    if path is None:
        return True  # a namespace or built-in module: nothing to ship
    site = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(Path(s).resolve()) for s in site)


def shippable(modules: Sequence[ModuleType]) -> list[ModuleType]:
    """The top-level modules of ``modules`` that must travel to workers (not installed)."""
    tops: dict[str, ModuleType] = {}
    for m in modules:
        top = sys.modules[m.__name__.split(".")[0]]
        if not is_installed(top):
            tops[top.__name__] = top
    return list(tops.values())


def current_origin() -> Origin | None:
    """The plugin being imported right now (None: fineline's own imports, a test, ...)."""
    return LOADER.current
