"""Test helpers shipped with fineline: the (task, model) contract suite for plugin authors.

``from trainables.testing import contract_suite`` (needs pytest); see :mod:`.contract`.
"""

from trainables.testing.contract import contract_suite

__all__ = ["contract_suite"]
