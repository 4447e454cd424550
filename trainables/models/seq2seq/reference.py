"""The reference seq2seq implementation: plain eager torch modules, one member (K = 1).

This is the baseline (what one would write first) and the oracle the fast path is tested
against: ``nn.Embedding``, ``nn.LSTM`` over a packed source (so each source's final
state is taken at its own last position, and the backward direction of a bidirectional
encoder starts there), ``nn.LSTM`` over the padded teacher-forced decoder input, and
``nn.Linear`` layers applied at every padded position (padding masked in the loss).

The modules live on the ``meta`` device and own no memory; each call runs them with
``torch.func.functional_call`` on the member-0 slices of the model's stacked parameters,
so the parameters keep the member dim every model shares (the trainer's per-member
clipping and the optimizer see the same layout as for the fast path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from trainables.models.base import MemberNoise
from trainables.models.seq2seq.decode import greedy_decode
from trainables.models.seq2seq.layout import (
    IGNORE,
    Arch,
    Engine,
    Seq2SeqBatch,
    build_modules,
    dropout_masks,
    param_layout,
    scatter_rows,
)


class _Bound:
    """The template modules bound to one member's parameter slices."""

    def __init__(
        self,
        modules: nn.ModuleDict,
        layout: Mapping[str, tuple[str, str, Any]],
        params: Mapping[str, torch.Tensor],
    ) -> None:
        self.modules = modules
        self.by_module: dict[str, dict[str, torch.Tensor]] = {}
        for name, (module, pname, _) in layout.items():
            self.by_module.setdefault(module, {})[pname] = params[name][0]

    def __call__(self, module: str, *args: Any) -> Any:
        return functional_call(self.modules[module], self.by_module[module], args)


class ReferenceEngine(Engine):
    """Eager ``nn`` modules over member 0 (see the module docstring)."""

    def __init__(self, arch: Arch) -> None:
        super().__init__(arch)
        self.modules = build_modules(arch, "meta")
        self.layout = param_layout(self.modules)

    def _encode(
        self, m: _Bound, batch: Seq2SeqBatch, noise: MemberNoise | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Encoder outputs (B, S, He) and the decoder's initial (h, c), each (L, B, Hd)."""
        a = self.arch
        src, src_len = batch.src[0], batch.src_len[0]
        b, s = src.shape
        x = m("src_emb", src)  # (B, S, E)
        mask = dropout_masks(noise, a.dropout, batch.src_counts, a.emb)
        if mask is not None:
            x = x * scatter_rows(
                mask, torch.nonzero(batch.src_mask[0].flatten()).squeeze(1), (b, s, a.emb)
            )
        packed = pack_padded_sequence(x, src_len.cpu(), batch_first=True, enforce_sorted=False)
        out, (h, c) = m("encoder", packed)
        enc, _ = pad_packed_sequence(out, batch_first=True, total_length=s)
        # (L * dirs, B, H) -> (L, B, dirs * H): concatenate the directions of each layer
        h = h.view(a.layers, a.directions, b, a.hidden).permute(0, 2, 1, 3).reshape(a.layers, b, -1)
        c = c.view(a.layers, a.directions, b, a.hidden).permute(0, 2, 1, 3).reshape(a.layers, b, -1)
        return enc, (h.contiguous(), c.contiguous())

    def _attend(
        self, m: _Bound, dec: torch.Tensor, enc: torch.Tensor, src_mask: torch.Tensor
    ) -> torch.Tensor:
        """Luong general attention: dec (B, T, Hd), enc (B, S, He) -> h~ (B, T, Hd)."""
        if not self.arch.attention:
            return dec
        scores = torch.bmm(dec, m("attn", enc).transpose(1, 2))  # (B, T, S)
        scores = scores.masked_fill(~src_mask[:, None, :], float("-inf"))
        ctx = torch.bmm(scores.softmax(-1), enc)  # (B, T, He)
        return torch.tanh(m("combine", torch.cat([ctx, dec], -1)))

    def token_outputs(
        self,
        params: Mapping[str, torch.Tensor],
        batch: Seq2SeqBatch,
        noise: MemberNoise | None,
        hits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-entropy of every target token (1, N) in (example, time) order; with
        ``hits`` also whether each token is the argmax of its logits (1, N) bool."""
        if batch.src.shape[0] != 1:
            raise ValueError("the reference implementation runs one member (K = 1)")
        a = self.arch
        m = _Bound(self.modules, self.layout, params)
        enc, state = self._encode(m, batch, noise)
        tgt_in, tgt_mask = batch.tgt_in[0], batch.tgt_mask[0]
        b, t = tgt_in.shape
        positions = torch.nonzero(tgt_mask.flatten()).squeeze(1)
        y = m("tgt_emb", tgt_in)  # (B, T, E)
        mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.emb)
        if mask is not None:
            y = y * scatter_rows(mask, positions, (b, t, a.emb))
        dec, _ = m("decoder", y, state)  # (B, T, Hd)
        u = self._attend(m, dec, enc, batch.src_mask[0])
        mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.dec_hidden)
        if mask is not None:
            u = u * scatter_rows(mask, positions, (b, t, a.dec_hidden))
        logits = m("out", u)  # (B, T, V)
        target = batch.tgt_out[0].masked_fill(~tgt_mask, IGNORE)
        ce = F.cross_entropy(logits.reshape(b * t, -1), target.flatten(), reduction="none")
        hit = None
        if hits:
            hit = (logits.argmax(-1).flatten() == target.flatten())[positions].unsqueeze(0)
        return ce[positions].unsqueeze(0), hit

    def start_decode(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, width: int
    ) -> ReferenceStepper:
        m = _Bound(self.modules, self.layout, params)
        enc, state = self._encode(m, batch, None)
        return ReferenceStepper(self, m, enc, batch.src_mask[0], state, width)


class ReferenceStepper:
    """Step-by-step decoding with the eager modules: N = B * width hypotheses."""

    def __init__(
        self,
        engine: ReferenceEngine,
        m: _Bound,
        enc: torch.Tensor,
        src_mask: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        width: int,
    ) -> None:
        self.engine, self.m = engine, m
        self.enc = enc.repeat_interleave(width, 0)  # (N, S, He)
        self.src_mask = src_mask.repeat_interleave(width, 0)
        self.h, self.c = (x.repeat_interleave(width, 1) for x in state)  # (L, N, Hd)

    def step(self, prev: torch.Tensor) -> torch.Tensor:
        """prev (1, N) -> logits (1, N, V)."""
        y = self.m("tgt_emb", prev[0].unsqueeze(1))  # (N, 1, E)
        dec, (self.h, self.c) = self.m("decoder", y, (self.h, self.c))  # (N, 1, Hd)
        u = self.engine._attend(self.m, dec, self.enc, self.src_mask)
        return self.m("out", u[:, 0]).unsqueeze(0)

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor:
        """Greedy step: prev (1, N) -> argmax tokens (1, N)."""
        return self.step(prev).argmax(-1)

    def greedy(self, steps: torch.Tensor) -> torch.Tensor:
        return greedy_decode(self, steps)

    def reorder(self, index: torch.Tensor) -> None:
        self.h = self.h.index_select(1, index[0])
        self.c = self.c.index_select(1, index[0])
