"""What both seq2seq implementations share: sizes, parameter layout, batches, dropout.

**Parameter layout.** The parameters are those of plain torch modules (built on the
``meta`` device, so building them draws no random numbers): ``src_emb``/``tgt_emb``
(``nn.Embedding``), ``encoder``/``decoder`` (``nn.LSTM``, batch-first, gate order i, f,
g, o), ``attn`` (``nn.Linear(enc_out, dec_hidden, bias=False)``, the bilinear ``W_a``),
``combine`` (``nn.Linear(enc_out + dec_hidden, dec_hidden, bias=False)``, ``W_c`` over
``[context; h_dec]``) and ``out`` (``nn.Linear(dec_hidden, Arch.out_classes)``: every target
id, or with ``Arch.out_offset`` only the ids from it on, see :func:`pad_classes`); the target
embedding has ``Arch.tgt_emb_size`` and decoder layer 0 ``Arch.dec_input`` inputs (with
input feeding also h~). Each is stored
stacked over the K members under the name ``{module}_{param}``, e.g.
``encoder_weight_ih_l0_reverse`` ``(K, 4H, E)``. Both implementations read the same
stacked parameters, so a member's state is the same dict whichever computes it.

**Batch layout** (:class:`Seq2SeqBatch`): per member, sources padded with 0 to the longest
source of the whole bundle, decoder inputs ``BOS y_1 .. y_n`` and outputs ``y_1 .. y_n
EOS`` padded to the longest target + 1, plus a *token list*: every member's non-padding
target positions in (example, time) order, padded to the member with the most tokens.
The loss is computed only on the token list.

**Dropout protocol** (identical in both implementations, so a lone run, a bundle member
and the reference draw the same masks): each loss call draws, per member from its own
generator, uniform numbers for exactly that member's *non-padding* positions in
(example, time) order: (1) source embeddings ``(src tokens, E)``, (2) decoder-input
embeddings ``(target tokens + EOS, E)``, (3) the attentional state before the output
layer ``(target tokens + EOS, dec_hidden)``. "Example" order is the batch's row order
(in training each member's :meth:`Seq2Seq.train_layout`). That canonical shape depends
only on the member's own batch, never on the padding of the bundle, and skips the padding a
``(B, meta max length, features)`` draw would waste: with symbol rewriting's maximum
lengths that draw (``MemberNoise.dropout_mask``, ``bernoulli_``) took about 1.3 ms of a
~12 ms step on one thread, these ``torch.rand`` draws about 0.3 ms. A unit is kept when
``u < 1 - p`` and scaled by ``1/(1-p)``.

With ``execution.cuda_graphs`` the masks are positional instead
(:class:`~trainables.models.counter_noise.CounterNoise`): drawn over the padded grid, each
element keyed by its place in the member's own batch (:func:`time_major_multipliers`,
:func:`token_multipliers`), 0 at padding; again the same for a lone run and a bundle member.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from trainables.data import BOS, EOS, SeqPairs, SplitData
from trainables.errors import ConfigError, DataError
from trainables.models.base import MemberNoise
from trainables.models.seq2seq.decode import decode
from trainables.runtime import to_device

IGNORE = -100
"""Target id of token-list padding (``F.cross_entropy``'s ``ignore_index``)."""

EXCLUDED_LOGIT = -1e30
"""The logit of a target id the output layer leaves out (``Arch.out_offset``): its softmax
probability is exactly 0 in float32 and float64 (torch's ops; the C kernels clamp ``exp``
at -87, about 1e-38, below a float32 rounding of any sum that holds a real class), it never
wins an argmax, and unlike ``-inf`` no product with it makes a NaN."""


@dataclass(frozen=True)
class Arch:
    """Sizes and switches of one seq2seq architecture (from the config and task meta)."""

    src_vocab: int
    tgt_vocab: int
    emb: int
    hidden: int
    """Encoder hidden size per direction."""
    directions: int
    """1, or 2 for a bidirectional encoder."""
    layers: int
    attention: bool
    dropout: float
    max_src_len: int
    max_tgt_len: int
    tgt_emb: int = 0
    """Target embedding size; 0: ``emb`` (one size for both vocabularies)."""
    embedding_dropout: bool = True
    """Dropout (at ``dropout``) on the source and target embeddings as well as on h~."""
    input_feeding: bool = False
    """Decoder layer 0's input at step t is ``[emb(y_{t-1}); h~_{t-1}]`` (Luong et al. 2015,
    sec. 3.3), ``h~_0 = 0``; the fast implementation steps it in :mod:`feeding`."""
    attention_tanh: bool = True
    """``h~ = tanh(W_c [context; h_dec])``; False: ``h~ = W_c [context; h_dec]`` (TensorFlow 1's
    ``AttentionWrapper`` attention layer, no activation)."""
    out_offset: int = 0
    """The output layer scores the target ids ``out_offset .. tgt_vocab - 1`` only (its class
    j is id ``out_offset + j``); the ids below get :data:`EXCLUDED_LOGIT` (:func:`pad_classes`).
    0: every id; ``EOS`` (2): the ids a target can hold, without ``<pad>`` and ``<s>``."""

    @property
    def out_classes(self) -> int:
        """Units of the output layer (its softmax's classes)."""
        return self.tgt_vocab - self.out_offset

    @property
    def tgt_emb_size(self) -> int:
        """Size of a target embedding."""
        return self.tgt_emb or self.emb

    @property
    def dec_input(self) -> int:
        """Input size of decoder layer 0: the target embedding, plus h~ with input feeding."""
        return self.tgt_emb_size + (self.dec_hidden if self.input_feeding else 0)

    @property
    def enc_out(self) -> int:
        """Size of an encoder output (both directions concatenated)."""
        return self.hidden * self.directions

    @property
    def dec_hidden(self) -> int:
        """Decoder hidden size: the encoder's output size, so its final state initialises it."""
        return self.enc_out


def build_modules(arch: Arch, device: torch.device | str = "meta") -> nn.ModuleDict:
    """The plain torch modules whose parameters define the layout (see the module doc).

    Built on the CPU and then moved to ``device``: a module's random init on the ``meta``
    device runs torch's Python reference kernels, whose first call imports ``torch._dynamo``
    (about a core-second in every new worker process); on the CPU these few small tensors
    cost about a millisecond. The global RNG is left as it was (``fork_rng``)."""
    with torch.random.fork_rng(devices=[]):
        return _modules(arch).to(device)


def _modules(arch: Arch) -> nn.ModuleDict:
    mods: dict[str, nn.Module] = {
        "src_emb": nn.Embedding(arch.src_vocab, arch.emb),
        "tgt_emb": nn.Embedding(arch.tgt_vocab, arch.tgt_emb_size),
        "encoder": nn.LSTM(
            arch.emb,
            arch.hidden,
            arch.layers,
            batch_first=True,
            bidirectional=arch.directions == 2,
        ),
        "decoder": nn.LSTM(arch.dec_input, arch.dec_hidden, arch.layers, batch_first=True),
    }
    if arch.attention:
        mods["attn"] = nn.Linear(arch.enc_out, arch.dec_hidden, bias=False)
        mods["combine"] = nn.Linear(
            arch.enc_out + arch.dec_hidden, arch.dec_hidden, bias=False
        )
    mods["out"] = nn.Linear(arch.dec_hidden, arch.out_classes)
    return nn.ModuleDict(mods)


def pad_classes(x: torch.Tensor, offset: int, fill: float = EXCLUDED_LOGIT) -> torch.Tensor:
    """x (..., out_classes) -> (..., out_classes + offset): ``offset`` columns of ``fill`` in
    front, so that column i is target id i again (logits, or an output bias; ``fill`` 0 for
    an output weight). Differentiable; x itself when ``offset`` is 0."""
    if offset == 0:
        return x
    return torch.cat([x.new_full((*x.shape[:-1], offset), fill), x], -1)


def param_layout(modules: nn.ModuleDict) -> dict[str, tuple[str, str, torch.Size]]:
    """Stacked name -> (module, parameter, per-member shape), in registration (= init) order."""
    return {
        f"{m}_{n}": (m, n, p.shape)
        for m, module in modules.items()
        for n, p in module.named_parameters()
    }


@dataclass
class Seq2SeqBatch:
    """One bundle batch. K members, B examples each; S, T padded lengths; N max tokens."""

    src: torch.Tensor
    """(K, B, S) int64 source ids, 0-padded (reversed within length if reverse_source)."""
    src_len: torch.Tensor
    """(K, B) int64 source lengths."""
    src_mask: torch.Tensor
    """(K, B, S) bool, True at real source positions."""
    tgt_in: torch.Tensor
    """(K, B, T) int64 decoder inputs ``BOS y_1 .. y_n``, 0-padded; T = longest target + 1."""
    tgt_out: torch.Tensor
    """(K, B, T) int64 decoder targets ``y_1 .. y_n EOS``, 0-padded."""
    tgt_mask: torch.Tensor
    """(K, B, T) bool, True at real decoder positions (n + 1 per example)."""
    tok_pos: torch.Tensor
    """(K, N) int64 token list: flat index into (K, B, T) of member k's j-th target
    position in (example, time) order; padding points at the member's (0, 0)."""
    tok_target: torch.Tensor
    """(K, N) int64 target id of each listed token, ``IGNORE`` at padding."""
    tok_example: torch.Tensor
    """(K, N) int64 flat example index ``k * B + b`` of each listed token."""
    tok_step_weight: torch.Tensor
    """(K, N) float32 1 / (examples of member k with a token at this token's step); 0 at padding."""
    n_tokens: torch.Tensor
    """(K,) float32 real target tokens (incl. EOS) per member."""
    src_counts: tuple[int, ...]
    """Real source tokens per member (dropout draw sizes)."""
    tgt_counts: tuple[int, ...]
    """Real target tokens (incl. EOS) per member (dropout draw sizes)."""
    src_tm_pos: torch.Tensor
    """(sum src_counts,) int64 flat index into time-major (K, S, B) of every real source
    position, members in order, each in (example, time) order."""
    tgt_tm_pos: torch.Tensor
    """(sum tgt_counts,) int64 the same for time-major decoder positions (K, T, B)."""
    tok_list_pos: torch.Tensor
    """(sum tgt_counts,) int64 flat index into the token list (K, N) of every real token."""
    src_rev: torch.Tensor
    """(K, B, S) int64 time index that reverses each source within its own length
    (padding stays in place); its own inverse."""
    decode_steps: np.ndarray
    """(K, B) int64 greedy decoding steps per example (task meta ``decode_len``)."""
    src_active: tuple[int, ...] = ()
    """Per encoder step s, the rows every member must compute: the shortest prefix of the
    batch holding all of its examples with a source longer than s. The fast LSTM skips
    the rows past it (training batches list each member's longest targets first)."""
    tgt_active: tuple[int, ...] = ()
    """The same per decoder step t for the decoder positions (target length + 1)."""
    decode_steps_t: torch.Tensor | None = None
    """:attr:`decode_steps` on the batch's device, in a batch made for a captured evaluation
    (:meth:`~trainables.models.seq2seq.model.Seq2Seq.graph_batch`), else None."""

    def steps(self) -> torch.Tensor:
        """:attr:`decode_steps` as a (K, B) int64 tensor on the batch's device."""
        if self.decode_steps_t is not None:
            return self.decode_steps_t
        return torch.from_numpy(self.decode_steps).to(self.src.device)

    @property
    def max_steps(self) -> int:
        """The most decoding steps of any example (read on the host)."""
        return int(self.decode_steps.max()) if self.decode_steps.size else 0


def seq_pairs(data: SplitData) -> SeqPairs:
    """``data`` as :class:`SeqPairs`, the only data a seq2seq model takes."""
    if not isinstance(data, SeqPairs):
        raise TypeError(f"seq2seq models need SeqPairs data, got {type(data).__name__}")
    return data


def longest_first(data: SplitData, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each member's rows by decreasing target length (stable): the examples that end first
    are then the last rows of the batch, a suffix the fast LSTM stops computing."""
    lengths = seq_pairs(data).padded().tgt[1]
    return [r[np.argsort(-lengths[r], kind="stable")] for r in rows]


def collate(
    data: SplitData,
    rows: Sequence[np.ndarray],
    device: torch.device | str,
    reverse_source: bool,
    decode_len: Callable[[np.ndarray], np.ndarray],
    buckets: bool = False,
) -> Seq2SeqBatch:
    """Build a :class:`Seq2SeqBatch` from member k's example indices ``rows[k]`` (equal lengths).
    When every member has the same rows (evaluation), one member's batch is built and
    repeated (:func:`repeat_members`). With ``buckets`` S and T are padded up to a multiple
    of :data:`LENGTH_BUCKET` and N to one of :data:`TOKEN_BUCKET` (more padding, which
    changes no loss or gradient, for few distinct shapes: CUDA graphs)."""
    if len(rows) > 1 and all(r is rows[0] or np.array_equal(r, rows[0]) for r in rows[1:]):
        one = collate(data, rows[:1], device, reverse_source, decode_len, buckets)
        return repeat_members(one, len(rows))
    data = seq_pairs(data)
    index = np.stack([np.asarray(r, dtype=np.int64) for r in rows])  # (K, B)
    k, b = index.shape
    (src_all, src_len), (tgt_all, tgt_len) = data.padded().src, data.padded().tgt
    ls, lt = src_len[index], tgt_len[index]  # (K, B)
    if b == 0 or ls.min() < 1:
        raise DataError(
            "seq2seq batch: every example needs a non-empty source and a batch at least one "
            "example; drop empty sources from the task's data"
        )
    s, t = int(ls.max()), int(lt.max()) + 1
    if buckets:
        s, t = _round_up(s, LENGTH_BUCKET), _round_up(t, LENGTH_BUCKET)

    src_mask = np.arange(s) < ls[..., None]  # (K, B, S)
    steps_t = np.arange(s)
    src_rev = np.where(src_mask, ls[..., None] - 1 - steps_t, steps_t)  # its own inverse
    src = np.zeros((k, b, s), dtype=np.int64)  # (K, B, S), zero-padded
    src[..., : min(s, src_all.shape[1])] = src_all[index, :s]
    if reverse_source:
        src = np.take_along_axis(src, src_rev, axis=2)

    tgt_mask = np.arange(t) < (lt + 1)[..., None]  # (K, B, T)
    tgt_out = np.zeros((k, b, t), dtype=np.int64)
    width = min(t - 1, tgt_all.shape[1])
    tgt_out[..., :width] = tgt_all[index, :width]
    np.put_along_axis(tgt_out, lt[..., None], EOS, axis=2)
    tgt_in = np.zeros((k, b, t), dtype=np.int64)
    tgt_in[..., 0] = BOS
    tgt_in[..., 1:] = tgt_out[..., :-1]
    tgt_in[~tgt_mask] = 0

    # token list: member kk's j-th real target position (bb, tt), (example, time) order
    kk, bb, tt = np.nonzero(tgt_mask)
    counts = (lt + 1).sum(1)  # (K,)
    n = int(counts.max())
    if buckets:
        n = _round_up(n, TOKEN_BUCKET)
    j = np.arange(len(kk)) - (np.cumsum(counts) - counts)[kk]
    members = np.arange(k)[:, None]
    tok_pos = np.broadcast_to(members * b * t, (k, n)).copy()
    tok_pos[kk, j] = (kk * b + bb) * t + tt
    tok_target = np.full((k, n), IGNORE, dtype=np.int64)
    tok_target[kk, j] = tgt_out[kk, bb, tt]
    tok_example = np.broadcast_to(members * b, (k, n)).copy()
    tok_example[kk, j] = kk * b + bb
    per_step = tgt_mask.sum(1)  # (K, T) examples with a token at step t
    tok_step_weight = np.zeros((k, n), dtype=np.float32)
    tok_step_weight[kk, j] = 1.0 / per_step[kk, tt]

    sk, sb, st = np.nonzero(src_mask)

    def as_t(x: np.ndarray) -> torch.Tensor:
        return to_device(torch.from_numpy(np.ascontiguousarray(x)), device)

    return Seq2SeqBatch(
        src=as_t(src),
        src_len=as_t(ls),
        src_mask=as_t(src_mask),
        tgt_in=as_t(tgt_in),
        tgt_out=as_t(tgt_out),
        tgt_mask=as_t(tgt_mask),
        tok_pos=as_t(tok_pos),
        tok_target=as_t(tok_target),
        tok_example=as_t(tok_example),
        tok_step_weight=as_t(tok_step_weight),
        n_tokens=as_t(counts.astype(np.float32)),
        src_counts=tuple(int(c) for c in ls.sum(1)),
        tgt_counts=tuple(int(c) for c in counts),
        src_tm_pos=as_t((sk * s + st) * b + sb),
        tgt_tm_pos=as_t((kk * t + tt) * b + bb),
        tok_list_pos=as_t(kk * n + j),
        src_rev=as_t(src_rev),
        decode_steps=np.asarray(decode_len(ls.ravel()), dtype=np.int64).reshape(k, b),
        src_active=active_rows(src_mask),
        tgt_active=active_rows(tgt_mask),
    )


LENGTH_BUCKET = 4
"""With ``collate(..., buckets=True)``, S and T are padded up to a multiple of this."""
TOKEN_BUCKET = 128
"""With ``collate(..., buckets=True)``, the token list is padded up to a multiple of this."""


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def repeat_members(one: Seq2SeqBatch, k: int) -> Seq2SeqBatch:
    """The batch :func:`collate` builds for ``k`` members that all have the rows of
    ``one``'s single member: the same values, positions offset member by member."""
    _, b, s = one.src.shape
    t, n = one.tgt_in.shape[2], one.tok_pos.shape[1]
    member = torch.arange(k, device=one.src.device).view(k, 1)

    def rep(x: torch.Tensor) -> torch.Tensor:
        return x.expand(k, *x.shape[1:]).contiguous()

    return Seq2SeqBatch(
        src=rep(one.src),
        src_len=rep(one.src_len),
        src_mask=rep(one.src_mask),
        tgt_in=rep(one.tgt_in),
        tgt_out=rep(one.tgt_out),
        tgt_mask=rep(one.tgt_mask),
        tok_pos=one.tok_pos + member * (b * t),
        tok_target=rep(one.tok_target),
        tok_example=one.tok_example + member * b,
        tok_step_weight=rep(one.tok_step_weight),
        n_tokens=rep(one.n_tokens),
        src_counts=one.src_counts * k,
        tgt_counts=one.tgt_counts * k,
        src_tm_pos=(one.src_tm_pos + member * (s * b)).view(-1),
        tgt_tm_pos=(one.tgt_tm_pos + member * (t * b)).view(-1),
        tok_list_pos=(one.tok_list_pos + member * n).view(-1),
        src_rev=rep(one.src_rev),
        decode_steps=np.repeat(one.decode_steps, k, 0),
        src_active=one.src_active,
        tgt_active=one.tgt_active,
    )


def active_rows(mask: np.ndarray) -> tuple[int, ...]:
    """mask (K, B, T) -> per step t the length of the shortest row prefix that holds every
    member's True entries of column t (0 where there is none)."""
    hit = mask.any(0)  # (B, T)
    last = np.where(hit, np.arange(mask.shape[1])[:, None], -1).max(0)  # (T,)
    return tuple(int(n) + 1 for n in last)


def dropout_masks(
    noise: MemberNoise | None, p: float, counts: Sequence[int], features: int
) -> torch.Tensor | None:
    """Inverted-dropout multipliers ``(sum counts, features)``: member k's ``counts[k]`` rows
    from generator k (see the dropout protocol above); None without noise or when p = 0.
    Members with their own rates (``noise.rates``) each draw at their own rate; a member at
    rate 0 gets rows of ones and draws nothing, as its lone run does."""
    if noise is None:
        return None
    if noise.positional:
        raise ConfigError(
            "execution.cuda_graphs",
            "the seq2seq reference implementation draws each member's masks row by row from its generator",
            "use model.impl: fast, or execution.cuda_graphs: false",
        )
    if noise.rates is not None:
        return _member_rate_masks(noise, counts, features)
    if p == 0.0:
        return None
    keep = 1.0 - p
    u = torch.cat(
        [
            torch.rand((c, features), generator=g, device=noise.device)
            for c, g in zip(counts, noise.generators, strict=True)
        ]
    )
    return (u < keep).to(u.dtype).mul_(1.0 / keep)


def time_major_multipliers(
    noise: MemberNoise | None,
    p: float,
    real: torch.Tensor,
    counts: Sequence[int],
    tm_pos: torch.Tensor,
    features: int,
) -> torch.Tensor | None:
    """Dropout multipliers (K, X, B, F) for time-major activations whose real positions are
    ``real`` (K, B, X) bool (0 at padding); None without noise or when p = 0.

    Generator noise draws :func:`dropout_masks` rows (``counts``) and scatters them to
    ``tm_pos``; positional noise (:attr:`MemberNoise.positional`) keys element (x, b, f) by
    ``(x * B + b) * F + f``, which is where it sits in the member's own batch, so a lone run
    and a bundle member get the same multiplier whatever the padding."""
    if noise is None:
        return None
    k, b, x = real.shape
    if noise.positional:
        pos = torch.arange(x * b, device=real.device).view(1, x, b, 1) * features
        elements = pos + torch.arange(features, device=real.device)
        m = noise.multipliers(p, elements)
        return None if m is None else m * real.transpose(1, 2).unsqueeze(-1)
    mask = dropout_masks(noise, p, counts, features)
    return None if mask is None else scatter_rows(mask, tm_pos, (k, x, b, features))


def token_multipliers(noise: MemberNoise | None, p: float, batch: Seq2SeqBatch, features: int) -> torch.Tensor | None:
    """Dropout multipliers (K, N, F) for the token list of ``batch`` (0 at its padding);
    positional noise keys a listed token by its (time, example) place as
    :func:`time_major_multipliers` does (see there)."""
    if noise is None:
        return None
    k, b, t = batch.tgt_in.shape
    n = batch.tok_pos.shape[1]
    if noise.positional:
        local = batch.tok_pos % (b * t)  # (K, N): b * T + t within the member
        where = (local % t) * b + local // t
        elements = where.unsqueeze(-1) * features + torch.arange(features, device=where.device)
        m = noise.multipliers(p, elements)
        return None if m is None else m * (batch.tok_target != IGNORE).unsqueeze(-1)
    mask = dropout_masks(noise, p, batch.tgt_counts, features)
    return None if mask is None else scatter_rows(mask, batch.tok_list_pos, (k, n, features))


def _member_rate_masks(noise: MemberNoise, counts: Sequence[int], features: int) -> torch.Tensor | None:
    """:func:`dropout_masks` with each member at its own rate (``noise.rates``)."""
    assert noise.rates is not None
    if not any(noise.rates):
        return None
    parts = []
    for c, g, p in zip(counts, noise.generators, noise.rates, strict=True):
        if p == 0.0:
            parts.append(torch.ones((c, features), device=noise.device))
            continue
        keep = 1.0 - p
        u = torch.rand((c, features), generator=g, device=noise.device)
        parts.append((u < keep).to(u.dtype).mul_(1.0 / keep))
    return torch.cat(parts)


def scatter_rows(rows: torch.Tensor, positions: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A zero tensor of ``shape`` whose flattened leading dims hold ``rows`` at ``positions``."""
    flat = rows.new_zeros(int(np.prod(shape[:-1])), shape[-1])
    return flat.index_copy_(0, positions, rows).view(*shape)


class Engine(ABC):
    """What an implementation (``fast``, ``reference``) computes over the stacked parameters."""

    def __init__(self, arch: Arch) -> None:
        self.arch = arch

    def token_ce(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, noise: MemberNoise | None
    ) -> torch.Tensor:
        """Cross-entropy of every target token (K, N) (see :meth:`token_outputs`)."""
        return self.token_outputs(params, batch, noise, hits=False)[0]

    @abstractmethod
    def token_outputs(
        self,
        params: Mapping[str, torch.Tensor],
        batch: Seq2SeqBatch,
        noise: MemberNoise | None,
        hits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-entropy of every target token (K, N) in (example, time) order, 0 at token-list
        padding; with ``hits`` also whether each token is the argmax of its logits (K, N)."""

    @abstractmethod
    def start_decode(self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, width: int) -> Any:
        """A stepper for greedy or beam decoding (:mod:`decode`)."""

    def evaluate(
        self, params: Mapping[str, torch.Tensor], batch: Seq2SeqBatch, hits: bool, width: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Without noise: :meth:`token_outputs` and the decoded tokens (K, B, max steps) of
        greedy decoding or beam search of ``width``; an implementation may share work
        between them."""
        ce, hit = self.token_outputs(params, batch, None, hits)
        return ce, hit, decode(self.start_decode(params, batch, width), batch.steps(), width, batch.max_steps)
