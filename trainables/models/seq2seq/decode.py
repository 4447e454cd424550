"""Greedy and beam-search decoding over a *stepper* (either implementation's decoder state).

A stepper holds K members x N hypotheses and offers ``step(prev (K, N)) -> logits (K, N,
V)``, ``next_tokens(prev) -> argmax tokens (K, N)``, ``reorder(index (K, N))`` and
``greedy(steps, t_max)``, which is :func:`greedy_decode` of itself or a faster equivalent.
``t_max``, the most steps of any example, comes from the host (the batch's
``decode_steps``): reading it from ``steps`` would make the host wait for the device, which
a captured evaluation cannot. Both
decoders run a fixed number of steps per example (the task's ``decode_len``), so a
prediction includes the position where EOS belongs; the batch runs to its longest example
and each output is cut to its own length.

Beam search (``width > 1``): a hypothesis' score is the sum of its token log-probabilities
(no length normalisation). A hypothesis that emitted EOS is finished: it keeps its score
and is extended only by EOS, so it competes with the open ones until the end. The result
for an example is the best hypothesis after exactly that example's number of steps.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trainables.data import BOS, EOS


class Stepper(Protocol):
    def greedy(self, steps: torch.Tensor, t_max: int) -> torch.Tensor:
        """:func:`greedy_decode` of this stepper (an implementation may do it in one call)."""
        ...

    def step(self, prev: torch.Tensor) -> torch.Tensor: ...

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor: ...

    def reorder(self, index: torch.Tensor) -> None: ...


def greedy_decode(stepper: Stepper, steps: torch.Tensor, t_max: int) -> torch.Tensor:
    """Argmax decoding. steps (K, B) int64 -> tokens (K, B, t_max) int64."""
    k, b = steps.shape
    out = torch.empty(k, b, t_max, dtype=torch.int64, device=steps.device)
    prev = torch.full((k, b), BOS, dtype=torch.int64, device=steps.device)
    for t in range(t_max):
        prev = stepper.next_tokens(prev)
        out[:, :, t] = prev
    return out


def decode(stepper: Stepper, steps: torch.Tensor, width: int, t_max: int) -> torch.Tensor:
    """Greedy decoding (``width`` 1) or beam search: steps (K, B) int64, at most ``t_max``
    -> tokens (K, B, t_max) int64."""
    return stepper.greedy(steps, t_max) if width == 1 else beam_decode(stepper, steps, width, t_max)


def beam_decode(stepper: Stepper, steps: torch.Tensor, width: int, t_max: int) -> torch.Tensor:
    """Beam search (see the module doc). The stepper holds N = B * width hypotheses,
    example b's in rows b * width .. (b + 1) * width - 1. Returns (K, B, t_max)."""
    k, b = steps.shape
    dev = steps.device
    scores = torch.full((k, b, width), float("-inf"), device=dev)
    scores[:, :, 0] = 0.0  # all beams start identical: expand only the first
    tokens = torch.zeros(k, b, width, t_max, dtype=torch.int64, device=dev)
    finished = torch.zeros(k, b, width, dtype=torch.bool, device=dev)
    best = torch.zeros(k, b, t_max, dtype=torch.int64, device=dev)
    prev = torch.full((k, b * width), BOS, dtype=torch.int64, device=dev)
    row0 = (torch.arange(b, device=dev) * width).view(1, b, 1)
    for t in range(t_max):
        logp = stepper.step(prev).log_softmax(-1).view(k, b, width, -1)  # (K, B, W, V)
        v = logp.shape[-1]
        eos_only = torch.full_like(logp[0, 0, 0], float("-inf"))
        eos_only[EOS] = 0.0
        logp = torch.where(finished.unsqueeze(-1), eos_only, logp)
        cand = (scores.unsqueeze(-1) + logp).view(k, b, width * v)
        scores, flat = cand.topk(width, -1)  # (K, B, W), best first
        src, tok = flat // v, flat % v
        tokens = tokens.gather(2, src.view(k, b, width, 1).expand_as(tokens))
        tokens[..., t] = tok
        finished = finished.gather(2, src) | (tok == EOS)
        stepper.reorder((row0 + src).view(k, b * width))
        prev = tok.view(k, b * width)
        done = steps == t + 1  # (K, B): examples whose last step this was
        best = torch.where(done.unsqueeze(-1), tokens[:, :, 0], best)  # (no host sync, as [done] would)
    return best
