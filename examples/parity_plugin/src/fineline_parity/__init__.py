"""fineline-parity: a worked example of a fineline plugin (a task and a plain-module model).

Installing the package makes both available to every study through the entry point in
``pyproject.toml``; importing this package registers them.
"""

from fineline_parity import model, task

__all__ = ["model", "task"]
