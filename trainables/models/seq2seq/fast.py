"""The fast seq2seq implementation: all K members in one batched computation.

Every matmul is a ``bmm`` over the member dim; embeddings of K members are one lookup
into the ``(K * V, E)`` stacked table with ids offset by ``k * V``. Recurrent activations
are time-major per member, ``(K, T, B, .)``. What makes it fast on a CPU core:

* the input projections of all time steps are one matmul per layer, and the recurrence
  is the hand-written :mod:`cells` LSTM with a manual backward;
* attention scores for all decoder steps are one ``bmm`` (no input feeding), with a
  softmax written for short rows;
* the combine layer, dropout, output projection and cross-entropy run only on the
  token list (the real target positions), not on padding; on a CPU the output layer's
  logits, loss and gradients are one C call each way, a cache-sized block of tokens at a
  time (:func:`linear_cross_entropy`).

Evaluation (no gradients, no dropout: teacher-forced losses and greedy decoding) has its
own form of the same weights (:func:`weights.build_weights` with ``evaluation``):
every ``tanh`` is ``2 sigmoid(2x) - 1`` with the weights in front of it doubled (exact), so
an LSTM step is two sigmoids and no ``tanh`` (torch's costs about five sigmoids per element
on a CPU core); layer 0's input projection is a lookup in a per-token table instead of a
matmul; a decoding step (:mod:`stepper`) attends with :func:`attend_one` instead of
K * N one-row ``bmm`` calls, and takes its argmax with :func:`argmax_last`. On a CPU the
cell step, the attention of a decoding step and the output layer's loss, gradient and
argmax are compiled C kernels (:mod:`ckernels`; :mod:`logits`), and the
teacher-forced pass and greedy decoding of a batch are one C call
(:meth:`FastStepper.decode_in_c`), with torch ops where they cannot be used. With 256
examples per batch a K=8 bundle evaluates about 2.4x faster than with the training form at
1,024 (one CPU thread), before those kernels (1.2x more with them). Its outputs equal the
training form's to ~1e-6 (tested), and bundle members still equal lone runs, which use the
same form.

A bundle member computes what a lone run computes: every member-dependent reduction
runs over that member's own data, padded at the end (attention keys are projected
time-major, the output bias is folded into the output gemm), so bundle and lone run
agree to float rounding of the gemm kernels (bitwise for most tensors at step 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainables.models.base import MemberNoise
from trainables.models.ckernels import CpuKernels
from trainables.models.seq2seq.decode import decode
from trainables.models.seq2seq.feeding import FeedingDecoder, FeedingStepper, teacher_forced
from trainables.models.seq2seq.layout import (
    IGNORE,
    Arch,
    Engine,
    Seq2SeqBatch,
    time_major_multipliers,
    token_multipliers,
)
from trainables.models.seq2seq.logits import linear_cross_entropy
from trainables.models.seq2seq.stepper import FastStepper, short_softmax
from trainables.models.seq2seq.weights import (
    Weights,
    build_weights,
    embed_members,
    time_gather,
)


class FastEngine(Engine):
    """Batched bundle computation over stacked parameters (see the module docstring). With
    input feeding the decoder is :mod:`feeding`'s, one step at a time, on the training form
    of the weights also in evaluation. ``kern``: the compiled CPU kernels every computation
    uses (the model's choice; None: torch ops)."""

    def __init__(self, arch: Arch, kern: CpuKernels | None) -> None:
        super().__init__(arch)
        self.kern = kern

    # ------------------------------------------------------------------ encoder
    def encode(
        self, w: Weights, batch: Seq2SeqBatch, noise: MemberNoise | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """Encoder outputs (K, B, S, He), attention keys ``W_a h_enc`` (K, B, S, Hd) (None
        without attention) and per layer the final h, c (K, B, Hd)."""
        a = self.arch
        k, b, s = batch.src.shape
        ids = batch.src.transpose(1, 2)  # (K, S, B)
        rev = batch.src_rev.transpose(1, 2)  # (K, S, B): reverses each source in its length
        x: torch.Tensor | None = None  # layer input (K, S, B, in); None: look up layer 0's
        if w.src_table is None:
            x = embed_members(w.src_emb, ids, a.src_vocab)  # (K, S, B, E)
            mult = time_major_multipliers(
                noise, a.dropout, batch.src_mask, batch.src_counts, batch.src_tm_pos, a.emb
            ) if a.embedding_dropout else None
            if mult is not None:
                x = x * mult
        last = (batch.src_len - 1).view(k, 1, b, 1).expand(k, 1, b, a.hidden)
        zeros = batch.src_len.new_zeros(k, b, a.hidden, dtype=w.out_t.dtype)
        h_fin: list[torch.Tensor] = []
        c_fin: list[torch.Tensor] = []
        for layer in w.encoder:
            outs, finals = [], []
            for d, cell in enumerate(layer):  # d = 1: the reverse direction
                if x is None:  # evaluation: layer 0's input projections looked up
                    assert w.src_table is not None
                    inp = embed_members(w.src_table[d], ids if d == 0 else ids.gather(1, rev), a.src_vocab)
                else:
                    inp = x if d == 0 else time_gather(x, rev)
                # (K, S, B, H); a looked-up input is already projected
                hs, cs = w.lstm(inp, cell, zeros, zeros, batch.src_active, x is None)
                finals.append((hs.gather(1, last).squeeze(1), cs.gather(1, last).squeeze(1)))
                outs.append(hs if d == 0 else time_gather(hs, rev))
            x = torch.cat(outs, -1) if len(outs) > 1 else outs[0]
            h_fin.append(torch.cat([f[0] for f in finals], -1))
            c_fin.append(torch.cat([f[1] for f in finals], -1))
        assert x is not None
        keys = None
        if w.attn_t is not None:
            # time-major, so a member's padding is trailing in dW_a's reduction over (S, B):
            # its gradient is then bitwise the same in a bundle and in a lone run
            keys = (
                torch.bmm(x.reshape(k, s * b, a.enc_out), w.attn_t)
                .view(k, s, b, -1)
                .transpose(1, 2)
            )
            keys = keys.contiguous()
        return x.transpose(1, 2).contiguous(), keys, h_fin, c_fin

    # ------------------------------------------------------------------ training loss
    def token_outputs(
        self,
        params: Mapping[str, torch.Tensor],
        batch: Seq2SeqBatch,
        noise: MemberNoise | None,
        hits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-entropy of every listed target token (K, N), 0 at token-list padding; with
        ``hits`` also whether each token is the argmax of its logits (K, N) bool."""
        evaluation = noise is None and not torch.is_grad_enabled() and not self.arch.input_feeding
        w = build_weights(self.arch, params, evaluation=evaluation, kern=self.kern)
        encoded = self.encode(w, batch, noise)
        if evaluation:
            stepper = FastStepper(self.arch, w, *encoded, batch.src_mask, 1)
            if stepper.in_c():  # the teacher-forced pass of the C decoder, no greedy steps
                _, ce, hit = stepper.decode_in_c(torch.zeros_like(batch.src_len), batch)
                assert ce is not None
                return ce, hit if hits else None
        return self._token_outputs(w, batch, noise, hits, encoded)

    @torch.no_grad()
    def evaluate(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, hits: bool, width: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Teacher-forced losses (and hits) and decoded tokens from ONE encoding of the batch;
        on a CPU with greedy decoding both from one call of the C decoder, which decodes a
        row greedily only from where its argmax leaves its gold tokens
        (:meth:`FastStepper.decode_in_c`)."""
        if self.arch.input_feeding:
            w = build_weights(self.arch, params, kern=self.kern)
            encoded = self.encode(w, batch, None)
            ce_f, hit_f = self._token_outputs(w, batch, None, hits, encoded)
            feeding = self._feeding_stepper(w, encoded, batch, width)
            return ce_f, hit_f, decode(feeding, batch.steps(), width, batch.max_steps)
        w = build_weights(self.arch, params, evaluation=True, kern=self.kern)
        encoded = self.encode(w, batch, None)
        stepper = FastStepper(self.arch, w, *encoded, batch.src_mask, width)
        steps = batch.steps()
        if stepper.in_c():
            tokens, ce, hit = stepper.decode_in_c(steps, batch)
            assert ce is not None
            return ce, hit if hits else None, tokens
        ce, hit = self._token_outputs(w, batch, None, hits, encoded)
        return ce, hit, decode(stepper, steps, width, batch.max_steps)

    def _token_outputs(
        self,
        w: Weights,
        batch: Seq2SeqBatch,
        noise: MemberNoise | None,
        hits: bool,
        encoded: tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`token_outputs` given the weights and :meth:`encode`'s outputs."""
        a = self.arch
        enc, keys, h_fin, c_fin = encoded  # (K, B, S, He)
        k, b, t = batch.tgt_in.shape
        s = enc.shape[2]
        ids = batch.tgt_in.transpose(1, 2)  # (K, T, B)
        if w.tgt_table is not None:  # evaluation: layer 0's input projections looked up
            y = embed_members(w.tgt_table, ids, a.tgt_vocab)  # (K, T, B, 4Hd)
        else:
            y = embed_members(w.tgt_emb, ids, a.tgt_vocab)  # (K, T, B, E)
            mult = time_major_multipliers(
                noise, a.dropout, batch.tgt_mask, batch.tgt_counts, batch.tgt_tm_pos, a.tgt_emb_size
            ) if a.embedding_dropout else None
            if mult is not None:
                y = y * mult
        hd = a.dec_hidden
        pos = batch.tok_pos.view(-1)
        n = batch.tok_pos.shape[1]
        if a.input_feeding:  # the decoder attends step by step; h~ comes out dropped out
            assert keys is not None
            drop = time_major_multipliers(noise, a.dropout, batch.tgt_mask, batch.tgt_counts, batch.tgt_tm_pos, hd)
            dec = FeedingDecoder(a, w, enc, keys, h_fin, c_fin, batch.src_mask)
            u = teacher_forced(dec, y, drop).transpose(1, 2).reshape(k * b * t, hd)  # (K*B*T, Hd)
            u = u.index_select(0, pos).view(k, n, hd)
            return linear_cross_entropy(u, w.out_t, w.out_b, batch.tok_target, IGNORE, hits, w.kern)
        y = self.decoder(w, y, h_fin, c_fin, batch.tgt_active)  # (K, T, B, Hd)
        q = y.transpose(1, 2).contiguous()  # (K, B, T, Hd)
        q_tok = q.view(k * b * t, hd).index_select(0, pos).view(k, n, hd)
        if keys is not None:
            assert w.comb_ctx_t is not None and w.comb_h_t is not None
            he = a.enc_out
            bias = torch.zeros(batch.src_mask.shape, dtype=q.dtype, device=q.device)
            bias.masked_fill_(~batch.src_mask, float("-inf"))
            scores = torch.baddbmm(
                bias.view(k * b, 1, s),
                q.view(k * b, t, hd),
                keys.view(k * b, s, hd).transpose(1, 2),
            )
            ctx = torch.bmm(short_softmax(scores), enc.view(k * b, s, he))  # (K*B, T, He)
            ctx_tok = ctx.view(k * b * t, he).index_select(0, pos).view(k, n, he)
            u = w.combine_act_(torch.baddbmm(torch.bmm(q_tok, w.comb_h_t), ctx_tok, w.comb_ctx_t))
        else:
            u = q_tok
        mult = token_multipliers(noise, a.dropout, batch, hd)
        if mult is not None:
            u = u * mult
        return linear_cross_entropy(u, w.out_t, w.out_b, batch.tok_target, IGNORE, hits, w.kern)

    def decoder(
        self,
        w: Weights,
        y: torch.Tensor,
        h_fin: list[torch.Tensor],
        c_fin: list[torch.Tensor],
        active: tuple[int, ...] = (),
    ) -> torch.Tensor:
        """Teacher-forced decoder LSTM layers: y (K, T, B, E) -> top-layer states (K, T, B, Hd)
        (in evaluation y is layer 0's input projections (K, T, B, 4Hd), from the table).

        Always the hand-written cell, also for K = 1: torch's native kernel (oneDNN) is
        about 1.9x faster on one member, but a lone run must compute exactly what a bundle
        member computes, and mixing kernels let float rounding grow past 1e-5 within 200
        training steps of the paper config (the contract test).
        """
        for n, (layer, h0, c0) in enumerate(zip(w.decoder, h_fin, c_fin, strict=True)):
            y, _ = w.lstm(y, layer, h0, c0, active, n == 0 and w.tgt_table is not None)
        return y

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def start_decode(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, width: int
    ) -> FastStepper | FeedingStepper:
        if self.arch.input_feeding:
            w = build_weights(self.arch, params, kern=self.kern)
            return self._feeding_stepper(w, self.encode(w, batch, None), batch, width)
        w = build_weights(self.arch, params, evaluation=True, kern=self.kern)
        return FastStepper(self.arch, w, *self.encode(w, batch, None), batch.src_mask, width)

    def _feeding_stepper(
        self,
        w: Weights,
        encoded: tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]],
        batch: Seq2SeqBatch,
        width: int,
    ) -> FeedingStepper:
        """The input-feeding decoder of :meth:`encode`'s outputs, each example's rows
        repeated ``width`` times (N = B * width hypotheses)."""
        enc, keys, h_fin, c_fin = encoded
        assert keys is not None

        def rep(x: torch.Tensor) -> torch.Tensor:
            return x.repeat_interleave(width, 1)

        dec = FeedingDecoder(
            self.arch, w, rep(enc), rep(keys), [rep(h) for h in h_fin], [rep(c) for c in c_fin],
            rep(batch.src_mask),
        )
        return FeedingStepper(dec)
