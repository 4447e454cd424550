"""Helpers shared by test modules (importable because tests/ is on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
"""The published reference data beside the project (absent in a bare clone)."""
TINY_STUDY: dict[str, Any] = {
    "name": "tiny",
    "task": {"name": "symbol_rewriting", "n_symbols": 12, "train_size": 300, "val_size": 40,
             "val_ood_size": 40, "test_size": 40, "train_lengths": [2, 4], "val_ood_lengths": [2, 5],
             "repeat_lengths": [3, 5], "short_lengths": [1, 2], "long_lengths": [5, 6]},
    "model": {"name": "seq2seq", "emb_size": 8, "hidden_size": 8},
    "train": {"optimizer": "sgd", "lr": 0.125, "clip_norm": 5.0, "batch_size": 16, "max_epochs": 2},
    "seeds": {"count": 3, "root": 5},
    "execution": {"bundle_size": 2},
}
"""A symbol-rewriting study that trains in seconds (the CLI tests start from it)."""
TOY_STUDY: dict[str, Any] = {
    "task": {"name": "toy2d", "n_train": 600, "n_eval": 200},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.01, "max_steps": 400, "eval_every_steps": 50, "batch_size": 8,
              "selection": {"split": "train_eval", "metric": "accuracy", "mode": "max", "early_stop": False}},
    "seeds": {"count": 2},
}
"""A step-based 2-D toy study of a small MLP (the progress tests set its name and pace)."""
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Leaf chart cells of the Vega scenegraph (SVG renderer) and the marks drawn in each.
CELL_MARKS_JS = """() => {
  const isCell = g => /(^| )((concat_\\d+_)+group|view_\\w+_group)( |$)/.test(g.getAttribute('class'));
  const cells = Array.from(document.querySelectorAll('#charts svg g.mark-group')).filter(isCell);
  const leaves = cells.filter(c => !Array.from(c.querySelectorAll('g.mark-group')).some(isCell));
  const sel = ['.mark-symbol path', '.mark-rect path', '.mark-line path', '.mark-area path',
               '.mark-rule line', '.mark-tick line', '.mark-rule path', '.mark-tick path'].join(', ');
  return leaves.map(c => [c.getAttribute('class'), c.querySelectorAll(sel).length]);
}"""


def open_report(browser: Any, page_path: Path) -> tuple[Any, list[str]]:
    """Load the report, wait for vega-embed, and return the page with its error messages."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "request",
        lambda r: errors.append(f"network: {r.url}") if r.url.startswith("http") else None,
    )
    page.goto(page_path.as_uri())
    page.wait_for_function("window.fineline && window.fineline.ready", timeout=60_000)
    return page, errors


def assert_replayed_round_equals_eager(graphed: Any, eager: Any) -> None:
    """Two fresh bundles of one config on CUDA with ``execution.cuda_graphs``
    (:class:`~trainables.loop.BundleRun`): ``eager`` never captures (the same batches and
    masks, op by op); after one round each, ``graphed`` replayed steps and both hold the
    same parameters."""
    import torch

    assert graphed.captured is not None and eager.captured is not None
    eager.captured.warm_sightings = 10**9
    graphed.train_round()
    eager.train_round()
    assert graphed.captured.failed is None, graphed.captured.failed
    assert graphed.captured.replays > 0 and eager.captured.replays == 0
    for (name, p), q in zip(graphed.model.named_parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
