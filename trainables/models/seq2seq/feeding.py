"""Input feeding on the fast path: the decoder of all K members, one step at a time.

With input feeding (``Arch.input_feeding``; Luong et al. 2015, sec. 3.3) decoder layer 0
reads ``[emb(y_{t-1}); h~_{t-1}]``, so step t's attention must run before step t + 1's
LSTM and the decoder cannot run all steps first (:mod:`fast`'s layout). Here every step
is a handful of ``bmm`` s over the member dim, so a bundle of K seeds pays the per-step
Python and dispatch cost once instead of K times (the reference implementation,
:mod:`reference`, runs one seed per model). Shapes: K members, T steps, B examples, S
source positions, Hd decoder units, G = 4 Hd gate units in the cell's order **o, i, f, g**
(:func:`~trainables.models.seq2seq.cells.prepare_gates`).

It uses the training form of the weights (:func:`~trainables.models.seq2seq.weights.build_weights`
without ``evaluation``) for training, teacher-forced losses and decoding alike, with
autograd through plain torch ops: no hand-written backward, no C kernels in the decoder
(the encoder and the output layer keep theirs). The encoder, the dropout protocol and the
token list are the fast path's, so a member computes what the reference computes to float
rounding (tested), and what its lone run computes.

Dropout: the target-embedding masks as without input feeding; the ``h~`` masks (the same
draw) multiply each step's ``h~`` before it is fed back and read by the output layer, as
the reference and OpenNMT-py do.
"""

from __future__ import annotations

import torch

from trainables.models.seq2seq.decode import greedy_decode
from trainables.models.seq2seq.layout import Arch
from trainables.models.seq2seq.weights import Weights, embed_members


def _cell(z: torch.Tensor, c: torch.Tensor, hid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM update from pre-activations z (K, R, 4H) (gate order o, i, f, g) and the
    cell c (K, R, H) -> (h, c)."""
    s = torch.sigmoid(z[..., : 3 * hid])
    o, i, f = s[..., :hid], s[..., hid : 2 * hid], s[..., 2 * hid :]
    c = f * c + i * torch.tanh(z[..., 3 * hid :])
    return o * torch.tanh(c), c


class FeedingDecoder:
    """The input-feeding decoder of one encoded batch: R rows per member (examples, or
    examples x beam hypotheses), stepped with :meth:`step`.

    enc (K, R, S, He) encoder outputs, keys (K, R, S, Hd) ``W_a enc``, src_mask (K, R, S)
    bool, h0 / c0 per layer (K, R, Hd)."""

    def __init__(
        self,
        arch: Arch,
        w: Weights,
        enc: torch.Tensor,
        keys: torch.Tensor,
        h0: list[torch.Tensor],
        c0: list[torch.Tensor],
        src_mask: torch.Tensor,
    ) -> None:
        assert not w.evaluation and w.comb_ctx_t is not None and w.comb_h_t is not None
        k, r, s = src_mask.shape
        self.arch, self.w, self.k, self.r = arch, w, k, r
        self.hid = arch.dec_hidden
        self.h, self.c = list(h0), list(c0)
        self.feed = enc.new_zeros(k, r, self.hid)  # h~_0 = 0
        self.enc, self.keys = enc, keys
        bias = torch.zeros(k, r, s, dtype=enc.dtype, device=enc.device)
        self.bias = bias.masked_fill_(~src_mask, float("-inf"))
        e = arch.tgt_emb_size
        l0 = w.decoder[0]
        self.w_emb = l0.w_ih_t[:, :e]  # (K, E, G): layer 0's weights on the embedding ...
        self.w_feed = l0.w_ih_t[:, e:]  # (K, Hd, G): ... and on the fed-back h~

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """Layer 0's input projection of target embeddings, bias included: y (K, ..., E) ->
        (K, ..., G); for teacher forcing all steps in one ``bmm``."""
        k, e = y.shape[0], y.shape[-1]
        l0 = self.w.decoder[0]
        return torch.baddbmm(l0.bias, y.reshape(k, -1, e), self.w_emb).view(*y.shape[:-1], -1)

    def step(self, y_proj: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        """One step from layer 0's projected input y_proj (K, R, G): the attentional state
        h~ (K, R, Hd), multiplied by the dropout multipliers ``drop`` (K, R, Hd) when given,
        and fed back at the next step."""
        w, hid = self.w, self.hid
        x = self.feed
        for n, layer in enumerate(w.decoder):
            if n == 0:  # the projected embedding plus the fed-back h~
                z = torch.baddbmm(y_proj, x, self.w_feed)
            else:  # the layer below's h
                z = torch.baddbmm(layer.bias, x, layer.w_ih_t)
            z = torch.baddbmm(z, self.h[n], layer.w_hh.transpose(1, 2))
            self.h[n], self.c[n] = _cell(z, self.c[n], hid)
            x = self.h[n]
        # one query per row: multiply-and-sum (K * R one-row bmm s cost several times more)
        scores = (self.keys * x.unsqueeze(2)).sum(-1) + self.bias  # (K, R, S)
        ctx = (scores.softmax(-1).unsqueeze(-1) * self.enc).sum(2)  # (K, R, He)
        assert w.comb_ctx_t is not None and w.comb_h_t is not None
        u = w.combine_act_(torch.baddbmm(torch.bmm(x, w.comb_h_t), ctx, w.comb_ctx_t))
        if drop is not None:
            u = u * drop
        self.feed = u
        return u

    def logits(self, u: torch.Tensor) -> torch.Tensor:
        """The output layer: h~ (K, R, Hd) -> logits (K, R, V)."""
        return torch.baddbmm(self.w.out_b, u, self.w.out_t)

    def reorder(self, index: torch.Tensor) -> None:
        """Row j of member k becomes the old row ``index[k, j]`` (K, R) (beam search)."""
        idx = index.view(self.k, self.r, 1).expand(self.k, self.r, self.hid)
        self.h = [h.gather(1, idx) for h in self.h]
        self.c = [c.gather(1, idx) for c in self.c]
        self.feed = self.feed.gather(1, idx)


def teacher_forced(
    dec: FeedingDecoder, y: torch.Tensor, drop: torch.Tensor | None
) -> torch.Tensor:
    """Teacher forcing: target embeddings y (K, T, B, E) time-major (dropout applied) ->
    every step's h~ (K, T, B, Hd) (after its dropout ``drop`` (K, T, B, Hd), when given)."""
    # unbind, not y_proj[:, t]: each indexing's backward writes a zero (K, T, B, G) tensor,
    # which took two thirds of a K=8 training step; unbind's backward stacks once
    y_steps = dec.project(y).unbind(1)  # T x (K, B, G)
    drops = [None] * len(y_steps) if drop is None else drop.unbind(1)
    return torch.stack([dec.step(y_t, d) for y_t, d in zip(y_steps, drops, strict=True)], 1)


class FeedingStepper:
    """Greedy/beam decoding state (the :mod:`decode` stepper protocol) over a
    :class:`FeedingDecoder` whose rows are N = B * width hypotheses."""

    def __init__(self, dec: FeedingDecoder) -> None:
        self.dec = dec

    def step(self, prev: torch.Tensor) -> torch.Tensor:
        """prev (K, N) tokens -> next-token logits (K, N, V)."""
        d = self.dec
        y = embed_members(d.w.tgt_emb, prev, d.arch.tgt_vocab)  # (K, N, E)
        return d.logits(d.step(d.project(y)))

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor:
        return self.step(prev).argmax(-1)

    def greedy(self, steps: torch.Tensor, t_max: int) -> torch.Tensor:
        return greedy_decode(self, steps, t_max)

    def reorder(self, index: torch.Tensor) -> None:
        self.dec.reorder(index)
