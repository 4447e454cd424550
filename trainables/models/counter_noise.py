"""Counter-based dropout masks: every member's masks in one batched computation.

:class:`~trainables.models.base.MemberNoise` draws each member's masks from that member's
own ``torch.Generator``, one call per member per dropout site: on a GPU that is K kernel
launches per site per step, and generator draws cannot be replayed inside a CUDA graph
with data-dependent sizes. :class:`CounterNoise` is the same protocol (each member its own
stream, a member's masks independent of its bundle) computed from a hash instead:

    u(member k, draw c, element e) = H(H(e xor base_k(c)) + base2_k(c))

where ``base_k(c)`` mixes member k's ``dropout_seed`` with its draw counter ``c`` (a
``(K,)`` int64 tensor on the device, advanced in place by every draw, so a captured graph
advances it too) and ``e`` is the element's *position key*, a function of where the
element sits in the member's own data (e.g. ``(t * B + b) * F + f``), never of the bundle's
padding. A unit is kept when the top 24 bits of ``u`` fall below ``round(keep * 2**24)``.

``H`` is a 32-bit integer hash, hash-prospector's ``[16 21f0aaad 15 735a2d97 15]``
(https://github.com/skeeto/hash-prospector), written in int64 torch ops whose products stay
below 2**63 (both multipliers are below 2**31): the same bits on every device, so a CPU run
and a GPU run with ``execution.cuda_graphs`` draw identical masks. :func:`hash32_reference`
is the same function on Python ints (the tests compare them).

These masks differ from the generator masks (another stream), so turning the setting on
changes a run's trajectory, as the device already does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trainables.models.base import MemberNoise

M32 = 0xFFFFFFFF
C1, C2 = 0x21F0AAAD, 0x735A2D97
GOLDEN = 0x9E3779B9
"""Added to a key to separate the second hash round's input from the first's."""
BITS = 24
"""Bits of ``u`` compared with the keep threshold (a float32 uniform has 24)."""


def hash32_reference(x: int) -> int:
    """:func:`hash32` on one Python int in [0, 2**32)."""
    x ^= x >> 16
    x = (x * C1) & M32
    x ^= x >> 15
    x = (x * C2) & M32
    return x ^ (x >> 15)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """Elementwise 32-bit hash of an int64 tensor of values in [0, 2**32) (see the module doc)."""
    x = x ^ (x >> 16)
    x = (x * C1) & M32
    x = x ^ (x >> 15)
    x = (x * C2) & M32
    return x ^ (x >> 15)


def mix_keys(lo: torch.Tensor, hi: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-member round keys (base, base2), each (K,) in [0, 2**32), from a seed's two 32-bit
    words and the draw counter."""
    base = hash32(hash32(lo ^ hash32(counter & M32)) ^ hi)
    return base, hash32((base + GOLDEN) & M32)


def uniform_bits(base: torch.Tensor, base2: torch.Tensor, elements: torch.Tensor) -> torch.Tensor:
    """The top :data:`BITS` bits of ``u`` for position keys ``elements`` (1 or K, ...) int64
    in [0, 2**32) against per-member keys (K,): (K, ...) int64."""
    view = (-1, *([1] * (elements.dim() - 1)))
    v = hash32((elements ^ base.view(view)) & M32)
    return hash32((v + base2.view(view)) & M32) >> (32 - BITS)


class CounterNoise(MemberNoise):
    """Per-member dropout streams from a counter-based hash (see the module doc); a drop-in
    :class:`MemberNoise` (``dropout_mask``, ``keep``, ``state``) plus :meth:`multipliers`,
    the positional form models with padded batches use.

    ``positional`` tells a model that its masks may be drawn over a padded grid keyed by
    position instead of over each member's real rows in order."""

    positional = True

    def __init__(
        self, seeds: Sequence[int], device: torch.device | str = "cpu",
        rates: Sequence[float] | None = None,
    ) -> None:
        self.device = torch.device(device)
        words = [(int(s) & M32, (int(s) >> 32) & M32) for s in seeds]
        self.lo = torch.tensor([w[0] for w in words], dtype=torch.int64, device=self.device)
        self.hi = torch.tensor([w[1] for w in words], dtype=torch.int64, device=self.device)
        self.counter = torch.zeros(len(words), dtype=torch.int64, device=self.device)
        """Draws made by each member so far (advanced in place by every draw)."""
        if rates is not None and len(rates) != len(words):
            raise ValueError(f"{len(rates)} dropout rates for {len(words)} members")
        self.rates = None if rates is None else tuple(float(r) for r in rates)
        self._member_keep: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return int(self.lo.shape[0])

    def keep(self, rows: Sequence[int]) -> None:
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        self.lo, self.hi, self.counter = (x.index_select(0, index) for x in (self.lo, self.hi, self.counter))
        if self.rates is not None:
            self.rates = tuple(self.rates[r] for r in rows)
        self._member_keep = None

    def state(self) -> list[torch.Tensor]:
        return [self.counter.cpu().clone()]

    def set_state(self, states: Sequence[torch.Tensor]) -> None:
        if len(states) != 1 or tuple(states[0].shape) != tuple(self.counter.shape):
            raise ValueError(
                "this checkpoint's dropout state is not a counter-noise state of "
                f"{len(self)} members (was it written with another execution.cuda_graphs?): "
                "resume with the setting it was written with"
            )
        self.counter.copy_(states[0])

    # ------------------------------------------------------------------ drawing
    def _thresholds(self, p: float) -> tuple[torch.Tensor | float, torch.Tensor | float] | None:
        """(keep threshold on the top bits, scale 1/keep), shared numbers or per member
        (K,) tensors; None when nobody drops anything."""
        if self.rates is None:
            if p == 0.0:
                return None
            keep = 1.0 - p
            return float(round(keep * 2**BITS)), 1.0 / keep
        if not any(self.rates):
            return None
        if self._member_keep is None:
            keeps = [1.0 - r for r in self.rates]
            self._member_keep = (
                torch.tensor([float(round(q * 2**BITS)) for q in keeps], device=self.device),
                torch.tensor([1.0 / q for q in keeps], device=self.device),
            )
        return self._member_keep

    def multipliers(self, p: float, elements: torch.Tensor) -> torch.Tensor | None:
        """Inverted-dropout multipliers (K, ...) float32 for position keys ``elements``
        (1 or K, ...) in [0, 2**32): 0 or 1/(1-p) (member k's own rate with :attr:`rates`);
        None when nobody drops anything (then no draw is counted). Advances every member's
        counter by one."""
        th = self._thresholds(p)
        if th is None:
            return None
        base, base2 = mix_keys(self.lo, self.hi, self.counter)
        self.counter.add_(1)
        bits = uniform_bits(base, base2, elements).to(torch.float32)
        thresh, scale = th
        view = (-1, *([1] * (bits.dim() - 1)))
        if isinstance(thresh, torch.Tensor):
            assert isinstance(scale, torch.Tensor)
            return torch.where(bits < thresh.view(view), scale.view(view), 0.0)
        return torch.where(bits < thresh, scale, 0.0)

    def dropout_mask(self, p: float, shape: Sequence[int]) -> torch.Tensor:
        """:meth:`MemberNoise.dropout_mask`: masks (K, *shape), each element keyed by its
        flat index in ``shape`` (a canonical per-member shape)."""
        elements = torch.arange(math.prod(shape), dtype=torch.int64, device=self.device).view(1, *shape)
        m = self.multipliers(p, elements)
        return torch.ones((len(self), *shape), device=self.device) if m is None else m
