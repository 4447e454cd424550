"""The study manifest ``OUT/<NAME>/study.json``: what a study is, for resume and analysis.

It stores the raw study config with the command line's overrides applied (so ``study
resume NAME`` needs no file) and those overrides, its identity hash (a changed config under
the same name is refused, showing what changed), the planned points, and what the task
wants analysed (so ``analysis`` never imports ``trainables``).

Import-light (no torch, no Ray): ``study status`` reads manifests, so the study config
module (which imports the task and model machinery) is only imported for type checking.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from analysis.manifest import damaged_fix, read_json
from trainables.errors import ConfigError, StudyStateError
from trainables.results import committed

if TYPE_CHECKING:
    from study.config import StudyConfig

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RESERVED_NAMES = {"tables"}
"""Folder names under OUT that are not studies."""
DIFF_LINES = 6
"""Changed fields a refused changed config names (the rest are counted)."""
NOT_IDENTITY = ("name", "execution", "tune", "plugins")
"""Top-level keys whose change never changes a study's identity (nor does a seed count):
left out of the difference a refused config shows."""


def check_name(name: str, field: str = "--name") -> str:
    """``name`` if it is a study name: one folder name under OUT (no path separator, no
    ``..``, no control character), else ConfigError naming ``field``."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in RESERVED_NAMES or ".." in name:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise ConfigError(field, f"invalid study name {shown}",
                          "use letters, digits, '_', '-' or '.' (no '..'), starting with a letter or digit "
                          "(not 'tables')")
    return name


def study_dir(out: Path, name: str) -> Path:
    return Path(out) / name


OPTUNA_DB = "optuna.db"
"""A tuning study's Optuna storage, a SQLite file in its folder."""


def storage_url(out: Path, name: str) -> str:
    """The Optuna storage URL of tuning study ``name`` (``optuna trials --storage URL``)."""
    return f"sqlite:///{(study_dir(out, name) / OPTUNA_DB).resolve()}"


def manifest_path(out: Path, name: str) -> Path:
    return study_dir(out, name) / "study.json"


REQUIRED = ("config", "seeds", "points")
"""Keys every manifest fineline writes has (a file without them is damaged)."""


def damage(out: Path, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest of study ``name``, None), or (None, why it is damaged: unreadable, not
    UTF-8, not JSON, missing keys); (None, None) when there is none."""
    path = manifest_path(out, name)
    if not path.exists():
        return None, None
    try:
        data = read_json(path)
    except ValueError as exc:
        return None, str(exc)
    missing = [k for k in REQUIRED if k not in data] if isinstance(data, dict) else list(REQUIRED)
    if missing or not isinstance(data.get("config"), dict):
        return None, f"no {', '.join(missing) or 'config block'}"
    return data, None


def read(out: Path, name: str) -> dict[str, Any] | None:
    """The manifest of study ``name`` (None if there is none); a damaged one (:func:`damage`)
    is a StudyStateError naming the file and the fix."""
    data, why = damage(out, name)
    if why is not None:
        raise StudyStateError(
            f"the manifest {manifest_path(out, name)} is damaged ({why}). Fix: {damaged_fix(out, name)}"
        )
    return data


def recorded_config(m: dict[str, Any]) -> dict[str, Any]:
    """The study file (overrides applied) a manifest recorded, with its value types: the
    YAML copy where there is one (JSON turns a grid's number keys, e.g. ``hidden_size: {6:
    ..., 8: ...}``, into text, which would resolve to other grid values), else ``config``."""
    text = m.get("config_yaml")
    if isinstance(text, str):
        loaded = yaml.safe_load(text)
        if isinstance(loaded, dict):
            return loaded
    return dict(m["config"])


def parse_recorded(m: dict[str, Any], raw: dict[str, Any], seeds: int | None) -> Any:
    """``study.config.parse`` of a config that manifest ``m`` recorded. A task or model that
    is no longer registered (its plugin was uninstalled or moved) is refused naming where
    the study had it from, as the manifest recorded (``plugins``)."""
    from study.config import parse
    from trainables.registry import MODELS, TASKS

    try:
        return parse(raw, seeds, m.get("plugin_dir"))
    except ConfigError as exc:
        if exc.field not in ("task.name", "model.name"):
            raise
        known = {"task": set(TASKS.names()), "model": set(MODELS.names())}
        gone = [f"{key} from {source}" for key, source in sorted((m.get("plugins") or {}).items())
                if key.partition(" ")[2] not in known.get(key.partition(" ")[0], set())]
        if not gone:
            raise
        raise ConfigError(exc.field, f"{exc.problem}; this study ran {'; '.join(gone)}",
                          "install that package again (or put the module back where the study "
                          "file's plugins: found it), then retry") from None


def write(out: Path, name: str, manifest: dict[str, Any]) -> None:
    path = manifest_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".study.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def git_sha() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        return res.stdout.strip() if res.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("fineline", "torch", "ray", "optuna", "pyarrow", "duckdb"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = ""
    return out


@contextmanager
def forgotten_if_refused(out: Path, name: str, also: tuple[str, ...] = ()) -> Iterator[None]:
    """A study that this block creates is forgotten again (its manifest and the files named
    in ``also`` under its folder removed) if a :class:`ConfigError` leaves the block before
    any of its runs committed: a Ray cluster that refuses the driver (``--address``, its auth
    token) then leaves nothing behind, and the next try, with other settings, is not refused
    as a changed config."""
    new = read(out, name) is None
    try:
        yield
    except ConfigError:
        if new and not committed(out, name):
            for f in (manifest_path(out, name), *(study_dir(out, name) / a for a in also)):
                f.unlink(missing_ok=True)
        raise


KIND_WORDS = {"seeds": "seed", "tune": "tuning"}
"""A manifest's ``kind`` as messages say it (``a seed study``, ``a tuning study``)."""


def check_kind(old: dict[str, Any] | None, out: Path, name: str, kind: str) -> None:
    """Refuse a ``kind`` study (seeds, tune) under the name of a study of another kind: the
    same config hashes alike in both (the tune block is not part of it), so its manifest
    would be replaced (a tuning study then no longer is one to ``--from-best``)."""
    was = None if old is None else old.get("kind", "seeds")
    if was is None or was == kind:
        return
    fix = (f"give this {KIND_WORDS.get(kind, kind)} study another name (e.g. --name {name}_{kind})"
           + (f", or run the seed study of its best candidate: `study run --from-best {name} "
              f"--name {name}_seeds --out {out}`" if was == "tune" else ""))
    raise StudyStateError(
        f"study {name!r} in {out} is a {KIND_WORDS.get(was, was)} study; a {KIND_WORDS.get(kind, kind)} study "
        f"under its name would replace its manifest. Fix: {fix}"
    )


def prepare(
    out: Path, name: str, cfg: StudyConfig, kind: str, facts: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Create or update the manifest; refuse a changed config under an existing name.

    ``facts`` is what :func:`study.runner.check_before_ray` returns (analysis, splits).
    """
    old = read(out, name)
    check_kind(old, out, name, kind)
    if old is not None and old.get("config_hash") != cfg.identity_hash:
        raise StudyStateError(
            f"study {name!r} in {out} was created with a different config "
            f"(hash {old.get('config_hash')} != {cfg.identity_hash}); changed: "
            f"{config_diff(old.get('config') or {}, cfg.raw) or resolved_diff(out, name, old, cfg)}. Fix: give a new name with "
            f"--name to start a separate study, or restore the original config (file and "
            f"overrides; `study resume {name}` reruns the recorded one) to resume it."
        )
    code = plugin_code(cfg)
    changed = changed_plugin_code(old, code)
    if changed and committed(out, name):
        from rich.console import Console

        Console(stderr=True).print(
            f"warning: the plugin code of study {name!r} changed since its committed runs ("
            + "; ".join(changed) + "): the runs trained from now on use the new code, and the trials "
            "table's versions_json tells them apart. To keep them apart, run the changed code under "
            "a new --name", soft_wrap=True, highlight=False, markup=False,
        )
    fewer = [(p, _old_count(old, p.trial_id)) for p in cfg.points if p.seeds.count < _old_count(old, p.trial_id)]
    if fewer:
        from rich.console import Console

        p, had = fewer[0]
        Console(stderr=True).print(
            f"note: study {name!r} already plans {had} seeds for {len(fewer)} of its configs; asking for "
            f"{p.seeds.count} removes none (committed runs are results): it keeps {had}, and runs those not "
            "yet committed. To study fewer "
            "seeds, select them in SQL (WHERE seed < N), or run the config under a new --name",
            soft_wrap=True, highlight=False, markup=False,
        )
    now = dt.datetime.now(dt.UTC).isoformat()
    first = cfg.points[0].spec
    seeds = max(p.seeds.count for p in cfg.points)
    if old is not None:
        seeds = max(seeds, int(old.get("seeds", 0)))
    manifest = {
        **(old or {}),
        "name": name,
        "kind": kind,
        "task": first.task_name,
        "model": first.model_name,
        "config": cfg.raw,
        "config_yaml": yaml.safe_dump(cfg.raw, sort_keys=False),
        "overrides": list(cfg.overrides),
        "plugin_dir": cfg.plugin_dir,
        "plugins": plugin_sources(cfg),
        "plugin_code": code,
        "config_hash": cfg.identity_hash,
        "created_at": (old or {}).get("created_at", now),
        "updated_at": now,
        "git_sha": git_sha(),
        "version": versions().get("fineline", ""),
        "seeds": seeds,
        "points": [
            {"trial_id": p.trial_id, "point": p.values, "seeds": max(p.seeds.count, _old_count(old, p.trial_id))}
            for p in cfg.points
        ],
        "analysis": facts.get("analysis", {}),
        "splits": facts.get("splits", []),
        **(extra or {}),
    }
    write(out, name, manifest)
    return manifest


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: value}`` (lists and empty blocks are values)."""
    if not isinstance(config, dict) or (prefix and not config):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for k, v in config.items():
        flat.update(flatten(v, f"{prefix}{k}."))
    return {k.removesuffix("."): v for k, v in flat.items()}


def config_diff(old: dict[str, Any], new: dict[str, Any], limit: int = DIFF_LINES) -> str:
    """What changed between two raw study configs: ``train.lr 0.125 -> 0.5; ...`` (dotted
    keys, old -> new, ``(unset)`` for a missing key), at most ``limit`` keys then a count, or
    "" when the raw configs agree. Keys that never change the identity (:data:`NOT_IDENTITY`,
    seed counts) are left out."""
    a, b = flatten(old), flatten(new)
    keys = [
        k for k in sorted(set(a) | set(b))
        if a.get(k, _UNSET) != b.get(k, _UNSET)
        and k.split(".")[0] not in NOT_IDENTITY and not (k == "seeds.count" or k.endswith(".seeds.count"))
    ]
    if not keys:
        return ""
    shown = [f"{k} {_value(a.get(k, _UNSET))} -> {_value(b.get(k, _UNSET))}" for k in keys[:limit]]
    more = f"; ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(shown) + more


_UNSET = object()


def resolved_diff(out: Path, name: str, old: dict[str, Any], cfg: StudyConfig) -> str:
    """What changed when the study file and overrides did not: the resolved config of each
    grid point (defaults filled in) against what its committed runs recorded (``trials``'
    ``config_json``), e.g. a field a plugin added with a default."""
    from trainables.results import read_rows

    recorded: dict[str, dict[str, Any]] = {}
    for r in read_rows(out, name, "trials", ["trial_id", "config_json"]):
        if r["trial_id"] and r["config_json"]:
            recorded.setdefault(str(r["trial_id"]), json.loads(r["config_json"]))
    before = [recorded.get(str(p.get("trial_id"))) for p in old.get("points", [])]
    for was, point in zip(before, cfg.points, strict=False):
        if was is None:
            continue
        now = json.loads(json.dumps(point.spec.to_dict(), default=str))
        diff = config_diff({k: v for k, v in was.items() if k != "seeds"}, now)
        if diff:
            return (f"nothing in the study file or overrides, but the resolved config moved: {diff} (a default "
                    "of fineline or of a plugin changed: a plugin's new field keeps old studies' ids when "
                    "declared with added_field(default, identity_default=...), docs/plugins.md section 6)")
    return ("nothing in the study file or overrides, but they resolve to a different config "
            "(a default of fineline or of a plugin changed?)")


def _value(v: Any, width: int = 40) -> str:
    text = "(unset)" if v is _UNSET else json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def plugin_sources(cfg: StudyConfig) -> dict[str, str]:
    """Where the study's task and model classes came from (module and plugin), by name."""
    from trainables.registry import MODELS, TASKS

    out: dict[str, str] = {}
    for p in cfg.points:
        out[f"task {p.spec.task_name}"] = TASKS.entry(p.spec.task_name).source
        out[f"model {p.spec.model_name}"] = MODELS.entry(p.spec.model_name).source
    return out


def plugin_code(cfg: StudyConfig) -> dict[str, str]:
    """The code of the study's plugin tasks and models, by name (``task X`` / ``model Y``):
    the distribution and version whose entry point registered it, if any, and a SHA-256 over the ``.py``
    files of the package (or module) that defines the class. fineline's own classes are
    covered by ``version`` and ``git_sha``."""
    from trainables.registry import MODELS, TASKS

    out: dict[str, str] = {}
    for p in cfg.points:
        for kind, entry in (("task", TASKS.entry(p.spec.task_name)), ("model", MODELS.entry(p.spec.model_name))):
            top_name = entry.cls.__module__.split(".")[0]
            if top_name == "trainables" or f"{kind} {entry.cls.name}" in out:  # type: ignore[attr-defined]
                continue
            top = sys.modules[top_name]
            paths = list(getattr(top, "__path__", None) or [])
            files = sorted(Path(paths[0]).rglob("*.py")) if paths else [Path(str(top.__file__))]
            digest = hashlib.sha256()
            for f in files:
                digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
            dist = entry.origin.dist if entry.origin is not None else ""
            where = dist or (files[0].name if not paths else f"{top_name}/")
            out[f"{kind} {entry.cls.name}"] = f"{where}, sha256:{digest.hexdigest()[:16]}"  # type: ignore[attr-defined]
    return out


def run_versions(manifest: dict[str, Any]) -> dict[str, str]:
    """What a trial row's ``versions_json`` records: :func:`versions` and, as ``plugin task
    X`` / ``plugin model Y``, the plugin code that :func:`prepare` recorded in ``manifest``
    (:func:`plugin_code`; hashed once per start)."""
    return versions() | {f"plugin {k}": v for k, v in (manifest.get("plugin_code") or {}).items()}


def changed_plugin_code(old: dict[str, Any] | None, now: dict[str, str]) -> list[str]:
    """``key: was -> now`` for each plugin whose code differs from what ``old`` (a manifest)
    recorded."""
    before = (old or {}).get("plugin_code") or {}
    return [f"{k}: {before[k]} -> {v}" for k, v in sorted(now.items()) if k in before and before[k] != v]


def _old_count(old: dict[str, Any] | None, trial_id: str) -> int:
    for p in (old or {}).get("points", []):
        if p.get("trial_id") == trial_id:
            return int(p.get("seeds", 0))
    return 0
