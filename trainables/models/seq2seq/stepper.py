"""Decoding with the fast seq2seq implementation: a stepper over a bundle's decoder state.

:class:`FastStepper` holds K members x N hypotheses in the evaluation form of the weights
(:mod:`weights`) and steps them for greedy or beam decoding
(:mod:`decode`); on a CPU :meth:`FastStepper.decode_in_c` runs the teacher-forced
pass and greedy decoding of a whole batch in one call of the C decoder
(``kernels/decode.c``). :func:`attend_one` is a decoding step's attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainables.data import BOS
from trainables.models.ckernels import KernelChoice, applicable, padded_output_layer, whole_vectors
from trainables.models.seq2seq.cells import cell_step_eval
from trainables.models.seq2seq.decode import greedy_decode
from trainables.models.seq2seq.layout import IGNORE, Arch, Seq2SeqBatch
from trainables.models.seq2seq.logits import argmax_last
from trainables.models.seq2seq.weights import Weights, embed_members


def short_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim. Rows are short (source positions), where torch's fused
    softmax pays per row; these four whole-tensor ops took half its time."""
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def attend_one(
    keys_t: torch.Tensor,
    q: torch.Tensor,
    bias: torch.Tensor,
    enc: torch.Tensor,
    kern: KernelChoice = "default",
) -> torch.Tensor:
    """Attention of one query per row: keys_t (R, D, Sp) (each row's keys transposed), q
    (..., D) with R rows, bias (R, Sp) (-inf where masked), enc (R, S, E) -> context (R, E);
    keys and bias may be padded past the S source positions (Sp >= S), which are ignored.
    With the kernels (``kern``, as :func:`~trainables.models.seq2seq.logits.linear_cross_entropy`'s)
    one call of the C kernel on a CPU (``kernels/attention.c``), else a multiply-and-sum (a
    ``bmm`` of R one-row matrices costs 3-4x more)."""
    r, d, _ = keys_t.shape
    s, e = enc.shape[1:]
    fused = applicable(kern, q)
    if fused is not None:
        keys_t, bias, enc = (x.contiguous() for x in (keys_t, bias, enc))
        ctx = q.new_empty(r, e)
        fused.attend_one(keys_t, q.reshape(r, d).contiguous(), bias, enc, ctx)
        return ctx
    scores = (keys_t[..., :s] * q.reshape(r, d, 1)).sum(1).add_(bias[:, :s])  # (R, S)
    return (enc * short_softmax(scores).unsqueeze(-1)).sum(1)


class FastStepper:
    """Greedy/beam decoding state of a bundle: N = B * width hypotheses per member.

    Uses the evaluation weights (:class:`Weights`, ``evaluation``): the cell state is kept
    doubled (:func:`cell_step_eval`), layer 0's input projection is a table lookup, and
    the attention of one query per hypothesis is :func:`attend_one` (keys kept transposed and
    padded to whole 16-lane vectors of source positions, ``(K * N, Hd, Sp)``). Its kernels
    are the weights' (``w.kern``: the model's choice).
    """

    def __init__(
        self,
        arch: Arch,
        w: Weights,
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
        self.kern = w.kern
        self.h = torch.stack(h_fin).repeat_interleave(width, 2)  # (L, K, N, Hd)
        self.c2 = torch.stack(c_fin).repeat_interleave(width, 2).mul_(2.0)  # doubled cells
        self.enc = enc.repeat_interleave(width, 1).view(k * self.n, s, he)  # (K * N, S, He)
        sp = whole_vectors(s)  # keys and bias padded to whole vectors (attend_one)
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
                z = embed_members(w.tgt_table, prev, a.tgt_vocab)  # (K, N, 4Hd)
            else:
                z = torch.baddbmm(layer.bias, x, layer.w_ih_t, out=self._z)
            z = z.baddbmm_(self.h[n], layer.w_hh.transpose(1, 2))
            cell_step_eval(z, self.c2[n], self._s, c2_new[n], self._tc, h_new[n], self.kern)
            x = h_new[n]
        self.h, self.c2 = h_new, c2_new
        if self.keys_t is not None:
            assert w.comb_ctx_t is not None and w.comb_h_t is not None
            ctx = attend_one(self.keys_t, x, self.bias, self.enc, self.kern).view(self.k, self.n, -1)
            x = w.combine_act_(torch.baddbmm(torch.bmm(x, w.comb_h_t), ctx, w.comb_ctx_t))
        return torch.baddbmm(w.out_b, x, w.out_t)

    def next_tokens(self, prev: torch.Tensor) -> torch.Tensor:
        """Greedy step: prev (K, N) -> argmax tokens (K, N)."""
        return argmax_last(self.step(prev), self.kern)

    def greedy(self, steps: torch.Tensor, t_max: int) -> torch.Tensor:
        """:func:`greedy_decode` (K, B, t_max); on a CPU every step in one call of the C
        decoder (:meth:`decode_in_c`), which computes the same to float rounding."""
        if not self.in_c():
            return greedy_decode(self, steps, t_max)
        return self.decode_in_c(steps)[0]

    def in_c(self) -> bool:
        """Whether :meth:`decode_in_c` can run: the C kernels on this device, width 1, and
        an attentional state with ``tanh`` where there is attention (the C decoder has no
        other activation; without it the torch ops decode)."""
        if self.keys_t is not None and not self.arch.attention_tanh:
            return False
        return self.width == 1 and applicable(self.kern, self.enc, self.arch.dec_hidden) is not None

    def decode_in_c(
        self, steps: torch.Tensor, gold: Seq2SeqBatch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Greedy tokens (K, B, max steps) and, given ``gold`` (the batch this stepper
        encoded), the teacher-forced cross-entropy (K, N) and argmax hits (K, N) bool of its
        token list, from one call of the C decoder (``kernels/decode.c``): greedy decoding
        goes on from the teacher-forced pass where a row's argmax leaves its gold tokens.
        Needs :meth:`in_c`. The stepper's states are left as they were."""
        a, w = self.arch, self.w
        kern = applicable(self.kern, self.enc, a.dec_hidden)
        assert kern is not None and self.width == 1 and w.tgt_table is not None
        k, n = self.k, self.n
        t_max = int(steps.max()) if steps.numel() else 0
        tokens = torch.zeros(k, n, max(t_max, 1), dtype=torch.int64)
        v = w.out_t.shape[-1]
        out_t, out_b = padded_output_layer(w.out_t, w.out_b)  # (K, Hd, Vp), (K, Vp)
        layers = w.decoder
        w_hh_t = torch.stack([layer.w_hh.transpose(1, 2) for layer in layers]).contiguous()
        upper = layers[1:]
        w_ih_t = torch.stack([layer.w_ih_t for layer in upper]).contiguous() if upper else None
        bias = torch.stack([layer.bias[:, 0] for layer in upper]).contiguous() if upper else None
        h, c2 = self.h.contiguous(), self.c2.contiguous()  # (L, K, N, Hd)
        keys_t = mask = enc = comb_ctx_t = comb_h_t = None
        if self.keys_t is not None:
            assert w.comb_ctx_t is not None and w.comb_h_t is not None
            keys_t, mask, enc = self.keys_t, self.bias.contiguous(), self.enc.contiguous()
            comb_ctx_t, comb_h_t = w.comb_ctx_t.contiguous(), w.comb_h_t.contiguous()
        glen = gold_in = gold_out = ce = hit = None
        if gold is not None:
            tg = gold.tgt_in.shape[2]
            glen = gold.tgt_mask.sum(2, dtype=torch.int32)  # (K, B): n + 1 positions
            gold_in, gold_out = gold.tgt_in.contiguous(), gold.tgt_out.contiguous()
            ce = w.out_t.new_zeros(k, n, tg)
            hit = torch.zeros(k, n, tg, dtype=torch.bool)
        kern.decode(
            steps=steps.to(torch.int32).contiguous(), tokens=tokens, bos=BOS, table=w.tgt_table,
            vocab=a.tgt_vocab, w_ih_t=w_ih_t, bias=bias, w_hh_t=w_hh_t, h0=h, c20=c2,
            keys_t=keys_t, mask=mask, enc=enc, comb_ctx_t=comb_ctx_t, comb_h_t=comb_h_t,
            out_t=out_t, out_b=out_b, classes=v, glen=glen, gold_in=gold_in, gold_out=gold_out,
            ce=ce, hit=hit,
        )
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
