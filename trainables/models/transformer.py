"""``transformer``: a small decoder-only Transformer (nanoGPT style) for ``seq2seq`` tasks.

A plain one-seed ``nn.Module`` (:class:`DecoderLM`), bundled over seeds by fineline through
``torch.func`` (:mod:`trainables.models.plain`). Causal self-attention, pre-LayerNorm
blocks (``x + attn(ln1(x))``, ``x + mlp(ln2(x))``, a final LayerNorm; ``layer_norm: false``
drops all three, as Nanda et al.'s grokking model has none), learned positions or none
(``pos: none``, NoPE: the causal mask is the only source of order).

**A seq2seq pair as a language model.** An example ``(src, tgt)`` is one sequence
``src (<s>) y_1 .. y_n``: the prompt (the source, then the target's ``<s>`` when ``bos``),
then the answer tokens fed back. The answer ``y_1 .. y_n`` (then ``</s>`` when ``eos``) is
predicted from the prompt's last position onwards, and the loss is on those positions only
(on the answer token alone for grokking's ``a op b =``, as in Nanda et al.'s code).
Token ids: source ids as they are, target ids shifted by ``len(src_vocab)`` (one input
table for both vocabularies); the output layer scores target-vocabulary ids only.
Embeddings are **untied**: the input table covers prompt and answer tokens, the output
layer answer tokens only (Nanda et al.'s ``W_E`` and ``W_U`` are separate too).

**Generation** (greedy, on the bundle: every member its own tokens): *free-running*
generates until ``</s>`` (at most ``max_tgt_len + 1`` tokens; without ``eos``, exactly
``max_tgt_len``); the prediction is the tokens up to and including the first ``</s>``,
which the task scores. *Oracle length* generates exactly ``len(tgt)`` tokens with ``</s>``
ruled out (Zhou et al. 2023's "oracle length"); the model scores it as ``oracle_exact``
(1 where all of them are the target). ``<pad>`` and ``<s>`` are never generated. Keys and
values are cached: the prompt runs once, then each step runs one position per example (its
last token, at that example's own position) against the cached keys and values, where the
old loop ran the whole sequence so far at every step (``Transformer.generate``; the same
tokens, tested).

**Batches.** Right-padded (causal attention: padding after a position never reaches it).
Training batches are padded to the longest example of the *split*, not of the batch, so
the dropout masks a member draws (in the activation's shape) never depend on its bundle;
evaluation batches are cut to their own longest example. Where every member has the same
rows (evaluation; full-batch training, whose rows each member sorts) the input is shared.

**Attention** is written out (``q k^T / sqrt(d_head)``, causal mask, softmax, ``@ v``):
``F.scaled_dot_product_attention`` runs under ``vmap`` in torch 2.13 but has no batching
rule for its CPU kernel (vmap loops over the members inside it, and warns), and its CPU
kernel is tagged a seeded random op (for its ``dropout_p``), which fineline refuses in
training; the explicit form is batched, and lets attention-probability dropout draw from
each seed's own stream (``benchmarks/transformer_bundle.py`` times both: at K = 10, p = 31,
width 64, full batch, the vmapped bundle ran 1.3x the K lone runs, the member loop alike,
SDPA slower). The keys have no bias (a key bias shifts every score of a query alike, so
the softmax ignores it: its gradient is rounding noise, which Adam scales up to steps that
differ between a bundle and a lone run); queries, values and outputs have one with ``bias``.

Initialisation (``init``): ``gpt2`` (nanoGPT): every ``Linear`` and ``Embedding`` weight
N(0, 0.02), the two residual projections per block N(0, 0.02 / sqrt(2 n_layers)), biases
0, LayerNorm 1 and 0; ``nanda``: Nanda et al.'s grokking code: every weight
N(0, 1 / d_model) except the output layer's N(0, 1 / target vocabulary), biases 0. Weight
decay (AdamW) applies to every parameter, as in Nanda et al.'s code (nanoGPT exempts
biases and LayerNorms).

Meta keys read: ``src_vocab``, ``tgt_vocab`` (:class:`~trainables.data.Vocab`),
``max_src_len``, ``max_tgt_len`` (over every split: the learned positions cover the
longest example). Loss reductions: ``token_mean`` (over the member's answer tokens),
``sum``, ``sum_per_sequence``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.data import BOS, EOS, PAD, SeqPairs, SplitData, TokenRows
from trainables.errors import ConfigError, DataError
from trainables.models.base import MemberNoise
from trainables.models.plain import Dropout, PlainModel
from trainables.registry import MODELS

IGNORE = -100
"""Target id of positions without a loss (``F.cross_entropy``'s ``ignore_index``)."""


class TransformerConfig(FrozenConfig):
    """Decoder-only Transformer settings (the default sizes are Nanda et al.'s grokking
    model's; a study file states what it uses)."""

    d_model: int = Field(128, ge=1)
    """Width of the residual stream (embeddings, attention, block outputs)."""
    n_heads: int = Field(4, ge=1)
    """Attention heads per layer; must divide ``d_model``."""
    n_layers: int = Field(1, ge=1)
    """Transformer blocks."""
    d_ff: int = Field(512, ge=1)
    """Hidden units of each block's MLP."""
    activation: Literal["relu", "gelu"] = "relu"
    """The MLP's nonlinearity (Nanda et al.: ReLU; nanoGPT: GELU)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the embeddings, the attention probabilities, and each block's attention and
    MLP outputs (nanoGPT's places); masks from each seed's own dropout stream."""
    pos: Literal["learned", "none"] = "learned"
    """Positions: ``learned`` absolute embeddings, or ``none`` (NoPE: only the causal mask
    tells positions apart)."""
    layer_norm: bool = True
    """Pre-LayerNorm blocks and a final LayerNorm; false: none (Nanda et al.'s grokking model)."""
    bias: bool = True
    """Biases in every Linear and LayerNorm (false: none anywhere)."""
    init: Literal["gpt2", "nanda"] = "gpt2"
    """``gpt2``: N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layers)); ``nanda``: Nanda
    et al.'s N(0, 1/d_model), output layer N(0, 1/vocabulary) (see the module docstring)."""
    bos: bool = True
    """Put the target's ``<s>`` between prompt and answer (the answer is predicted from it);
    false: the first answer token is predicted at the prompt's last position (for a task
    whose prompt ends in its own separator, e.g. modular arithmetic's ``=``)."""
    eos: bool = True
    """Answers end with ``</s>``: the loss includes it and free-running generation stops at
    it; false: no ``</s>`` (fixed-length answers, e.g. grokking's single answer token, where
    the loss is on the answer alone)."""
    high_precision_loss: bool = False
    """Cross-entropy from float64 log-softmax (Nanda et al.'s ``cross_entropy_high_precision``:
    float32 rounds tiny losses, whose gradients then vanish, late in grokking runs)."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.d_model % self.n_heads:
            raise ConfigError(
                "model.n_heads", f"{self.n_heads} heads do not divide d_model {self.d_model}",
                "choose n_heads dividing d_model (e.g. d_model 128 with 4 heads)",
            )
        return self


# --- the one-seed module -------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=False)  # a key bias moves no softmax: its
        self.v = nn.Linear(d_model, d_model, bias=bias)  # gradient is rounding noise, which Adam scales up
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.attn_drop = Dropout(dropout)
        self.resid_drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = (z(x).reshape(b, t, h, d // h).transpose(1, 2) for z in (self.q, self.k, self.v))  # (B, H, T, dh)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))  # (B, H, T, T)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = self.attn_drop(att.masked_fill(future, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)  # (B, T, d)
        return self.resid_drop(self.proj(y))  # type: ignore[no-any-return]

    def cached(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Evaluation with a cache: ``x`` (B, T, d), new tokens in order, attending causally
        to each other and to the cached ``keys`` / ``values`` (B, H, C, dh) where ``visible``
        (B, C) is true. Returns (B, T, d) and the new tokens' keys and values (B, H, T, dh),
        for the caller to cache (nothing here writes the cache: a write inside the bundle's
        vmap was either a copy of the whole cache per token or a slow in-place fallback)."""
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = (z(x).reshape(b, t, h, d // h).transpose(1, 2) for z in (self.q, self.k, self.v))  # (B, H, T, dh)
        scale = 1.0 / math.sqrt(d // h)
        old = (q @ keys.transpose(-2, -1) * scale).masked_fill(~visible[:, None, None, :], float("-inf"))  # (B, H, T, C)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        new = (q @ k.transpose(-2, -1) * scale).masked_fill(future, float("-inf"))  # (B, H, T, T)
        att = torch.cat([old, new], dim=-1).softmax(dim=-1)  # one softmax over cache and new tokens
        c = keys.shape[2]
        y = (att[..., :c] @ values + att[..., c:] @ v).transpose(1, 2).reshape(b, t, d)  # (B, T, d)
        return self.proj(y), k, v


class MLP(nn.Module):
    """(B, T, d) -> Linear(d, d_ff) -> activation -> Linear(d_ff, d) -> dropout."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.proj = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))  # type: ignore[no-any-return]


def _norm(d_model: int, on: bool, bias: bool) -> nn.Module:
    return nn.LayerNorm(d_model, bias=bias) if on else nn.Identity()


class Block(nn.Module):
    """Pre-LN block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; (B, T, d) -> (B, T, d)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = _norm(cfg.d_model, cfg.layer_norm, cfg.bias)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.bias)
        self.ln2 = _norm(cfg.d_model, cfg.layer_norm, cfg.bias)
        self.mlp = MLP(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout, cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # type: ignore[no-any-return]

    def cached(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` in evaluation, through :meth:`CausalSelfAttention.cached`."""
        a, k, v = self.attn.cached(self.ln1(x), keys, values, visible)
        x = x + a
        return x + self.mlp(self.ln2(x)), k, v


class DecoderLM(nn.Module):
    """Token ids (B, T) -> next-token logits over the target vocabulary (B, T, vocab_out)."""

    def __init__(self, cfg: TransformerConfig, vocab_in: int, vocab_out: int, context: int) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab_in, cfg.d_model)
        self.pos = nn.Embedding(context, cfg.d_model) if cfg.pos == "learned" else None
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = _norm(cfg.d_model, cfg.layer_norm, cfg.bias)
        self.head = nn.Linear(cfg.d_model, vocab_out, bias=False)
        self._init(cfg, vocab_out)

    def _init(self, cfg: TransformerConfig, vocab_out: int) -> None:
        """Weights in registration order from torch's global generator (see the module doc)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:  # LayerNorm gains
                nn.init.ones_(p)
            elif cfg.init == "nanda":
                std = 1.0 / math.sqrt(vocab_out if name == "head.weight" else cfg.d_model)
                nn.init.normal_(p, 0.0, std)
            else:
                residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers) if residual else 0.02)

    def forward(
        self, tokens: torch.Tensor, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
        visible: torch.Tensor | None = None, start: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab_out) of ``tokens`` (B, T) at positions 0..T-1; or, given a
        cache (evaluation only: ``keys`` / ``values`` (L, B, H, C, dh), the slots ``visible``
        (B, C) to each example, and ``start`` (B,)), of ``tokens`` at positions ``start ..
        start + T - 1``, attending to the visible slots and causally to each other, returned
        with their keys and values (L, B, H, T, dh) for the caller to cache. Slot order does
        not matter (positions are in the embeddings, the mask says who sees what)."""
        t = tokens.shape[-1]
        x = self.tok(tokens)  # (B, T, d)
        if keys is None:
            if self.pos is not None:
                x = x + self.pos.weight[:t]
            x = self.drop(x)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))  # type: ignore[no-any-return]
        assert values is not None and visible is not None and start is not None, "a cached call takes all four"
        if self.pos is not None:
            x = x + self.pos.weight[start[:, None] + torch.arange(t, device=tokens.device)]
        new_keys, new_values = [], []
        for block, kc, vc in zip(self.blocks, keys.unbind(0), values.unbind(0), strict=True):
            assert isinstance(block, Block)
            x, k, v = block.cached(x, kc, vc, visible)
            new_keys.append(k)
            new_values.append(v)
        return self.head(self.ln_f(x)), torch.stack(new_keys), torch.stack(new_values)


# --- batches --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LMBatch:
    """A bundle batch: K members (or 1 row shared by all), B examples, width W."""

    inputs: torch.Tensor
    """(K|1, B, W) int64 input ids: prompt, then the answer tokens fed back; 0 beyond."""
    targets: torch.Tensor
    """(K|1, B, W) int64 target-vocabulary id predicted at each position, IGNORE where none."""
    prompt_len: torch.Tensor
    """(K|1, B) int64 prompt tokens (source, and ``<s>`` with ``bos``)."""
    tgt: torch.Tensor
    """(K|1, B, T) int64 answer ids, -1 beyond each answer's length (T >= 1)."""
    tgt_len: torch.Tensor
    """(K|1, B) int64 answer lengths (without ``</s>``)."""
    needed: int
    """Width that holds every example of this batch (W may be the split's, for training)."""


def lay_out(
    src: np.ndarray, src_len: np.ndarray, tgt: np.ndarray, tgt_len: np.ndarray,
    *, offset: int, bos: bool, eos: bool, width: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One member's rows as LM sequences: (inputs (B, width), targets (B, width), prompt (B,)).

    ``src`` (B, S) / ``tgt`` (B, T): 0-padded ids; target ids (and ``<s>``) enter ``inputs``
    shifted by ``offset``. Position ``prompt - 1 + j`` predicts ``tgt[j]`` (and, with ``eos``,
    position ``prompt - 1 + len`` predicts ``</s>``)."""
    b = len(src_len)
    cols = np.arange(width)[None, :]
    prompt = src_len + int(bos)
    s = min(src.shape[1], width)
    inputs = np.zeros((b, width), dtype=np.int64)
    inputs[:, :s] = np.where(cols[:, :s] < src_len[:, None], src[:, :s], 0)
    if bos:
        inputs[np.arange(b), src_len] = BOS + offset
    fed = np.maximum(tgt_len - 1 + int(eos), 0)  # answer tokens fed back
    j = cols - prompt[:, None]  # (B, W): index into the answer of the token at each position
    tg = np.take_along_axis(tgt, np.clip(j, 0, max(tgt.shape[1] - 1, 0)), axis=1) if tgt.shape[1] else j * 0
    inputs = np.where((j >= 0) & (j < fed[:, None]), tg + offset, inputs)
    j = j + 1  # the answer index each position predicts
    tp = np.take_along_axis(tgt, np.clip(j, 0, max(tgt.shape[1] - 1, 0)), axis=1) if tgt.shape[1] else j * 0
    targets = np.where((j >= 0) & (j < tgt_len[:, None]), tp, IGNORE)
    if eos:
        targets = np.where(j == tgt_len[:, None], EOS, targets)
    return inputs, targets, prompt


def _needed(src_len: np.ndarray, tgt_len: np.ndarray, bos: bool, eos: bool) -> int:
    return max(1, int((src_len + int(bos) + np.maximum(tgt_len - 1 + int(eos), 0)).max(initial=0)))


# --- the model ------------------------------------------------------------------------------


def _per_example(ce: torch.Tensor) -> torch.Tensor:
    return ce.sum(-1)


REDUCTIONS = ("token_mean", "sum", "sum_per_sequence")


@MODELS.register
class Transformer(PlainModel):
    """K seeds of :class:`DecoderLM` (see the module docstring)."""

    name: ClassVar[str] = "transformer"
    Config: ClassVar[type[FrozenConfig]] = TransformerConfig
    data_kind = "seq2seq"
    reductions: ClassVar[tuple[str, ...]] = REDUCTIONS
    tiny: ClassVar[dict[str, Any]] = {"d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "dropout": 0.1}

    config: TransformerConfig

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        missing = [key for key in ("src_vocab", "tgt_vocab", "max_src_len", "max_tgt_len") if key not in meta]
        if missing:
            raise ConfigError(
                "model.name", f"transformer needs task meta keys {missing}, which this task lacks",
                "pair the transformer with a task of data kind 'seq2seq'",
            )  # fmt: skip
        assert isinstance(config, TransformerConfig)
        self.offset = len(meta["src_vocab"])
        self.vocab_out = len(meta["tgt_vocab"])
        self.context = _needed(
            np.array([int(meta["max_src_len"])]), np.array([int(meta["max_tgt_len"])]), config.bos, config.eos
        )
        super().__init__(config, meta, k)

    def build_module(self, config: FrozenConfig, meta: dict[str, Any]) -> nn.Module:
        assert isinstance(config, TransformerConfig)
        return DecoderLM(config, self.offset + self.vocab_out, self.vocab_out, self.context)

    @classmethod
    def metric_names(cls, config: FrozenConfig) -> tuple[str, ...]:
        """``loss`` (teacher-forced, summed over an example's answer tokens) and
        ``oracle_exact`` (greedy generation of exactly the answer's length is the answer)."""
        return ("loss", "oracle_exact")

    # ----------------------------------------------------------------- batches
    def make_batch(self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device) -> LMBatch:
        if not isinstance(data, SeqPairs):
            raise TypeError(f"the transformer needs SeqPairs data, got {type(data).__name__}")
        cfg = self.config
        (src, src_len), (tgt, tgt_len) = data.padded().src, data.padded().tgt
        if not cfg.bos and len(src_len) and int(src_len.min()) == 0:
            raise DataError("an empty source with model.bos false leaves nothing to predict the answer from; set model.bos: true")
        if int(tgt_len.max(initial=0)) > int(self.meta["max_tgt_len"]) or int(src_len.max(initial=0)) > int(self.meta["max_src_len"]):
            raise DataError("a split holds longer sequences than the task's meta max_src_len / max_tgt_len")
        index = np.stack([np.asarray(r, dtype=np.int64) for r in rows])  # (K, B)
        if all(np.array_equal(index[0], r) for r in index[1:]):
            index = index[:1]
        width = _needed(src_len, tgt_len, cfg.bos, cfg.eos)  # the split's longest: see the module doc
        parts = [
            lay_out(src[i], src_len[i], tgt[i], tgt_len[i], offset=self.offset, bos=cfg.bos, eos=cfg.eos, width=width)
            for i in index
        ]
        t = max(1, tgt.shape[1])
        answers = np.full((*index.shape, t), -1, dtype=np.int64)
        answers[..., : tgt.shape[1]] = np.where(np.arange(tgt.shape[1]) < tgt_len[index][..., None], tgt[index], -1)

        def put(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        return LMBatch(
            inputs=put(np.stack([p[0] for p in parts])), targets=put(np.stack([p[1] for p in parts])),
            prompt_len=put(np.stack([p[2] for p in parts])), tgt=put(answers), tgt_len=put(tgt_len[index]),
            needed=_needed(src_len[index].ravel(), tgt_len[index].ravel(), cfg.bos, cfg.eos),
        )  # fmt: skip

    def graph_batch(self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device) -> LMBatch:
        """:meth:`make_batch`: a training batch is laid out at its split's width already, so
        its shapes repeat (one per batch size), and :meth:`loss` under positional noise reads
        only its tensors, without host synchronisation: the training step can be captured
        (``execution.cuda_graphs``). Evaluation is not captured (generation reads lengths on
        the host)."""
        return self.make_batch(data, rows, device)

    def train_layout(self, data: SplitData, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each member's rows sorted (the order within a batch changes no loss): where members
        train on the same rows (full batch) the bundle then shares one input."""
        return [np.sort(np.asarray(r)) for r in rows]

    # ----------------------------------------------------------------- losses
    def _token_ce(self, batch: LMBatch, noise: MemberNoise | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position cross-entropy (K, B, W) (0 where no loss) and the logits."""
        inputs, targets = batch.inputs, batch.targets
        if noise is None:  # evaluation: cut to this batch's own longest example
            inputs, targets = inputs[..., : batch.needed], targets[..., : batch.needed]
        logits = self.run_members(inputs, noise=noise)  # (K, B, W, V)
        k, b, w, v = logits.shape
        flat = logits.double() if self.config.high_precision_loss else logits
        ce = F.cross_entropy(
            flat.reshape(-1, v), targets.expand(k, b, w).reshape(-1), ignore_index=IGNORE, reduction="none"
        ).view(k, b, w)
        return ce.to(logits.dtype), logits

    def loss(self, batch: Any, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        if reduction not in REDUCTIONS:
            raise ConfigError(
                "train.loss_reduction", f"the transformer has no loss reduction {reduction!r}",
                f"use one of: {', '.join(REDUCTIONS)}",
            )  # fmt: skip
        ce, _ = self._token_ce(batch, noise)
        total = ce.sum(dim=(1, 2))  # (K,)
        if reduction == "sum":
            return total
        if reduction == "sum_per_sequence":
            return total / ce.shape[1]
        n_tokens = (batch.targets != IGNORE).sum(dim=(1, 2)).clamp(min=1)  # (K|1,)
        return total / n_tokens.to(total.dtype)

    def example_losses(self, batch: Any) -> torch.Tensor:
        """Teacher-forced cross-entropy summed over each example's answer tokens (K, B)."""
        return _per_example(self._token_ce(batch, None)[0])

    def example_metrics(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.evaluate_batch(batch)[0]

    # ----------------------------------------------------------------- generation
    @torch.no_grad()
    def predict(self, batch: Any) -> list[Sequence[np.ndarray]]:
        """K :class:`TokenRows`: free-running greedy answers, each up to its first ``</s>``."""
        return self._rows(*self.generate(batch, oracle=False))

    @torch.no_grad()
    def evaluate_batch(self, batch: Any) -> tuple[dict[str, torch.Tensor], list[Sequence[Any]]]:
        """Loss, ``oracle_exact`` and the free-running predictions; the teacher-forced pass is
        the first generation step where no answer token is fed (single-token answers), and
        the free-running answers are the oracle ones where every answer has the fixed length."""
        ce, logits = self._token_ce(batch, None)
        prompt_only = batch.prompt_len.numel() > 0 and batch.needed == int(batch.prompt_len.max())
        first = logits if prompt_only else None  # the same input as the first step's
        free = self.generate(batch, oracle=False, first=first)
        fixed = not self.config.eos and bool((batch.tgt_len == int(self.meta["max_tgt_len"])).all())
        tokens, _ = free if fixed else self.generate(batch, oracle=True, first=first)
        return {"loss": _per_example(ce), "oracle_exact": self._exact(tokens, batch)}, self._rows(*free)

    def _exact(self, tokens: torch.Tensor, batch: LMBatch) -> torch.Tensor:
        """(K, B) 1.0 where the generated tokens (K, B, steps) equal the answer."""
        k, b, steps = tokens.shape
        t = batch.tgt.shape[-1]
        width = max(steps, t)
        gen = F.pad(tokens, (0, width - steps), value=-2)[..., :width]
        gold = F.pad(batch.tgt, (0, width - t), value=-1).expand(k, b, width)
        inside = torch.arange(width, device=tokens.device) < batch.tgt_len[..., None]
        return ((gen == gold) | ~inside).all(-1).to(torch.float32)

    def generate(
        self, batch: LMBatch, oracle: bool, first: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy answers: tokens (K, B, steps) and lengths (K, B) (free-running: through the
        first ``</s>``; oracle: each answer's length). ``first``: logits of the prompt alone
        (K, B, W, V), if already computed (the first step then runs no forward)."""
        cfg = self.config
        k = self.k
        prompt = batch.prompt_len  # (K|1, B)
        b = prompt.shape[-1]
        dev = prompt.device
        if oracle:
            steps = int(batch.tgt_len.max()) if b else 0
        else:
            steps = int(self.meta["max_tgt_len"]) + int(cfg.eos)
        steps = max(steps, 1)
        banned = [PAD, BOS] + ([EOS] if oracle or not cfg.eos else [])
        top = int(prompt.max()) if b else 1
        keys: torch.Tensor | None = None
        values: torch.Tensor | None = None
        if steps == 1 and first is not None:  # one token: the teacher-forced pass is the step
            logits = first
        else:  # the prompt once into slots 0..top-1 of the cache, then the token of step i into
            # slot top + i; each example sees its own prompt's slots and the answer so far
            h = cfg.n_heads
            keys = torch.zeros((k, cfg.n_layers, b, h, top + steps - 1, cfg.d_model // h), device=dev,
                               dtype=next(self.parameters()).dtype)  # (K, L, B, H, C, dh)
            values = torch.zeros_like(keys)
            none = torch.zeros((1, b, 0), dtype=torch.bool, device=dev)
            logits, keys[..., :top, :], values[..., :top, :] = self.run_members(
                batch.inputs[..., :top], keys[..., :0, :], values[..., :0, :], none, torch.zeros_like(prompt))
            slots = torch.arange(keys.shape[-2], device=dev)
            in_prompt = slots < prompt[..., None]  # (K|1, B, C)
        out = torch.zeros((k, b, steps), dtype=torch.int64, device=dev)
        ended = torch.zeros((k, b), dtype=torch.bool, device=dev)
        at = (prompt - 1).clamp(min=0).expand(k, b)  # each example's last prompt position
        last = logits.gather(2, at[..., None, None].expand(k, b, 1, logits.shape[-1])).squeeze(2)  # (K, B, V)
        for i in range(steps):
            last[..., banned] = float("-inf")
            tok = last.argmax(-1)  # (K, B)
            out[..., i] = tok
            ended |= tok == EOS
            if i + 1 == steps or (not oracle and bool(ended.all())):
                out = out[..., : i + 1]
                break
            # the token just chosen, at its own position prompt + i, into slot top + i
            assert keys is not None and values is not None
            visible = in_prompt | ((slots >= top) & (slots < top + i))
            logits, keys[..., top + i : top + i + 1, :], values[..., top + i : top + i + 1, :] = self.run_members(
                (tok + self.offset)[..., None], keys, values, visible, prompt + i)
            last = logits[..., 0, :]
        if oracle:
            return out, batch.tgt_len.expand(k, b)
        is_eos = out == EOS
        first_eos = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, out.shape[-1])
        return out, first_eos

    @staticmethod
    def _rows(tokens: torch.Tensor, lengths: torch.Tensor) -> list[Sequence[np.ndarray]]:
        t, n = tokens.cpu().numpy(), lengths.cpu().numpy()
        return [TokenRows(t[m], n[m]) for m in range(t.shape[0])]
