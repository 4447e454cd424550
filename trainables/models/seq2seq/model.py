"""The seq2seq model family: LSTM encoder-decoder with Luong attention, bundled over seeds.

Architecture (Luong et al. 2015, "general" score; as in Weber et al. 2018):

* encoder: ``nn.LSTM`` over source embeddings (optionally bidirectional, several layers,
  source optionally reversed); each source's final state is taken at its own last
  position;
* decoder: ``nn.LSTM`` initialised from the encoder's final (h, c) per layer, input the
  target embedding with teacher forcing (``BOS y_1 .. y_n``, predicting ``y_1 .. y_n EOS``).
  By default **no input feeding**: the attentional state is not fed back into the decoder,
  so the decoder runs over all steps first and attention is one batched matmul afterwards.
  With ``input_feeding`` layer 0 reads ``[emb(y_{t-1}); h~_{t-1}]`` (Luong et al. 2015,
  sec. 3.3), one step at a time (both implementations; the fast one bundles it,
  :mod:`feeding`);
* attention ``bilinear``: ``score_s = h_dec^T W_a h_enc_s`` (masked beyond the source
  length), ``context = softmax(score) . h_enc``, ``h~ = tanh(W_c [context; h_dec])`` (no
  bias in W_a or W_c; ``attention_activation: none`` leaves out the ``tanh``, as TensorFlow
  1's ``AttentionWrapper`` does); attention ``none``: ``h~ = h_dec``;
* dropout on h~ and (``embedding_dropout``) on the source and target embeddings; ``logits = W_out h~ + b``, over
  every target id, or with ``output_classes: targets`` over EOS and the task's symbols only
  (``<pad>`` and ``<s>``, never targets, are left out of the softmax, as in Li et al.'s
  code, whose output layer has EOS plus the 6 SCAN actions).
* bidirectional encoder: each layer's outputs and final states are the concatenation of
  both directions, and the decoder has ``2 * hidden_size`` units, so it starts from that
  concatenation with no extra projection (SCAN: BiLSTM 32 per direction, decoder 64).
  With ``layers > 1`` decoder layer l starts from encoder layer l; attention reads the
  top layer; there is no dropout between layers.

Implementations (``impl``): ``fast`` (all K members in one batched computation with a
hand-written LSTM, see :mod:`fast`) and ``reference`` (plain eager ``nn``
modules, K = 1, see :mod:`reference`). Both read the same stacked parameters
(layout: :mod:`layout`), draw the same dropout masks and compute the same
numbers; :meth:`Seq2Seq.to_reference` turns a bundle member into a reference model.
Both have ``input_feeding``; the fast one steps all K members' decoders together
(:mod:`feeding`), so a study with it trains bundles of seeds like any other.

Initialisation (``init``): ``uniform`` draws every parameter from U(-init_range,
init_range); ``tf`` is Li et al.'s TensorFlow 1 code (:mod:`init`).

Meta keys read: ``src_vocab``, ``tgt_vocab`` (:class:`Vocab`), ``max_src_len``,
``max_tgt_len`` and ``decode_len`` (src lengths -> greedy steps; default: ``max_tgt_len
+ 1`` for every example). Predictions: one int64 array per example of exactly
``decode_len(len(src))`` generated target ids (so it includes the EOS position): greedy
decoding, or beam search when ``beam_width > 1`` (:mod:`decode`).

Loss reductions (the trainer's ``loss_reduction``): ``sum`` over every target token incl.
EOS, ``token_mean``, ``step_mean_sum`` (per-step mean over the batch, summed over
steps), ``sum_per_sequence`` (the sum divided by the number of sequences: Sutskever et
al.'s ``sum / batch``, OpenNMT-py's default normalisation); which one a paper study uses,
and what was measured, is said in its config (e.g. ``configs/weber2018.yaml``); see
:data:`REDUCTIONS`. Dropout masks follow the protocol in :mod:`layout`.

No fused step: the trainer's generic step (autograd around the hand-written LSTM's
manual backward, a torch optimizer) is used, so :meth:`Seq2Seq.make_fused_step` returns
None. Throughput and what was tried: ``benchmarks/seq2seq_kernels.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from trainables.configbase import FrozenConfig, added_field
from trainables.data import EOS, SplitData, TokenRows
from trainables.errors import ConfigError
from trainables.models.base import MemberNoise, Model
from trainables.models.ckernels import CpuKernels, choice_name, cpu_kernels
from trainables.models.seq2seq.decode import decode
from trainables.models.seq2seq.fast import FastEngine
from trainables.models.seq2seq.init import init_tf
from trainables.models.seq2seq.layout import (
    IGNORE,
    Arch,
    Engine,
    Seq2SeqBatch,
    build_modules,
    collate,
    longest_first,
    param_layout,
)
from trainables.models.seq2seq.reference import ReferenceEngine
from trainables.registry import MODELS
from trainables.runtime import to_device


class Seq2SeqConfig(FrozenConfig):
    """Seq2seq model config (defaults: the Weber et al. 2018 symbol-rewriting model)."""

    emb_size: int = Field(32, ge=1)
    """Embedding size of source and target tokens (of source tokens only when
    ``tgt_emb_size`` is set)."""
    tgt_emb_size: int | None = added_field(None, ge=1)
    """Embedding size of target tokens (the decoder's input); None: ``emb_size``. Li et al.'s
    SCAN code embeds actions in 8 dimensions (its ``--output_embedding_size`` default)."""
    hidden_size: int = Field(32, ge=1)
    """LSTM units of the encoder per direction (the decoder has this times the directions)."""
    layers: int = Field(1, ge=1)
    """Stacked LSTM layers in the encoder and in the decoder."""
    cell: Literal["lstm"] = "lstm"
    """Recurrent cell; only ``lstm`` is implemented."""
    bidirectional: bool = False
    """Bidirectional encoder; the decoder then starts from both directions' final states
    concatenated and has ``2 * hidden_size`` units."""
    reverse_source: bool = False
    """Feed each source sequence reversed (Sutskever et al. 2014)."""
    attention: Literal["bilinear", "none"] = "bilinear"
    """``bilinear``: Luong's general score ``h_dec^T W_a h_enc`` with ``tanh(W_c [context;
    h_dec])``; ``none``: the decoder state goes straight to the output layer."""
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    """Dropout probability on the output layer's input h~ (fed back too, with input feeding)
    and, unless ``embedding_dropout`` is false, on the source and target embeddings."""
    init_range: float = Field(0.1, gt=0.0)
    """Every parameter is initialised from U(-init_range, init_range) (``init: uniform``;
    unused with ``init: tf``)."""
    init: Literal["uniform", "tf"] = added_field("uniform")
    """``uniform``: every parameter from U(-init_range, init_range) (OpenNMT-py's
    ``param_init``, Weber et al.); ``tf``: Li et al.'s TensorFlow 1 code, embeddings
    U(-1, 1), Glorot-uniform kernels (an LSTM's input and recurrent weights as TF's one
    kernel), zero biases, LSTM forget-gate bias 1 (see :mod:`trainables.models.seq2seq.init`)."""
    embedding_dropout: bool = added_field(True)
    """Drop out the source and target embeddings as well (at ``dropout``). OpenNMT-py 0.x
    (2018) does not: it drops out only h~ and the input between stacked LSTM layers (none
    with one layer); its embeddings get dropout only with ``-position_encoding``
    (``onmt/modules/Embeddings.py``, ``onmt/Models.py`` at 0ecec8b)."""
    input_feeding: bool = added_field(False)
    """Feed the attentional state back into the decoder (Luong et al. 2015, sec. 3.3):
    layer 0's input at step t is ``[emb(y_{t-1}); h~_{t-1}]``, ``h~_0 = 0``. On by default
    in the toolkits of 2018: OpenNMT-py (``-input_feed 1``: "Feed the context vector at
    each time step as additional input") and TensorFlow's ``AttentionWrapper``
    (``cell_input_fn`` defaults to ``concat([inputs, attention], -1)``), which Li et al.'s
    SCAN code uses. Needs ``attention: bilinear``. Both implementations have it; the fast
    one runs a bundle's decoders one step at a time together (:mod:`feeding`)."""
    attention_activation: Literal["tanh", "none"] = added_field("tanh")
    """The attentional state's activation: ``tanh``: ``h~ = tanh(W_c [context; h_dec])``
    (Luong et al. 2015, eq. 5; OpenNMT-py); ``none``: ``h~ = W_c [context; h_dec]``, a linear
    layer without bias: TensorFlow 1's ``AttentionWrapper`` with ``attention_layer_size``
    (its attention layer is ``Dense(attention_layer_size, use_bias=False)``, no activation),
    which Li et al.'s SCAN code uses. Both implementations have both; ``none`` needs
    ``attention: bilinear``."""
    output_classes: Literal["all", "targets"] = added_field("all")
    """The output layer's classes (its softmax, the loss, greedy and beam decoding): ``all``:
    every target vocabulary id; ``targets``: only those a target can hold, EOS and the
    task's symbols, leaving out ``<pad>`` and ``<s>`` (ids 0 and 1), which otherwise share
    the softmax's mass and can win an argmax (then decoding emits them). Li et al.'s SCAN
    code has 7 classes, its EOS/padding id 0 and the 6 actions (``tf.layers.dense(...,
    self.U)``, s2s_model.py l. 201; ``U = len(act) + 1``, main.py l. 64); under ``init: tf``
    the output kernel's Glorot bound then uses that fan-out. Both implementations have it."""
    impl: Literal["fast", "reference"] = "fast"
    """``fast``: batched bundle implementation; ``reference``: plain eager ``nn`` modules,
    one seed per model (the baseline the fast path is tested against)."""
    compile: bool = False
    """Reserved; must stay false. ``torch.compile`` of the LSTM step, of whole sequences and
    of fixed chunks of steps was measured and none paid on a CPU core (findings in
    ``trainables/models/seq2seq/cells.py``), so there is no compiled path."""
    beam_width: int = Field(1, ge=1)
    """Beam width for predictions; 1 = greedy decoding."""
    teacher_forced_exact: bool = False
    """Also score ``tf_exact``: an example counts when, fed the gold prefix (teacher forcing),
    the argmax at every target position incl. EOS is the gold token (Li et al.'s original
    metric; greedy-decoding exact match is the task's own metric), and ``tf_token``: the
    fraction of an example's target positions (incl. EOS) whose argmax is right."""

    @model_validator(mode="after")
    def _input_feeding_is_possible(self) -> Seq2SeqConfig:
        if self.input_feeding and self.attention == "none":
            raise ValueError(
                "input_feeding: feeds the attentional state back, but attention is none. Fix: "
                "set attention: bilinear, or input_feeding: false"
            )
        if self.attention_activation != "tanh" and self.attention == "none":
            raise ValueError(
                "attention_activation: there is no attentional state without attention "
                "(attention is none). Fix: set attention: bilinear, or leave "
                "attention_activation unset (tanh)"
            )
        return self

    @model_validator(mode="after")
    def _no_compiled_path(self) -> Seq2SeqConfig:
        if self.compile:
            raise ValueError(
                "compile: seq2seq has no compiled path (torch.compile measured slower than "
                "the eager fast path; see trainables/models/seq2seq/cells.py). Fix: set "
                "compile: false"
            )
        return self


def _per_example(values: torch.Tensor, batch: Seq2SeqBatch, dense: bool | None = None) -> torch.Tensor:
    """Per-token values (K, N) summed over each example's tokens -> (K, B).

    On CUDA ``index_add_`` adds with atomics, in an order that changes from run to run (so
    would the last bits of an evaluation's loss): there each token goes to its own slot of
    a dense (K, B, T) grid (list padding to a slot past it), which is then summed over T
    (``dense``: that way or not; None: on CUDA)."""
    k, b = batch.src_len.shape
    if values.is_cuda if dense is None else dense:
        t = batch.tgt_in.shape[2]
        trash = k * b * t
        slot = torch.where(batch.tok_target != IGNORE, batch.tok_pos, trash).view(-1)
        grid = values.new_zeros(trash + 1).index_put_((slot,), values.reshape(-1))
        return grid[:trash].view(k, b, t).sum(2)
    out = values.new_zeros(k * b).index_add_(0, batch.tok_example.view(-1), values.view(-1))
    return out.view(k, b)


# --- loss reductions: (token CE (K, N), batch) -> (K,) -----------------------------------


def reduce_sum(ce: torch.Tensor, batch: Seq2SeqBatch) -> torch.Tensor:
    """Summed over every target token (incl. EOS) of the member's batch (the paper's loss)."""
    return ce.sum(1)


def reduce_token_mean(ce: torch.Tensor, batch: Seq2SeqBatch) -> torch.Tensor:
    """Averaged over the member's target tokens (incl. EOS)."""
    return ce.sum(1) / batch.n_tokens


def reduce_step_mean_sum(ce: torch.Tensor, batch: Seq2SeqBatch) -> torch.Tensor:
    """Per decoder step, the mean over the examples that have a token there; summed over steps."""
    return (ce * batch.tok_step_weight).sum(1)


def reduce_sum_per_sequence(ce: torch.Tensor, batch: Seq2SeqBatch) -> torch.Tensor:
    """The summed loss divided by the member's number of sequences (``sum / batch``): what
    Sutskever et al. (2014) and OpenNMT-py's default normalisation compute."""
    return ce.sum(1) / batch.src_len.shape[1]


REDUCTIONS: dict[str, Callable[[torch.Tensor, Seq2SeqBatch], torch.Tensor]] = {
    "sum": reduce_sum,
    "token_mean": reduce_token_mean,
    "step_mean_sum": reduce_step_mean_sum,
    "sum_per_sequence": reduce_sum_per_sequence,
}


def _arch(cfg: Seq2SeqConfig, meta: dict[str, Any]) -> Arch:
    missing = [
        key for key in ("src_vocab", "tgt_vocab", "max_src_len", "max_tgt_len") if key not in meta
    ]
    if missing:
        raise ConfigError(
            "model.name",
            f"seq2seq needs task meta keys {missing}, which this task does not provide",
            "pair seq2seq with a task of data kind 'seq2seq' (e.g. symbol_rewriting, scan)",
        )
    return Arch(
        src_vocab=len(meta["src_vocab"]),
        tgt_vocab=len(meta["tgt_vocab"]),
        emb=cfg.emb_size,
        hidden=cfg.hidden_size,
        directions=2 if cfg.bidirectional else 1,
        layers=cfg.layers,
        attention=cfg.attention == "bilinear",
        dropout=cfg.dropout,
        max_src_len=int(meta["max_src_len"]),
        max_tgt_len=int(meta["max_tgt_len"]),
        tgt_emb=cfg.tgt_emb_size or 0,
        input_feeding=cfg.input_feeding,
        embedding_dropout=cfg.embedding_dropout,
        attention_tanh=cfg.attention_activation == "tanh",
        out_offset=EOS if cfg.output_classes == "targets" else 0,
    )


@MODELS.register
class Seq2Seq(Model):
    """K seq2seq replicas with stacked parameters (see the module docstring)."""

    name: ClassVar[str] = "seq2seq"
    Config: ClassVar[type[FrozenConfig]] = Seq2SeqConfig
    data_kind = "seq2seq"
    reductions: ClassVar[tuple[str, ...]] = tuple(REDUCTIONS)
    tiny: ClassVar[dict[str, Any]] = {"emb_size": 32, "hidden_size": 32}
    """The contract test's config: the paper sizes. Smaller models under the summed loss
    and SGD lr 0.125 move ~20% per clipped step, a chaotic regime where float rounding
    (bundle vs lone) outgrows 1e-5 within 200 steps."""
    cpu_bundle_cap: ClassVar[int | None] = 8
    """One CPU thread trains about 4.6k seed-samples/s at K=1, 6.0k at K=4 and 6.3k at K=16
    (``benchmarks/seq2seq_kernels.py``): beyond ~8 a bundle gains nothing per thread and
    waits longer for its slowest member under early stopping."""
    eval_rows: ClassVar[int | None] = 2048
    """Greedy decoding and teacher-forced losses of a K=8 bundle on one CPU thread ran about
    1.6x faster with 256 examples per batch (2,048 rows) than with 1,024 (8,192 rows, whose
    logits and gate buffers leave the cache); 128 and 256 were alike. A lone run keeps 1,024
    (``benchmarks/seq2seq_kernels.py`` decodes both ways)."""

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        assert isinstance(config, Seq2SeqConfig)
        self.cfg = config
        if config.impl == "reference" and k != 1:
            raise ConfigError(
                "model.impl",
                f"the reference implementation runs one seed per model, got a bundle of {k}",
                "use impl: fast for bundles, or a bundle size of 1",
            )
        self.arch = _arch(config, meta)
        self.decode_len: Callable[[np.ndarray], np.ndarray] = meta.get(
            "decode_len", lambda lengths: np.full(len(lengths), self.arch.max_tgt_len + 1)
        )
        for name, (_, _, shape) in param_layout(build_modules(self.arch)).items():
            self.register_parameter(name, nn.Parameter(torch.empty(k, *shape)))
        self.cpu_kernels: CpuKernels | None = cpu_kernels() if config.impl == "fast" else None
        """The compiled CPU kernels, looked up once here (:mod:`ckernels`: the environment and
        the build decide) and used by every computation of this model; None: torch ops."""
        self.engine: Engine
        if config.impl == "reference":
            self.engine = ReferenceEngine(self.arch)
        else:
            self.engine = FastEngine(self.arch, self.cpu_kernels)

    @property
    def kernels(self) -> str:
        """``c`` where this model computes with the compiled CPU kernels (on a CPU, float32),
        else ``torch``; recorded in its trials row."""
        return choice_name(self.cpu_kernels, next(self.parameters()))

    @property
    def kernel_flags(self) -> str:
        """The compiler flags of the kernels it computes with ("" for torch ops); recorded
        in its trials row."""
        return " ".join(self.cpu_kernels.flags) if self.cpu_kernels and self.kernels == "c" else ""

    # ------------------------------------------------------------------ parameters
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """``init: uniform``: U(-init_range, init_range) for every parameter; ``tf``:
        :func:`init_tf`. Parameters in registration order, drawn on the CPU."""
        if self.cfg.init == "tf":
            init_tf(self, member, generator)
            return
        r = self.cfg.init_range
        with torch.no_grad():
            for p in self.parameters():
                draw = torch.empty(p.shape[1:]).uniform_(-r, r, generator=generator)
                p[member].copy_(draw)

    def to_reference(self, member: int) -> Seq2Seq:
        """A K = 1 ``impl: reference`` model holding member ``member``'s weights."""
        return self.to_impl("reference", member)

    def to_impl(self, impl: Literal["fast", "reference"], member: int) -> Seq2Seq:
        """A K = 1 model of implementation ``impl`` holding member ``member``'s weights."""
        cfg = self.cfg.model_copy(update={"impl": impl, "compile": False})
        other = Seq2Seq(cfg, self.meta, 1)
        other.load_member_state(0, self.member_state(member))
        return other.to(next(self.parameters()).device)

    def reference_modules(self, member: int) -> nn.ModuleDict:
        """Member ``member`` as plain torch modules (``nn.LSTM`` etc.) on the CPU, for export,
        in the model's dtype (a float64 model's weights are not rounded to float32). With
        ``output_classes: targets`` the ``out`` layer's class j is target id ``EOS + j``."""
        dtype = next(self.parameters()).dtype
        mods = build_modules(self.arch, "meta").to_empty(device="cpu").to(dtype)
        with torch.no_grad():
            for name, (module, pname, _) in param_layout(mods).items():
                mods[module].get_parameter(pname).copy_(getattr(self, name)[member])
        for m in mods.values():
            if isinstance(m, nn.LSTM):
                m.flatten_parameters()
        return mods

    def make_fused_step(self, train_cfg: Any) -> None:
        """No fused step: the trainer's generic step is used (see the module docstring)."""
        return None

    # ------------------------------------------------------------------ batches and losses
    def make_batch(
        self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device
    ) -> Seq2SeqBatch:
        assert len(rows) == self.k, f"expected rows for {self.k} members, got {len(rows)}"
        return collate(data, rows, device, self.cfg.reverse_source, self.decode_len)

    def graph_batch(self, data: SplitData, rows: Sequence[np.ndarray], device: torch.device) -> Seq2SeqBatch | None:
        """The fast implementation's batch padded to length and token buckets
        (``collate(..., buckets=True)``), without the generator-noise positions (positional
        noise does not read them) and without ``active`` rows (the torch ops compute every
        row), with the decoding steps on the device (a captured evaluation reads them there).
        None for ``impl: reference`` (a Python loop over its member)."""
        if self.cfg.impl != "fast":
            return None
        batch = collate(data, rows, device, self.cfg.reverse_source, self.decode_len, buckets=True)
        none = torch.zeros(0, dtype=torch.int64, device=device)
        return dataclasses.replace(
            batch, src_counts=(), tgt_counts=(), src_tm_pos=none, tgt_tm_pos=none, tok_list_pos=none,
            src_active=(), tgt_active=(), decode_steps_t=to_device(torch.from_numpy(batch.decode_steps), device),
        )

    def train_layout(self, data: SplitData, rows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each member's rows by decreasing target length (stable): the sequences that end
        first are then the last rows, which the fast LSTM stops computing once they have
        ended (:attr:`Seq2SeqBatch.tgt_active`), about a fifth of its work here."""
        return longest_first(data, rows)

    def _params(self) -> dict[str, torch.Tensor]:
        return dict(self.named_parameters())

    def loss(self, batch: Any, noise: MemberNoise | None, reduction: str) -> torch.Tensor:
        if reduction not in REDUCTIONS:
            raise ConfigError(
                "train.loss_reduction",
                f"seq2seq has no loss reduction {reduction!r}",
                f"use one of: {', '.join(REDUCTIONS)}",
            )
        ce = self.engine.token_ce(self._params(), batch, noise)  # (K, N)
        return REDUCTIONS[reduction](ce, batch)

    def example_losses(self, batch: Any) -> torch.Tensor:
        """Summed cross-entropy per example (K, B), without dropout."""
        return _per_example(self.engine.token_ce(self._params(), batch, None), batch)

    @classmethod
    def metric_names(cls, config: FrozenConfig) -> tuple[str, ...]:
        """``loss``, and ``tf_exact`` and ``tf_token`` with ``teacher_forced_exact``."""
        extra = ("tf_exact", "tf_token") if getattr(config, "teacher_forced_exact", False) else ()
        return ("loss", *extra)

    def example_metrics(self, batch: Any) -> dict[str, torch.Tensor]:
        """``loss`` per example and, with ``teacher_forced_exact``, ``tf_exact`` (0/1) and
        ``tf_token`` (fraction of right target positions), from one teacher-forced pass."""
        hits = self.cfg.teacher_forced_exact
        ce, hit = self.engine.token_outputs(self._params(), batch, None, hits=hits)  # (K, N)
        return self._metrics(ce, hit, batch)

    @torch.no_grad()
    def predict(self, batch: Any) -> list[Sequence[np.ndarray]]:
        """K :class:`TokenRows` of B int64 rows: greedy (or beam) decoding for each example's
        decode_len."""
        width = self.cfg.beam_width
        stepper = self.engine.start_decode(self._params(), batch, width)
        return self._rows(decode(stepper, batch.steps(), width, batch.max_steps), batch)

    @torch.no_grad()
    def evaluate_batch(self, batch: Any) -> tuple[dict[str, torch.Tensor], list[Sequence[Any]]]:
        """:meth:`example_metrics` and :meth:`predict` from one encoding of the batch."""
        return self.eval_from_tensors(self.eval_tensors(batch), batch)

    captures_evaluation: ClassVar[bool] = True

    def eval_tensors(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """Per-token losses (K, N), decoded tokens (K, B, max steps) and, with
        ``teacher_forced_exact``, per-token hits (K, N): :meth:`evaluate_batch` before its
        per-example sums and host rows."""
        ce, hit, tokens = self.engine.evaluate(self._params(), batch, self.cfg.teacher_forced_exact, self.cfg.beam_width)
        return (ce, tokens) if hit is None else (ce, tokens, hit)

    def eval_from_tensors(
        self, outputs: tuple[torch.Tensor, ...], batch: Any
    ) -> tuple[dict[str, torch.Tensor], list[Sequence[Any]]]:
        ce, tokens, *hit = outputs
        return self._metrics(ce, hit[0] if hit else None, batch), self._rows(tokens, batch)

    def graph_key(self, batch: Any) -> tuple[Any, ...]:
        """The decoding length (the most steps of any example), which a graph bakes in."""
        return (batch.max_steps,)

    def _metrics(
        self, ce: torch.Tensor, hit: torch.Tensor | None, batch: Seq2SeqBatch
    ) -> dict[str, torch.Tensor]:
        """Per-example values (K, B) from per-token losses and hits (K, N) (see
        :meth:`example_metrics`)."""
        if hit is None:
            return {"loss": _per_example(ce, batch)}
        real = batch.tok_target != IGNORE  # token-list padding is no token
        wrong = _per_example((~hit & real).to(ce.dtype), batch)
        tokens = _per_example(real.to(ce.dtype), batch)
        return {
            "loss": _per_example(ce, batch),
            "tf_exact": (wrong == 0).to(ce.dtype),
            "tf_token": 1.0 - wrong / tokens,
        }

    def _rows(self, tokens: torch.Tensor, batch: Seq2SeqBatch) -> list[Sequence[np.ndarray]]:
        """Decoded tokens (K, B, max steps) as K :class:`TokenRows`, each row cut to its steps."""
        out = tokens.cpu().numpy()
        return [TokenRows(out[k], batch.decode_steps[k]) for k in range(self.k)]
