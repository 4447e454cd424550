"""The reference seq2seq implementation: plain eager torch modules, one member (K = 1).

This is the baseline (what one would write first) and the oracle the fast path is tested
against: ``nn.Embedding``, ``nn.LSTM`` over a packed source (so each source's final
state is taken at its own last position, and the backward direction of a bidirectional
encoder starts there), ``nn.LSTM`` over the padded teacher-forced decoder input, and
``nn.Linear`` layers applied at every padded position (padding masked in the loss).

**Input feeding** (``Arch.input_feeding``; Luong et al. 2015, sec. 3.3, as OpenNMT-py's
``InputFeedRNNDecoder``): decoder layer 0's input at step t is ``[emb(y_{t-1}); h~_{t-1}]``
with ``h~_0 = 0``, so the decoder runs one step at a time (:meth:`ReferenceEngine.feed_step`),
in teacher forcing as in greedy or beam decoding. The ``h~`` fed back is the one the output
layer reads, after dropout (OpenNMT-py feeds its dropped-out ``decoder_output``); the
dropout protocol is unchanged (the same masks, drawn in the same order).

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
    pad_classes,
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
        mask = dropout_masks(noise, a.dropout, batch.src_counts, a.emb) if a.embedding_dropout else None
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
        return self._combine(m, ctx, dec)

    def _combine(self, m: _Bound, ctx: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        """The attentional state ``h~ = tanh(W_c [ctx; dec])``, or without the ``tanh``
        (``Arch.attention_tanh`` False: TensorFlow 1's ``AttentionWrapper``)."""
        pre = m("combine", torch.cat([ctx, dec], -1))
        return torch.tanh(pre) if self.arch.attention_tanh else pre

    def output(self, m: _Bound, u: torch.Tensor) -> torch.Tensor:
        """The output layer: h~ (..., Hd) -> logits (..., V) over every target id (ids the
        layer leaves out, ``Arch.out_offset``, at :data:`~layout.EXCLUDED_LOGIT`)."""
        return pad_classes(m("out", u), self.arch.out_offset)

    def feed_step(
        self,
        m: _Bound,
        y: torch.Tensor,
        feed: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        enc: torch.Tensor,
        keys: torch.Tensor | None,
        src_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One input-feeding decoder step: target embeddings y (B, E), the previous h~ (B, Hd),
        the decoder state (h, c) (L, B, Hd) -> this step's h~ (B, Hd) (before dropout) and
        the new state. Layer 0 reads ``[y; feed]``; ``keys`` (B, S, Hd) are ``W_a enc``.

        Written with ``torch.lstm_cell`` (``nn.LSTMCell``'s step) on each layer's weights and
        the attention of one query as multiply-and-sum: in a profile of a training step at
        the paper's sizes, one-step ``nn.LSTM`` calls (oneDNN) and one-row ``bmm`` s took
        about 40% of the time."""
        h, c = state
        w = m.by_module["decoder"]
        x = torch.cat([y, feed], -1)
        hs, cs = [], []
        for n in range(self.arch.layers):
            h_n, c_n = torch.lstm_cell(
                x, (h[n], c[n]), w[f"weight_ih_l{n}"], w[f"weight_hh_l{n}"],
                w[f"bias_ih_l{n}"], w[f"bias_hh_l{n}"],
            )
            hs.append(h_n)
            cs.append(c_n)
            x = h_n
        state = (torch.stack(hs), torch.stack(cs))
        if keys is None:  # no attention
            return x, state
        scores = (keys * x.unsqueeze(1)).sum(-1).masked_fill(~src_mask, float("-inf"))  # (B, S)
        ctx = (scores.softmax(-1).unsqueeze(-1) * enc).sum(1)  # (B, He)
        return self._combine(m, ctx, x), state

    def _feed_decoder(
        self,
        m: _Bound,
        y: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        enc: torch.Tensor,
        src_mask: torch.Tensor,
        drop: torch.Tensor | None,
    ) -> torch.Tensor:
        """Teacher-forced input feeding: y (B, T, E) -> h~ (B, T, Hd), each step multiplied by
        its dropout multipliers ``drop[:, t]`` (B, T, Hd) before it is fed back."""
        keys = m("attn", enc) if self.arch.attention else None
        feed = y.new_zeros(y.shape[0], self.arch.dec_hidden)  # h~_0 = 0
        steps = []
        for t in range(y.shape[1]):
            feed, state = self.feed_step(m, y[:, t], feed, state, enc, keys, src_mask)
            if drop is not None:
                feed = feed * drop[:, t]
            steps.append(feed)
        return torch.stack(steps, 1)

    def logits(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, noise: MemberNoise | None
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) of the member (padded positions included)."""
        if batch.src.shape[0] != 1:
            raise ValueError("the reference implementation runs one member (K = 1)")
        a = self.arch
        m = _Bound(self.modules, self.layout, params)
        enc, state = self._encode(m, batch, noise)
        tgt_in, tgt_mask = batch.tgt_in[0], batch.tgt_mask[0]
        b, t = tgt_in.shape
        positions = torch.nonzero(tgt_mask.flatten()).squeeze(1)
        y = m("tgt_emb", tgt_in)  # (B, T, E)
        mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.tgt_emb_size) if a.embedding_dropout else None
        if mask is not None:
            y = y * scatter_rows(mask, positions, (b, t, a.tgt_emb_size))
        if a.input_feeding:
            mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.dec_hidden)
            drop = None if mask is None else scatter_rows(mask, positions, (b, t, a.dec_hidden))
            u = self._feed_decoder(m, y, state, enc, batch.src_mask[0], drop)
        else:
            dec, _ = m("decoder", y, state)  # (B, T, Hd)
            u = self._attend(m, dec, enc, batch.src_mask[0])
            mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.dec_hidden)
            if mask is not None:
                u = u * scatter_rows(mask, positions, (b, t, a.dec_hidden))
        return self.output(m, u)  # (B, T, V)

    def token_outputs(
        self,
        params: Mapping[str, torch.Tensor],
        batch: Seq2SeqBatch,
        noise: MemberNoise | None,
        hits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-entropy of every target token (1, N) in (example, time) order; with
        ``hits`` also whether each token is the argmax of its logits (1, N) bool."""
        logits = self.logits(params, batch, noise)  # (B, T, V)
        tgt_mask = batch.tgt_mask[0]
        b, t = tgt_mask.shape
        positions = torch.nonzero(tgt_mask.flatten()).squeeze(1)
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
        self.feed: torch.Tensor | None = None  # input feeding: the previous h~ (N, Hd)
        self.keys: torch.Tensor | None = None
        if engine.arch.input_feeding:
            self.feed = enc.new_zeros(self.enc.shape[0], engine.arch.dec_hidden)
            self.keys = m("attn", self.enc) if engine.arch.attention else None

    def step(self, prev: torch.Tensor) -> torch.Tensor:
        """prev (1, N) -> logits (1, N, V)."""
        if self.feed is not None:
            y = self.m("tgt_emb", prev[0])  # (N, E)
            self.feed, (self.h, self.c) = self.engine.feed_step(
                self.m, y, self.feed, (self.h, self.c), self.enc, self.keys, self.src_mask
            )
            return self.engine.output(self.m, self.feed).unsqueeze(0)
        y = self.m("tgt_emb", prev[0].unsqueeze(1))  # (N, 1, E)
        dec, (self.h, self.c) = self.m("decoder", y, (self.h, self.c))  # (N, 1, Hd)
        u = self.engine._attend(self.m, dec, self.enc, self.src_mask)
        return self.engine.output(self.m, u[:, 0]).unsqueeze(0)

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor:
        """Greedy step: prev (1, N) -> argmax tokens (1, N)."""
        return self.step(prev).argmax(-1)

    def greedy(self, steps: torch.Tensor, t_max: int) -> torch.Tensor:
        return greedy_decode(self, steps, t_max)

    def reorder(self, index: torch.Tensor) -> None:
        self.h = self.h.index_select(1, index[0])
        self.c = self.c.index_select(1, index[0])
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index[0])
