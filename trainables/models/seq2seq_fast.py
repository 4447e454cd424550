"""The fast seq2seq implementation: all K members in one batched computation.

Every matmul is a ``bmm`` over the member dim; embeddings of K members are one lookup
into the ``(K * V, E)`` stacked table with ids offset by ``k * V``. Recurrent activations
are time-major per member, ``(K, T, B, .)``. What makes it fast on a CPU core:

* the input projections of all time steps are one matmul per layer, and the recurrence
  is the hand-written :mod:`seq2seq_cells` LSTM with a manual backward;
* attention scores for all decoder steps are one ``bmm`` (no input feeding), with a
  softmax written for short rows;
* the combine layer, dropout, output projection and cross-entropy run only on the
  token list (the real target positions), not on padding, in cache-sized chunks of
  tokens (:func:`linear_cross_entropy`).

Evaluation (no gradients, no dropout: teacher-forced losses and greedy decoding) has its
own form of the same weights (:func:`_weights` with ``evaluation``): every ``tanh`` is
``2 sigmoid(2x) - 1`` with the weights in front of it doubled (exact), so an LSTM step is
two sigmoids and no ``tanh`` (torch's costs about five sigmoids per element on a CPU
core); layer 0's input projection is a lookup in a per-token table instead of a matmul;
a decoding step attends with :func:`attend_one` instead of K * N one-row ``bmm`` calls, and
takes its argmax with :func:`argmax_last`. On a CPU the cell step, the attention of a
decoding step and the output layer's loss, gradient and argmax are compiled C kernels
(:mod:`ckernels`; :mod:`seq2seq_logits`), and greedy decoding runs every step of a batch
in one C call (:meth:`FastStepper.greedy`), with torch ops where they cannot be used. With
256 examples per batch a K=8 bundle evaluates about 2.4x faster than with the training
form at 1,024 (one CPU thread), before those kernels (1.2x more with them). Its
outputs equal the training form's to ~1e-6 (tested), and bundle members still equal lone
runs, which use the same form.

A bundle member computes what a lone run computes: every member-dependent reduction
runs over that member's own data, padded at the end (attention keys are projected
time-major, the output bias is folded into the output gemm), so bundle and lone run
agree to float rounding of the gemm kernels (bitwise for most tensors at step 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainables.models.base import MemberNoise
from trainables.models.ckernels import ptr, ptr_or_none, usable
from trainables.models.seq2seq_cells import (
    cell_step_eval,
    double_g,
    lstm_sequence,
    lstm_sequence_eval,
    prepare_gates,
)
from trainables.models.seq2seq_decode import decode, greedy_decode
from trainables.models.seq2seq_layout import (
    IGNORE,
    Arch,
    Engine,
    Seq2SeqBatch,
    dropout_masks,
    scatter_rows,
)
from trainables.models.seq2seq_logits import argmax_last, linear_cross_entropy
from trainables.tasks.base import BOS


@dataclass
class _Layer:
    """One LSTM layer (one direction) in the cell's gate layout (see :mod:`seq2seq_cells`)."""

    w_ih_t: torch.Tensor  # (K, in, 4H)
    bias: torch.Tensor  # (K, 1, 4H) = b_ih + b_hh
    w_hh: torch.Tensor  # (K, 4H, H)


@dataclass
class _Weights:
    """The stacked parameters rearranged for computation (autograd flows through)."""

    src_emb: torch.Tensor  # (K * Vs, E)
    tgt_emb: torch.Tensor  # (K * Vt, E)
    encoder: list[list[_Layer]]  # [layer][direction]
    decoder: list[_Layer]
    attn_t: torch.Tensor | None  # (K, He, Hd)
    comb_ctx_t: torch.Tensor | None  # (K, He, Hd)
    comb_h_t: torch.Tensor | None  # (K, Hd, Hd)
    out_t: torch.Tensor  # (K, Hd, V)
    out_b: torch.Tensor  # (K, 1, V)
    evaluation: bool = False
    """Evaluation form: every tanh is computed as ``2 sigmoid(2x) - 1``, so the LSTM g
    blocks and the combine layer are stored doubled (exact), and layer 0's input
    projections are looked up per token in the tables below."""
    src_table: list[torch.Tensor] | None = None
    """Evaluation: per encoder direction, ``emb W_ih^T + b`` of every source token (K * Vs, 4H)."""
    tgt_table: torch.Tensor | None = None
    """Evaluation: the same for decoder layer 0 over target tokens (K * Vt, 4Hd)."""

    def lstm(
        self,
        inputs: torch.Tensor,
        layer: _Layer,
        h0: torch.Tensor,
        c0: torch.Tensor,
        active: tuple[int, ...] = (),
        looked_up: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer over all steps: inputs (K, T, B, in) -> hs, cs (K, T, B, H); with
        ``looked_up`` (evaluation) the inputs are already the input projections, biases
        included (K, T, B, 4H), from a table. In training, step t computes only the first
        ``active[t]`` rows (all where empty), and the layer projects its inputs itself."""
        if self.evaluation:
            xp = inputs if looked_up else _project(inputs, layer)
            return lstm_sequence_eval(xp, layer.w_hh, h0, c0)
        assert not looked_up, "training has no projection tables"
        w_ih = layer.w_ih_t.transpose(1, 2)  # (K, 4H, in)
        return lstm_sequence(inputs, w_ih, layer.w_hh, h0, c0, active, layer.bias)

    def tanh_(self, x: torch.Tensor) -> torch.Tensor:
        """tanh of a pre-activation made with the combine weights (doubled in evaluation)."""
        return torch.sigmoid(x, out=x).mul_(2.0).sub_(1.0) if self.evaluation else x.tanh()


def _layer(
    p: Mapping[str, torch.Tensor], prefix: str, suffix: str, hidden: int, doubled: bool
) -> _Layer:
    w_ih = prepare_gates(p[f"{prefix}_weight_ih_{suffix}"], hidden)
    w_hh = prepare_gates(p[f"{prefix}_weight_hh_{suffix}"], hidden)
    bias = prepare_gates(p[f"{prefix}_bias_ih_{suffix}"] + p[f"{prefix}_bias_hh_{suffix}"], hidden)
    if doubled:
        w_ih, w_hh, bias = double_g(w_ih, hidden, 1), double_g(w_hh, hidden, 1), double_g(bias, hidden)
    return _Layer(w_ih.transpose(1, 2), bias.unsqueeze(1), w_hh)


def _table(emb: torch.Tensor, layer: _Layer) -> torch.Tensor:
    """Input projection of every token: emb (K, V, E) -> (K * V, 4H) (incl. both biases)."""
    return torch.baddbmm(layer.bias, emb, layer.w_ih_t).flatten(0, 1)


def _weights(arch: Arch, p: Mapping[str, torch.Tensor], evaluation: bool = False) -> _Weights:
    dirs = ["", "_reverse"][: arch.directions]
    layers = range(arch.layers)
    ev = evaluation
    encoder = [[_layer(p, "encoder", f"l{n}{d}", arch.hidden, ev) for d in dirs] for n in layers]
    decoder = [_layer(p, "decoder", f"l{n}", arch.dec_hidden, ev) for n in layers]
    attn_t = comb_ctx_t = comb_h_t = None
    if arch.attention:
        attn_t = p["attn_weight"].transpose(1, 2)
        comb = p["combine_weight"] * 2.0 if ev else p["combine_weight"]  # (K, Hd, He + Hd)
        comb_ctx_t = comb[:, :, : arch.enc_out].transpose(1, 2)
        comb_h_t = comb[:, :, arch.enc_out :].transpose(1, 2)
    return _Weights(
        src_emb=p["src_emb_weight"].flatten(0, 1),
        tgt_emb=p["tgt_emb_weight"].flatten(0, 1),
        encoder=encoder,
        decoder=decoder,
        attn_t=attn_t,
        comb_ctx_t=comb_ctx_t,
        comb_h_t=comb_h_t,
        out_t=p["out_weight"].transpose(1, 2),
        out_b=p["out_bias"].unsqueeze(1),
        evaluation=ev,
        src_table=[_table(p["src_emb_weight"], cell) for cell in encoder[0]] if ev else None,
        tgt_table=_table(p["tgt_emb_weight"], decoder[0]) if ev else None,
    )


def _embed(table: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per-member lookup: ids (K, ...) into the (K * V, E) stacked table -> (K, ..., E)."""
    k = ids.shape[0]
    offsets = torch.arange(k, device=ids.device).mul_(vocab).view(k, *[1] * (ids.dim() - 1))
    return F.embedding(ids + offsets, table)


def _project(x: torch.Tensor, layer: _Layer) -> torch.Tensor:
    """Evaluation's input projections of all steps in one matmul, biases included: x (K, T,
    B, in) -> (K, T, B, 4H). (Training projects inside the layer, :func:`lstm_sequence`.)"""
    k, t, b, e = x.shape
    return torch.baddbmm(layer.bias, x.reshape(k, t * b, e), layer.w_ih_t).view(k, t, b, -1)


def _time_gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (K, T, B, F), index (K, T', B) -> x[k, index[k, t, b], b] (K, T', B, F)."""
    return torch.gather(x, 1, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))


class FastEngine(Engine):
    """Batched bundle computation over stacked parameters (see the module docstring)."""

    # ------------------------------------------------------------------ encoder
    def encode(
        self, w: _Weights, batch: Seq2SeqBatch, noise: MemberNoise | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """Encoder outputs (K, B, S, He), attention keys ``W_a h_enc`` (K, B, S, Hd) (None
        without attention) and per layer the final h, c (K, B, Hd)."""
        a = self.arch
        k, b, s = batch.src.shape
        ids = batch.src.transpose(1, 2)  # (K, S, B)
        rev = batch.src_rev.transpose(1, 2)  # (K, S, B): reverses each source in its length
        x: torch.Tensor | None = None  # layer input (K, S, B, in); None: look up layer 0's
        if w.src_table is None:
            x = _embed(w.src_emb, ids, a.src_vocab)  # (K, S, B, E)
            mask = dropout_masks(noise, a.dropout, batch.src_counts, a.emb)
            if mask is not None:
                x = x * scatter_rows(mask, batch.src_tm_pos, (k, s, b, a.emb))
        last = (batch.src_len - 1).view(k, 1, b, 1).expand(k, 1, b, a.hidden)
        zeros = batch.src_len.new_zeros(k, b, a.hidden, dtype=w.out_t.dtype)
        h_fin: list[torch.Tensor] = []
        c_fin: list[torch.Tensor] = []
        for layer in w.encoder:
            outs, finals = [], []
            for d, cell in enumerate(layer):  # d = 1: the reverse direction
                if x is None:  # evaluation: layer 0's input projections looked up
                    assert w.src_table is not None
                    inp = _embed(w.src_table[d], ids if d == 0 else ids.gather(1, rev), a.src_vocab)
                else:
                    inp = x if d == 0 else _time_gather(x, rev)
                # (K, S, B, H); a looked-up input is already projected
                hs, cs = w.lstm(inp, cell, zeros, zeros, batch.src_active, x is None)
                finals.append((hs.gather(1, last).squeeze(1), cs.gather(1, last).squeeze(1)))
                outs.append(hs if d == 0 else _time_gather(hs, rev))
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
        evaluation = noise is None and not torch.is_grad_enabled()
        w = _weights(self.arch, params, evaluation=evaluation)
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
        w = _weights(self.arch, params, evaluation=True)
        encoded = self.encode(w, batch, None)
        stepper = FastStepper(self.arch, w, *encoded, batch.src_mask, width)
        steps = torch.from_numpy(batch.decode_steps)
        if stepper.in_c():
            tokens, ce, hit = stepper.decode_in_c(steps, batch)
            assert ce is not None
            return ce, hit if hits else None, tokens
        ce, hit = self._token_outputs(w, batch, None, hits, encoded)
        return ce, hit, decode(stepper, steps.to(batch.src.device), width)

    def _token_outputs(
        self,
        w: _Weights,
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
            y = _embed(w.tgt_table, ids, a.tgt_vocab)  # (K, T, B, 4Hd)
        else:
            y = _embed(w.tgt_emb, ids, a.tgt_vocab)  # (K, T, B, E)
            mask = dropout_masks(noise, a.dropout, batch.tgt_counts, a.emb)
            if mask is not None:
                y = y * scatter_rows(mask, batch.tgt_tm_pos, (k, t, b, a.emb))
        y = self.decoder(w, y, h_fin, c_fin, batch.tgt_active)  # (K, T, B, Hd)
        hd = a.dec_hidden
        q = y.transpose(1, 2).contiguous()  # (K, B, T, Hd)
        pos = batch.tok_pos.view(-1)
        n = batch.tok_pos.shape[1]
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
            ctx = torch.bmm(self.softmax(scores), enc.view(k * b, s, he))  # (K*B, T, He)
            ctx_tok = ctx.view(k * b * t, he).index_select(0, pos).view(k, n, he)
            u = w.tanh_(torch.baddbmm(torch.bmm(q_tok, w.comb_h_t), ctx_tok, w.comb_ctx_t))
        else:
            u = q_tok
        mask = dropout_masks(noise, a.dropout, batch.tgt_counts, hd)
        if mask is not None:
            u = u * scatter_rows(mask, batch.tok_list_pos, (k, n, hd))
        # the bias as a weight row over a constant-1 feature: its gradient is then a gemm
        # reduction (trailing token-list padding adds exact zeros) instead of a cascade sum
        # whose grouping depends on the padded length
        u1 = torch.cat([u, u.new_ones(k, n, 1)], -1)
        return linear_cross_entropy(u1, torch.cat([w.out_t, w.out_b], 1), batch.tok_target, IGNORE, hits)

    def decoder(
        self,
        w: _Weights,
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

    @staticmethod
    def softmax(scores: torch.Tensor) -> torch.Tensor:
        """Softmax over the last dim. Rows are short (source positions), where torch's fused
        softmax pays per row; these four whole-tensor ops took half its time."""
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def start_decode(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, width: int
    ) -> FastStepper:
        w = _weights(self.arch, params, evaluation=True)
        return FastStepper(self.arch, w, *self.encode(w, batch, None), batch.src_mask, width)


def attend_one(
    keys_t: torch.Tensor, q: torch.Tensor, bias: torch.Tensor, enc: torch.Tensor
) -> torch.Tensor:
    """Attention of one query per row: keys_t (R, D, Sp) (each row's keys transposed), q
    (..., D) with R rows, bias (R, Sp) (-inf where masked), enc (R, S, E) -> context (R, E);
    keys and bias may be padded past the S source positions (Sp >= S), which are ignored.
    One call of the C kernel on a CPU (``kernels/attention.c``), else a multiply-and-sum (a
    ``bmm`` of R one-row matrices costs 3-4x more)."""
    r, d, sp = keys_t.shape
    s, e = enc.shape[1:]
    kern = usable(q)
    if kern is not None:
        keys_t, q, bias, enc = (x.contiguous() for x in (keys_t, q, bias, enc))
        ctx = q.new_empty(r, e)
        kern.attend_one(r, s, sp, d, e, ptr(keys_t), ptr(q), ptr(bias), ptr(enc), ptr(ctx))
        return ctx
    scores = (keys_t[..., :s] * q.reshape(r, d, 1)).sum(1).add_(bias[:, :s])  # (R, S)
    return (enc * FastEngine.softmax(scores).unsqueeze(-1)).sum(1)


class FastStepper:
    """Greedy/beam decoding state of a bundle: N = B * width hypotheses per member.

    Uses the evaluation weights (:class:`_Weights`, ``evaluation``): the cell state is kept
    doubled (:func:`cell_step_eval`), layer 0's input projection is a table lookup, and
    the attention of one query per hypothesis is :func:`attend_one` (keys kept transposed and
    padded to whole 16-lane vectors of source positions, ``(K * N, Hd, Sp)``).
    """

    def __init__(
        self,
        arch: Arch,
        w: _Weights,
        enc: torch.Tensor,
        keys: torch.Tensor | None,
        h_fin: list[torch.Tensor],
        c_fin: list[torch.Tensor],
        src_mask: torch.Tensor,
        width: int,
    ) -> None:
        assert w.evaluation and w.tgt_table is not None
        k, b, s, he = enc.shape
        self.arch, self.w, self.k, self.n, self.width = arch, w, k, b * width, width
        self.h = torch.stack(h_fin).repeat_interleave(width, 2)  # (L, K, N, Hd)
        self.c2 = torch.stack(c_fin).repeat_interleave(width, 2).mul_(2.0)  # doubled cells
        self.enc = enc.repeat_interleave(width, 1).view(k * self.n, s, he)  # (K * N, S, He)
        sp = -(-s // 16) * 16  # keys and bias padded to whole 16-lane vectors (attend_one)
        self.keys_t = None
        if keys is not None:  # (K, B, S, Hd) -> (K * N, Hd, Sp)
            keys_t = F.pad(keys.transpose(2, 3), (0, sp - s)).repeat_interleave(width, 1)
            self.keys_t = keys_t.reshape(k * self.n, -1, sp).contiguous()
        bias = torch.zeros(k, b, sp, dtype=enc.dtype, device=enc.device)
        bias[:, :, :s].masked_fill_(~src_mask, float("-inf"))
        bias[:, :, s:] = float("-inf")
        self.bias = bias.repeat_interleave(width, 1).view(k * self.n, sp)
        g4 = 4 * arch.dec_hidden
        self._z, self._s = enc.new_empty(k, self.n, g4), enc.new_empty(k, self.n, g4)
        self._tc = enc.new_empty(k, self.n, arch.dec_hidden)

    def step(self, prev: torch.Tensor) -> torch.Tensor:
        """prev (K, N) tokens -> next-token logits (K, N, V)."""
        a, w = self.arch, self.w
        assert w.tgt_table is not None
        h_new, c2_new = torch.empty_like(self.h), torch.empty_like(self.c2)
        x = prev  # layer 0 looks its input projection up by token
        for n, layer in enumerate(w.decoder):
            if n == 0:
                z = _embed(w.tgt_table, prev, a.tgt_vocab)  # (K, N, 4Hd)
            else:
                z = torch.baddbmm(layer.bias, x, layer.w_ih_t, out=self._z)
            z = z.baddbmm_(self.h[n], layer.w_hh.transpose(1, 2))
            cell_step_eval(z, self.c2[n], self._s, c2_new[n], self._tc, h_new[n])
            x = h_new[n]
        self.h, self.c2 = h_new, c2_new
        if self.keys_t is not None:
            assert w.comb_ctx_t is not None and w.comb_h_t is not None
            ctx = attend_one(self.keys_t, x, self.bias, self.enc).view(self.k, self.n, -1)
            x = w.tanh_(torch.baddbmm(torch.bmm(x, w.comb_h_t), ctx, w.comb_ctx_t))
        return torch.baddbmm(w.out_b, x, w.out_t)

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor:
        """Greedy step: prev (K, N) -> argmax tokens (K, N)."""
        return argmax_last(self.step(prev))

    def greedy(self, steps: torch.Tensor) -> torch.Tensor:
        """:func:`greedy_decode` (K, B, max steps); on a CPU every step in one call of the C
        decoder (:meth:`decode_in_c`), which computes the same to float rounding."""
        if not self.in_c():
            return greedy_decode(self, steps)
        return self.decode_in_c(steps)[0]

    def in_c(self) -> bool:
        """Whether :meth:`decode_in_c` can run: the C kernels on this device, width 1."""
        return self.width == 1 and usable(self.enc, self.arch.dec_hidden) is not None

    def decode_in_c(
        self, steps: torch.Tensor, gold: Seq2SeqBatch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Greedy tokens (K, B, max steps) and, given ``gold`` (the batch this stepper
        encoded), the teacher-forced cross-entropy (K, N) and argmax hits (K, N) bool of its
        token list, from one call of the C decoder (``kernels/decode.c``): greedy decoding
        goes on from the teacher-forced pass where a row's argmax leaves its gold tokens.
        Needs :meth:`in_c`. The stepper's states are left as they were."""
        a, w = self.arch, self.w
        kern = usable(self.enc, a.dec_hidden)
        assert kern is not None and self.width == 1 and w.tgt_table is not None
        k, n, hd = self.k, self.n, a.dec_hidden
        t_max = int(steps.max()) if steps.numel() else 0
        tokens = torch.zeros(k, n, max(t_max, 1), dtype=torch.int64)
        v = w.out_t.shape[-1]
        vp = -(-v // 16) * 16  # whole 16-lane vectors: the padding columns are 0, never read
        out_t = w.out_t.new_zeros(k, hd, vp)
        out_t[:, :, :v] = w.out_t
        out_b = w.out_b.new_zeros(k, vp)
        out_b[:, :v] = w.out_b[:, 0]
        layers = w.decoder
        w_hh_t = torch.stack([layer.w_hh.transpose(1, 2) for layer in layers]).contiguous()
        upper = layers[1:]
        w_ih_t = torch.stack([layer.w_ih_t for layer in upper]).contiguous() if upper else None
        bias = torch.stack([layer.bias[:, 0] for layer in upper]).contiguous() if upper else None
        h, c2 = self.h.contiguous(), self.c2.contiguous()  # (L, K, N, Hd)
        keys_t = mask = enc = comb_ctx_t = comb_h_t = None
        s = sp = he = 0
        if self.keys_t is not None:
            assert w.comb_ctx_t is not None and w.comb_h_t is not None
            keys_t, mask, enc = self.keys_t, self.bias.contiguous(), self.enc.contiguous()
            comb_ctx_t, comb_h_t = w.comb_ctx_t.contiguous(), w.comb_h_t.contiguous()
            s, sp, he = enc.shape[1], keys_t.shape[2], enc.shape[2]
        tg = 0
        glen = gold_in = gold_out = ce = hit = None
        if gold is not None:
            tg = gold.tgt_in.shape[2]
            glen = gold.tgt_mask.sum(2, dtype=torch.int32)  # (K, B): n + 1 positions
            gold_in, gold_out = gold.tgt_in.contiguous(), gold.tgt_out.contiguous()
            ce = w.out_t.new_zeros(k, n, tg)
            hit = torch.zeros(k, n, tg, dtype=torch.bool)
        steps32 = steps.to(torch.int32).contiguous()
        failed = kern.decode(
            k, n, len(layers), hd, he, s, sp, v, vp, a.tgt_vocab, tokens.shape[2], tg, BOS,
            ptr(steps32), ptr_or_none(glen), ptr_or_none(gold_in), ptr_or_none(gold_out),
            ptr(w.tgt_table), ptr_or_none(w_ih_t), ptr_or_none(bias), ptr(w_hh_t), ptr(h),
            ptr(c2), ptr_or_none(keys_t), ptr_or_none(mask), ptr_or_none(enc),
            ptr_or_none(comb_ctx_t), ptr_or_none(comb_h_t), ptr(out_t), ptr(out_b),
            ptr_or_none(ce), ptr_or_none(hit), ptr(tokens),
        )
        if failed:
            raise MemoryError("the C decoder could not allocate its buffers")
        tokens = tokens[:, :, :t_max]
        if gold is None:
            return tokens, None, None
        assert ce is not None and hit is not None
        real = gold.tok_target != IGNORE  # (K, N): token-list padding is no token
        pos = gold.tok_pos.view(-1)
        ce_tok = ce.view(-1).index_select(0, pos).view_as(real).masked_fill_(~real, 0.0)
        hit_tok = hit.view(-1).index_select(0, pos).view_as(real) & real
        return tokens, ce_tok, hit_tok

    def reorder(self, index: torch.Tensor) -> None:
        """Hypothesis j of member k becomes the old hypothesis ``index[k, j]`` (K, N)."""
        idx = index.view(1, self.k, self.n, 1).expand_as(self.h)
        self.h = self.h.gather(2, idx)
        self.c2 = self.c2.gather(2, idx)
