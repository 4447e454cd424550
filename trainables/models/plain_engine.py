"""The bundling engine behind :mod:`trainables.models.plain`: one seed's ``nn.Module`` run
for K members through ``torch.func``.

* :func:`stack_module` turns a one-seed module into the bundle's *skeleton*: the same
  module tree whose every parameter and buffer is replaced by a zero tensor with a leading
  member dimension ``(K, *shape)`` (ties kept). The skeleton is never called directly: it
  holds the stacked ``nn.Parameter`` s (what the trainer's optimizer, clipping, compaction
  and checkpoints see) and is the template :func:`torch.func.functional_call` runs with one
  member's slices.
* :class:`NoiseFeed` carries the dropout calls of one forward: a *probe* feed records each
  call's ``(p, per-member shape)``; an *apply* feed hands out the masks drawn for them, in
  call order. :class:`~trainables.models.plain.Dropout` reads the active feed.
* :class:`RandomOpWatch` finds a random op (an aten op tagged ``nondeterministic_seeded``)
  run by a module during the probe, with the path of the module that ran it.
* :func:`call_vmap` / :func:`call_loop` compute every member: one vmapped
  ``functional_call``, or one ``functional_call`` per member (the fallback); both return
  the module's outputs with a leading member dimension.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._python_dispatch import TorchDispatchMode

Tensors = dict[str, torch.Tensor]
DropoutCall = tuple[float, tuple[int, ...]]
"""One dropout call of a forward: ``(p, per-member activation shape)``."""


# --- the skeleton ------------------------------------------------------------------------


def stack_module(module: nn.Module, k: int) -> nn.Module:
    """Replace every parameter (and buffer) of ``module`` in place by zeros ``(K, *shape)``.

    Tied tensors stay tied (one stacked tensor for every place the original sat). Returns
    ``module``, now the skeleton.
    """
    stacked: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if id(p) not in stacked:
                stacked[id(p)] = nn.Parameter(
                    p.new_zeros((k, *p.shape)), requires_grad=p.requires_grad
                )
            setattr(sub, name, stacked[id(p)])
        for name, b in list(sub.named_buffers(recurse=False)):
            if id(b) not in stacked:
                stacked[id(b)] = b.new_zeros((k, *b.shape))
            setattr(sub, name, stacked[id(b)])
    return module


# --- dropout calls -----------------------------------------------------------------------


class NoiseFeed:
    """The dropout calls of one member forward: recorded (``masks`` None) or fed masks."""

    def __init__(self, masks: Sequence[torch.Tensor] | None) -> None:
        self.masks = masks
        """Per-member masks, one per call in call order (under vmap: batched views)."""
        self.calls: list[DropoutCall] = []
        self.next = 0

    def apply(self, p: float, x: torch.Tensor) -> torch.Tensor:
        """Member's activation ``x`` times its next mask (probe: record the call, return x)."""
        if self.masks is None:
            self.calls.append((p, tuple(x.shape)))
            return x
        if self.next >= len(self.masks):
            raise RuntimeError(
                "a plain module made more Dropout calls than its probe pass did: the number "
                "of dropout calls must not depend on the data"
            )
        mask = self.masks[self.next]
        self.next += 1
        if mask.shape != x.shape:
            raise RuntimeError(
                f"Dropout call {self.next - 1}: activation shape {tuple(x.shape)} differs from "
                f"the probed {tuple(mask.shape)}: activation shapes must follow the input shape"
            )
        return x * mask.to(x.dtype)


_ACTIVE = threading.local()


def active_feed() -> NoiseFeed | None:
    """The feed of the member forward running now in this thread (None: outside fineline)."""
    return getattr(_ACTIVE, "feed", None)


@contextmanager
def feeding(feed: NoiseFeed) -> Iterator[NoiseFeed]:
    before = active_feed()
    _ACTIVE.feed = feed
    try:
        yield feed
    finally:
        _ACTIVE.feed = before


# --- random ops --------------------------------------------------------------------------


class RandomOpWatch(TorchDispatchMode):
    """Notes the first random aten op run under it and the module path running it."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would wrap ``__torch_dispatch__`` in ``torch._disable_dynamo``, whose
        first call imports ``torch._dynamo`` (about a core-second in every new worker
        process); nothing runs compiled under this mode."""
        return False

    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.root = root
        self.path: list[str] = []
        self.found: tuple[str, str] | None = None
        """(op, module path) of the first random op, or None."""
        self._hooks: list[Any] = []

    def __enter__(self) -> RandomOpWatch:
        for name, sub in self.root.named_modules():
            self._hooks.append(sub.register_forward_pre_hook(self._enter_module(name or "(root)")))
            self._hooks.append(sub.register_forward_hook(self._leave_module))
        return super().__enter__()  # type: ignore[no-any-return]

    def _enter_module(self, name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            self.path.append(name)

        return hook

    def _leave_module(self, *_: object) -> None:
        self.path.pop()

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.found is None and torch.Tag.nondeterministic_seeded in func.tags:
            self.found = (str(func.overloadpacket.__name__), self.path[-1] if self.path else "(root)")
        return func(*args, **(kwargs or {}))


# --- computing the members ---------------------------------------------------------------


def member_call(
    skeleton: nn.Module, params: Tensors, buffers: Tensors, feed: NoiseFeed,
    inputs: Sequence[torch.Tensor],
) -> Any:
    """One member's forward: ``skeleton`` run with that member's tensors and dropout feed."""
    with feeding(feed):
        return functional_call(skeleton, (params, buffers), tuple(inputs))


def make_vmapped(skeleton: nn.Module, shared: tuple[bool, ...]) -> Callable[..., Any]:
    """``f(params, buffers, masks, *inputs)`` over the members; ``shared[i]``: input i is
    the same for every member (passed without its member dimension)."""

    def one(params: Tensors, buffers: Tensors, masks: tuple[torch.Tensor, ...], *inputs: torch.Tensor) -> Any:
        return member_call(skeleton, params, buffers, NoiseFeed(masks), inputs)

    dims = tuple(None if s else 0 for s in shared)
    return vmap(one, in_dims=(0, 0, 0, *dims), randomness="error")  # type: ignore[no-any-return]


def call_loop(
    skeleton: nn.Module, params: Tensors, buffers: Tensors, masks: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor], shared: tuple[bool, ...], k: int,
) -> Any:
    """The fallback: one ``functional_call`` per member, outputs stacked ``(K, ...)``."""
    outs = []
    for m in range(k):
        outs.append(member_call(
            skeleton,
            {n: p[m] for n, p in params.items()},
            {n: b[m] for n, b in buffers.items()},
            NoiseFeed([mask[m] for mask in masks]),
            [x[0] if s else x[m] for x, s in zip(inputs, shared, strict=True)],
        ))
    return stack_outputs(outs)


def stack_outputs(outs: Sequence[Any]) -> Any:
    """Stack K members' outputs (tensors, or tuples / lists / dicts of them) along dim 0."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(outs))
    if isinstance(first, dict):
        return {key: stack_outputs([o[key] for o in outs]) for key in first}
    if isinstance(first, (tuple, list)):
        parts = [stack_outputs(p) for p in zip(*outs, strict=True)]
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    raise TypeError(f"a plain module returned {type(first).__name__}: return tensors (or tuples, lists, dicts of them)")
