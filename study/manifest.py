"""The study manifest ``OUT/<NAME>/study.json``: what a study is, for resume and analysis.

It stores the raw study config (so ``study resume NAME`` needs no file), its identity
hash (a changed config under the same name is refused), the planned points, and what the
task wants analysed (so ``analysis`` never imports ``trainables``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Any

from study.config import StudyConfig
from trainables.errors import StudyStateError


def study_dir(out: Path, name: str) -> Path:
    return Path(out) / name


def manifest_path(out: Path, name: str) -> Path:
    return study_dir(out, name) / "study.json"


REQUIRED = ("config", "seeds", "points")
"""Keys every manifest fineline writes has (a file without them is damaged)."""


def read(out: Path, name: str) -> dict[str, Any] | None:
    """The manifest of study ``name`` (None if there is none); a damaged one (not JSON, not
    UTF-8, unreadable, missing keys) is a StudyStateError naming the file and the fix."""
    path = manifest_path(out, name)
    if not path.exists():
        return None
    fix = (
        f"restore {path} from a backup, or move it away and re-create it with "
        f"`study run CONFIG --name {name} --out {out}` (committed runs are kept)"
    )
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:120]
        raise StudyStateError(f"the manifest {path} is damaged ({why}). Fix: {fix}") from None
    missing = [k for k in REQUIRED if k not in data] if isinstance(data, dict) else list(REQUIRED)
    if missing or not isinstance(data.get("config"), dict):
        raise StudyStateError(
            f"the manifest {path} is damaged (no {', '.join(missing) or 'config block'}). Fix: {fix}"
        )
    return data  # type: ignore[no-any-return]


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


def prepare(
    out: Path, name: str, cfg: StudyConfig, kind: str, facts: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Create or update the manifest; refuse a changed config under an existing name.

    ``facts`` is what :func:`study.runner.check_before_ray` returns (analysis, splits).
    """
    old = read(out, name)
    if old is not None and old.get("config_hash") != cfg.identity_hash:
        raise StudyStateError(
            f"study {name!r} in {out} was created with a different config "
            f"(hash {old.get('config_hash')} != {cfg.identity_hash}). Give a new name with "
            f"--name to start a separate study, or restore the original config to resume it."
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
        "plugin_dir": cfg.plugin_dir,
        "plugins": plugin_sources(cfg),
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


def plugin_sources(cfg: StudyConfig) -> dict[str, str]:
    """Where the study's task and model classes came from (module and plugin), by name."""
    from trainables.registry import MODELS, TASKS

    out: dict[str, str] = {}
    for p in cfg.points:
        out[f"task {p.spec.task_name}"] = TASKS.entry(p.spec.task_name).source
        out[f"model {p.spec.model_name}"] = MODELS.entry(p.spec.model_name).source
    return out


def _old_count(old: dict[str, Any] | None, trial_id: str) -> int:
    for p in (old or {}).get("points", []):
        if p.get("trial_id") == trial_id:
            return int(p.get("seeds", 0))
    return 0
