"""CPU kernels a packager can trust (trainables/models/ckernels.py, kernel_calls.py): flags
overridable and keyed in the cache, a retry without -march=native, a portable build that
computes the same bits in every process (and as the native build), settings refused with
one clear error, checked kernel entries, one kernel choice per model recorded in its trials
row, and (marked ``sanitize``) the kernel tests under AddressSanitizer and UBSan."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from tests_support import TINY_STUDY

from analysis.db import connect
from trainables.errors import ConfigError
from trainables.models import ckernels
from trainables.models.ckernels import (
    CFLAGS_VAR,
    NATIVE_FLAGS,
    PORTABLE_VAR,
    REQUIRED_FLAGS,
    SWITCH,
    KernelCallError,
    cpu_kernels,
)
from trainables.runtime import cpu_model

ROOT = Path(__file__).resolve().parents[2]
KERNEL_VARS = (SWITCH, CFLAGS_VAR, PORTABLE_VAR, ckernels.CC_VAR, "CC", "LD_PRELOAD")


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_threads: None) -> Iterator[None]:
    """No kernel setting from outside, a private build cache, no cached lookup before or after."""
    for name in KERNEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FINELINE_CACHE", str(tmp_path / "cache"))
    cpu_kernels.cache_clear()
    yield
    cpu_kernels.cache_clear()


def kernels() -> ckernels.CpuKernels:
    kern = cpu_kernels()
    if kern is None:
        pytest.skip("no working C compiler: the fused kernels are unavailable")
    return kern


def built(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "kernels").glob("*.so"))


# --- flags, retry, portable builds ---------------------------------------------------------


def test_flags_override_is_honoured_and_keys_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = kernels()
    assert default.flags == (*ckernels.DEFAULT_FLAGS, *REQUIRED_FLAGS) and not default.portable
    monkeypatch.setenv(CFLAGS_VAR, "-O1 -fno-math-errno")
    cpu_kernels.cache_clear()
    custom = kernels()
    assert custom.flags == ("-O1", "-fno-math-errno", *REQUIRED_FLAGS) and custom.portable
    assert custom.path != default.path and built(tmp_path) == sorted([default.path, custom.path])
    assert custom.path.read_bytes() != default.path.read_bytes()  # really built with other flags
    cpu_kernels.cache_clear()
    stamp = custom.path.stat().st_mtime_ns
    assert kernels().path == custom.path and custom.path.stat().st_mtime_ns == stamp  # cached


def test_a_compiler_refusing_march_native_gets_a_portable_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real compiler behind a wrapper that refuses -march=native, as some compilers and
    targets do: one warning, then the library without it (cached under the portable name)."""
    kernels()
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("the wrapper needs gcc behind it")
    wrapper = tmp_path / "picky-cc"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        '  if [ "$a" = "-march=native" ]; then\n'
        "    echo \"picky-cc: error: unrecognized command-line option '-march=native'\" >&2; exit 1\n"
        "  fi\n"
        "done\n"
        f'exec {gcc} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv(ckernels.CC_VAR, str(wrapper))
    monkeypatch.setenv("FINELINE_CACHE", str(tmp_path / "picky"))
    cpu_kernels.cache_clear()
    with pytest.warns(RuntimeWarning, match="unrecognized command-line option '-march=native'"):
        kern = cpu_kernels()
    assert kern is not None and kern.portable and not set(kern.flags) & set(NATIVE_FLAGS)
    assert sorted((tmp_path / "picky" / "kernels").glob("*.so")) == [kern.path]
    x = torch.randn(5, 37)
    out = torch.empty(5, dtype=torch.int64)
    kern.argmax(x, out)
    assert torch.equal(out, x.argmax(-1))


def test_a_portable_build_is_named_the_same_on_every_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache name of a portable build leaves the CPU out; a native build's keeps it."""
    portable = ("-O3", *REQUIRED_FLAGS)
    native = ("-O3", "-march=native", *REQUIRED_FLAGS)
    here = (ckernels.library_path(portable, "cc 1"), ckernels.library_path(native, "cc 1"))
    monkeypatch.setattr(ckernels, "_cpu_signature", lambda: "x86_64 flags: fpu sse2 (another CPU)")
    there = (ckernels.library_path(portable, "cc 1"), ckernels.library_path(native, "cc 1"))
    assert here[0] == there[0] and here[1] != there[1]
    assert ckernels.library_path(portable, "cc 2") != here[0]  # another compiler: another build


PROBE = r"""
import json, sys
import numpy as np, torch
torch.set_num_threads(1)
from trainables.data import SeqPairs, Vocab
from trainables.models import ckernels
from trainables.models.base import MemberNoise
from trainables.models.seq2seq import Seq2Seq, Seq2SeqConfig
from trainables.models.seq2seq.logits import cross_entropy
from trainables.models.seq2seq.stepper import attend_one
from trainables.seeding import torch_generator

meta = {"src_vocab": Vocab.build([f"s{i}" for i in range(7)]),
        "tgt_vocab": Vocab.build([f"t{i}" for i in range(14)]), "max_src_len": 6,
        "max_tgt_len": 12, "decode_len": lambda n: 2 * np.asarray(n) + 1}
rng = np.random.default_rng(3)
src = [rng.integers(3, 10, rng.integers(1, 7)) for _ in range(40)]
tgt = [np.stack([2 * (s - 3) + 3, 2 * (s - 3) + 4], 1).ravel() for s in src]
data = SeqPairs(src=src, tgt=tgt, ids=np.arange(40))
m = Seq2Seq(Seq2SeqConfig(emb_size=12, hidden_size=20, init_range=0.5), meta, 2)
for i in range(2):
    m.init_member(i, torch_generator(7 + i))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
rows = [np.arange(0, 40, 2), np.arange(1, 40, 2)]
for step in range(3):  # the training kernels forward and backward
    opt.zero_grad()
    batch = m.make_batch(data, m.train_layout(data, rows), torch.device("cpu"))
    m.loss(batch, MemberNoise([11, 12]), "sum").sum().backward()
    opt.step()
out = {name: p.detach().clone() for name, p in m.named_parameters()}
with torch.no_grad():  # the decoder: teacher forcing and greedy decoding in one call
    values, preds = m.evaluate_batch(m.make_batch(data, rows, torch.device("cpu")))
out |= {f"eval_{k}": v for k, v in values.items()}
out["tokens"] = torch.tensor(np.concatenate([np.concatenate(list(p)) for p in preds]))
g = torch.Generator().manual_seed(5)
x = (torch.randn(30, 37, generator=g) * 4).requires_grad_()
target = torch.randint(0, 37, (30,), generator=g)
ce, hit = cross_entropy(x, target, -100, hits=True, kern=m.cpu_kernels)
ce.sum().backward()
out |= {"ce": ce.detach(), "ce_grad": x.grad, "hit": hit}
keys_t, q = torch.randn(9, 20, 16, generator=g), torch.randn(9, 20, generator=g)
out["attend"] = attend_one(keys_t, q, torch.zeros(9, 16), torch.randn(9, 11, 24, generator=g), m.cpu_kernels)
torch.save(out, sys.argv[1])
path = str(m.cpu_kernels.path) if m.cpu_kernels else ""
print(json.dumps({"kernels": m.kernels, "flags": m.kernel_flags, "path": path}))
"""


def probe(tmp_path: Path, name: str, **env: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Train and evaluate a small bundle (every kernel) in a fresh process with ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_VARS}
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / f"{name}.pt")], cwd=ROOT,
                         env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), torch.load(tmp_path / f"{name}.pt")


@pytest.mark.slow  # 15-20 s of subprocess study; CI's default run keeps under 15 minutes
def test_a_portable_build_computes_the_same_bits_as_the_native_build(
    tmp_path: Path,
) -> None:
    """What lets a seed give the same result on every node of a cluster of mixed CPUs: the
    portable library (no -march=native) is loaded when asked, and training and evaluating
    with it gives bitwise the same parameters, losses and tokens in two processes, and the
    same as the library tuned to this CPU: the kernels' vectors are 4 (baseline x86-64), 8
    (AVX2) or 16 (AVX-512) lanes wide by target (fmath.h), and no bit may follow the width.
    ~10 s; the slow test below adds an AVX2 build and a second process."""
    kernels()
    cache = str(tmp_path / "cache")
    info, first = probe(tmp_path, "portable1", FINELINE_CACHE=cache, FINELINE_PORTABLE_KERNELS="1")
    assert info["kernels"] == "c" and "-march=native" not in info["flags"].split()
    assert "-ffp-contract=off" in info["flags"].split()
    native_info, native = probe(tmp_path, "native", FINELINE_CACHE=cache)
    assert "-march=native" in native_info["flags"].split() and native_info["path"] != info["path"]
    assert first.keys() == native.keys() and len(first) >= 20
    for name, value in first.items():
        assert torch.equal(value, native[name]), name
    g = torch.Generator().manual_seed(5)  # the probe's cross-entropy case, as torch ops
    x = (torch.randn(30, 37, generator=g) * 4).requires_grad_()
    F.cross_entropy(x, torch.randint(0, 37, (30,), generator=g), reduction="sum").backward()
    assert x.grad is not None and torch.allclose(x.grad, first["ce_grad"], atol=1e-6)
    assert not torch.equal(x.grad, first["ce_grad"])  # other rounding: the comparison can fail


@pytest.mark.slow  # ~15 s: two builds and three processes
def test_the_portable_library_is_reused_and_an_avx2_build_computes_the_same_bits(tmp_path: Path) -> None:
    """A second process loads the same cached portable library and computes the same bits;
    so does an AVX2 build (vectors of 8 lanes), where the CPU has AVX2."""
    kernels()
    cache = str(tmp_path / "cache")
    info, first = probe(tmp_path, "portable1", FINELINE_CACHE=cache, FINELINE_PORTABLE_KERNELS="1")
    info2, again = probe(tmp_path, "portable2", FINELINE_CACHE=cache, FINELINE_PORTABLE_KERNELS="1")
    assert info2 == info  # the same cached library
    for name, value in first.items():
        assert torch.equal(value, again[name]), name
    if "avx2" not in Path("/proc/cpuinfo").read_text(errors="replace").split():
        pytest.skip("this CPU has no AVX2")
    avx2_info, avx2 = probe(tmp_path, "avx2", FINELINE_CACHE=cache, FINELINE_CFLAGS="-O3 -mavx2 -fno-math-errno")
    assert avx2_info["kernels"] == "c" and avx2_info["path"] != info["path"]
    for name, value in first.items():
        assert torch.equal(value, avx2[name]), name


# --- settings refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (CFLAGS_VAR, "-O3 -ffast-math", "-ffast-math"),
        (CFLAGS_VAR, "-Ofast", "-Ofast"),
        (CFLAGS_VAR, "-O2 -ffp-contract=fast", "-ffp-contract=fast"),
        (CFLAGS_VAR, "-O2 '-DX", "shell"),
        (CFLAGS_VAR, "-O1 -fsanitize=address", "LD_PRELOAD"),
        (SWITCH, "off", "0 or 1"),
        (PORTABLE_VAR, "yes", "0 or 1"),
    ],
)
def test_a_bad_setting_is_one_clear_error(name: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        cpu_kernels()
    assert info.value.field == name and says in str(info.value) and "Fix:" in str(info.value)
    with pytest.raises(ConfigError):
        ckernels.forwarded_env()


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_flags_the_compiler_refuses_are_refused_before_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker would warn and run torch ops (exit 0); the driver compiles an empty file with
    the flags first. -march=native is left out of that check: a build retries without it."""
    monkeypatch.setenv(CFLAGS_VAR, "-O2 --no-such-flag-here")
    with pytest.raises(ConfigError) as info:
        ckernels.forwarded_env()
    assert info.value.field == CFLAGS_VAR and "--no-such-flag-here" in str(info.value)
    monkeypatch.setenv(CFLAGS_VAR, "-O2 -march=native -fno-math-errno")
    assert ckernels.forwarded_env()[CFLAGS_VAR] == "-O2 -march=native -fno-math-errno"


def test_a_bad_setting_stops_study_run_before_ray_and_before_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from study.cli import cli_main

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY_STUDY))
    monkeypatch.setenv(CFLAGS_VAR, "-O3 -ffast-math")
    out = tmp_path / "results"
    code = cli_main(["run", str(tmp_path / "tiny.yaml"), "--out", str(out), "--num-cpus", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "FINELINE_CFLAGS" in err and "-ffast-math" in err
    assert not out.exists()


def test_the_driver_forwards_its_kernel_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from study.config import parse
    from study.runner import worker_env

    cfg = parse(TINY_STUDY)
    assert worker_env(cfg) is None
    monkeypatch.setenv(PORTABLE_VAR, "1")
    monkeypatch.setenv(CFLAGS_VAR, "-O2")
    monkeypatch.setenv(ckernels.CC_VAR, "/opt/cc")  # a node's compiler is its own
    assert worker_env(cfg) == {"env_vars": {PORTABLE_VAR: "1", CFLAGS_VAR: "-O2"}}


# --- checked entries -------------------------------------------------------------------------


def test_kernel_entries_refuse_wrong_tensors_before_the_c_code_runs() -> None:
    kern = kernels()
    x, out = torch.randn(6, 20), torch.full((6,), -1, dtype=torch.int64)
    cases: list[tuple[Any, str]] = [
        (lambda: kern.argmax(x.double(), out), "logits_argmax: rows must be a contiguous torch.float32"),
        (lambda: kern.argmax(x, out[:5]), r"out must be .* of shape \(6,\)"),
        (lambda: kern.argmax(x, out.int()), "out must be a contiguous torch.int64"),
        (lambda: kern.argmax(x.t().contiguous().t(), out), r"strides \(1, 6\)"),
        (lambda: kern.argmax(torch.empty(6, 20, device="meta"), out), "on meta"),
        (lambda: kern.argmax(x[0], out), "rows must be a 2-d tensor"),
    ]
    target = torch.tensor([0, 1, 19, 20, -100, 3])  # 20: one past the vocabulary
    ce = torch.full((6,), 7.0)
    cases += [
        (lambda: kern.ce(x, target, -100, ce, None), r"target holds 20, outside \[0, 20\) or -100"),
        (lambda: kern.softmax_ce(x, target.clamp(max=19), -100, ce, torch.empty(6, 19), torch.empty(6)), r"e must be .* \(6, 20\)"),
    ]
    k, t, b, h = 2, 3, 4, 5
    seq: list[Any] = [torch.zeros(k, t, b, h + 1), torch.zeros(k, h + 1, 4 * h), None, torch.zeros(k, h, 4 * h),
           torch.zeros(k, b, h), torch.zeros(k, b, h)]
    fwd: Any = kern.fwd_seq  # called with the arguments spread
    outs: list[Any] = [torch.zeros(k, t, b, 4 * h)] + [torch.zeros(k, t, b, h) for _ in range(3)]
    cases += [
        (lambda: fwd(*seq, (4, 4), *outs), r"active must hold 3 row counts in \[0, 4\]"),
        (lambda: fwd(*seq, (4, 5, 1), *outs), r"active must hold 3 row counts"),
        (lambda: fwd(*seq[:5], torch.zeros(k, b + 1, h), None, *outs), r"c0 must be .* \(2, 4, 5\)"),
        (lambda: kern.eval_step(torch.zeros(k, b, 4 * h), torch.zeros(k, h, b).transpose(1, 2),
                                torch.zeros(k, b, h), torch.zeros(k, b, h)), "c2_prev must be .* contiguous"),
    ]
    cases.append((lambda: kern.attend_one(torch.zeros(3, 8, 16), torch.zeros(3, 8), torch.zeros(3, 16),
                                          torch.zeros(3, 17, 4), torch.zeros(3, 4)), "17 source positions in 16"))
    for call, says in cases:
        with pytest.raises(KernelCallError, match=says):
            call()
    assert bool((out == -1).all()) and bool((ce == 7.0).all())  # nothing was written
    kern.argmax(x, out)  # the right tensors pass
    assert torch.equal(out, x.argmax(-1))


def test_decode_entry_checks_its_gold_tokens_and_its_groups_of_tensors() -> None:
    """The decoder indexes its token table with the gold inputs: one out of range is refused
    (only where it is read: before each row's gold length), as are half-given groups."""
    kern = kernels()
    k, n, hd, vt, vp, tg = 1, 2, 4, 5, 16, 3
    common: dict[str, Any] = {
        "steps": torch.zeros(k, n, dtype=torch.int32), "tokens": torch.zeros(k, n, 1, dtype=torch.int64),
        "bos": 1, "table": torch.zeros(k * vt, 4 * hd), "vocab": vt, "w_ih_t": None, "bias": None,
        "w_hh_t": torch.zeros(1, k, hd, 4 * hd), "h0": torch.zeros(1, k, n, hd),
        "c20": torch.zeros(1, k, n, hd), "keys_t": None, "mask": None, "enc": None,
        "comb_ctx_t": None, "comb_h_t": None, "out_t": torch.zeros(k, hd, vp),
        "out_b": torch.zeros(k, vp), "classes": vt,
    }
    gold_in = torch.tensor([[[1, 2, 9], [1, 3, 4]]])  # 9 lies past row 0's gold length 2
    forced: dict[str, Any] = {"glen": torch.tensor([[2, 3]], dtype=torch.int32), "gold_in": gold_in,
              "gold_out": torch.tensor([[[2, 0, -100], [3, 4, 0]]]),
              "ce": torch.zeros(k, n, tg), "hit": torch.zeros(k, n, tg, dtype=torch.bool)}
    kern.decode(**common, **forced)  # padding past a row's gold is never read
    assert forced["ce"][0, 0, :2].ne(0).all() and forced["ce"][0, 0, 2] == 0
    bad = {**forced, "glen": torch.tensor([[3, 3]], dtype=torch.int32)}
    with pytest.raises(KernelCallError, match=r"gold_in holds 9, outside \[0, 5\)"):
        kern.decode(**common, **bad)
    with pytest.raises(KernelCallError, match="teacher-forcing tensors"):
        kern.decode(**common, **{**forced, "hit": None})
    with pytest.raises(KernelCallError, match="attention tensors"):
        kern.decode(**{**common, "mask": torch.zeros(k * n, 16)})
    with pytest.raises(KernelCallError, match=r"steps holds 2, outside \[0, 2\)"):
        kern.decode(**{**common, "steps": torch.full((k, n), 2, dtype=torch.int32)})


# --- one choice per model ---------------------------------------------------------------------


def tiny_model(k: int = 2) -> Any:
    from trainables.data import Vocab
    from trainables.models.seq2seq import Seq2Seq, Seq2SeqConfig
    from trainables.seeding import torch_generator

    meta = {"src_vocab": Vocab.build(["a", "b", "c"]), "tgt_vocab": Vocab.build(["x", "y", "z"]),
            "max_src_len": 4, "max_tgt_len": 8}
    m = Seq2Seq(Seq2SeqConfig(emb_size=6, hidden_size=5, beam_width=2), meta, k)
    for i in range(k):
        m.init_member(i, torch_generator(40 + i))
    return m


def test_a_model_chooses_its_kernels_once_and_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chosen at construction: with the environment changed afterwards to a value any lookup
    would refuse, the model still trains, evaluates and beam-decodes, with its kernels (its
    loss is bitwise what it was), and a model built without them computes otherwise."""
    from trainables.data import SeqPairs
    from trainables.models.base import MemberNoise

    kernels()
    data = SeqPairs(src=[np.array([3, 4, 5]), np.array([5, 3])], tgt=[np.array([4, 3]), np.array([5])],
                    ids=np.arange(2))
    rows = [np.arange(2), np.arange(2)]
    fused = tiny_model()
    monkeypatch.setenv(SWITCH, "0")
    cpu_kernels.cache_clear()
    ops = tiny_model()
    assert (fused.kernels, ops.kernels) == ("c", "torch")
    assert "-ffp-contract=off" in fused.kernel_flags.split() and ops.kernel_flags == ""
    assert fused.to_impl("reference", 0).kernels == "torch"
    assert copy.deepcopy(fused).cpu_kernels is fused.cpu_kernels  # a copy shares the library
    assert pickle.loads(pickle.dumps(fused.cpu_kernels)).path == fused.cpu_kernels.path

    def run(m: Any) -> torch.Tensor:
        """The loss, every gradient and the evaluation losses, flat."""
        m.zero_grad(set_to_none=True)
        batch = m.make_batch(data, rows, torch.device("cpu"))
        loss = m.loss(batch, MemberNoise([1, 2]), "sum")
        loss.sum().backward()
        with torch.no_grad():
            values, _ = m.evaluate_batch(batch)
            m.predict(batch)  # beam search: the stepper's cell, attention and argmax
        grads = [p.grad.flatten() for p in m.parameters() if p.grad is not None]
        return torch.cat([loss.detach(), *grads, values["loss"].flatten()])

    before = run(fused)
    monkeypatch.setenv(SWITCH, "not-a-setting")  # a lookup now raises ConfigError
    cpu_kernels.cache_clear()
    assert torch.equal(run(fused), before)
    with pytest.raises(ConfigError):
        cpu_kernels()
    monkeypatch.setenv(SWITCH, "0")
    cpu_kernels.cache_clear()
    ops.load_state_dict(fused.state_dict())
    other = run(ops)
    assert torch.allclose(other, before, rtol=1e-5, atol=1e-6)
    assert not torch.equal(other, before)  # torch ops round otherwise: the check can fail


@pytest.mark.slow  # ~17 s: a study through the CLI (numerics without forwarded settings: test_cli_e2e)
def test_the_trials_row_records_the_kernels_of_a_study_run(tmp_path: Path) -> None:
    """Through the real CLI, with a portable build and MKL's compatible code path asked for
    on the driver: the trials rows say the unit computed with the C kernels and with which
    flags, and its numerics name the worker's CPU and the MKL setting the driver forwarded."""
    kernels()
    raw = {**TINY_STUDY, "seeds": {"count": 2, "root": 5}, "train": {**TINY_STUDY["train"], "max_epochs": 1}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(raw))
    out = tmp_path / "results"
    keep = ("HOME", "PYTHONPATH", "VIRTUAL_ENV", "LANG")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "FINELINE_CACHE": str(tmp_path / "cache"), PORTABLE_VAR: "1", "MKL_CBWR": "COMPATIBLE"}
    res = subprocess.run([sys.executable, "-m", "study.cli", "run", str(tmp_path / "tiny.yaml"),
                          "--out", str(out), "--num-cpus", "1"], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    con = connect(out)
    try:
        rows = con.execute("SELECT kernels, kernel_flags, device, numerics FROM trials").fetchall()
    finally:
        con.close()
    assert rows and all(r[0] == "c" and r[2] == "cpu" for r in rows)
    flags = rows[0][1].split()
    assert "-ffp-contract=off" in flags and not set(flags) & set(NATIVE_FLAGS)
    parts = rows[0][3].split("; ")
    assert parts[0] == cpu_model() and parts[1] == f"torch {torch.backends.cpu.get_cpu_capability()}"
    assert parts[-1] == "1 thread"  # one CPU per trial
    if torch.backends.mkl.is_available():
        assert "MKL_CBWR COMPATIBLE" in parts  # forwarded from the driver to the worker


# --- sanitizers ------------------------------------------------------------------------------

SANITIZE_FLAGS = "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"


def sanitizer_env(tmp_path: Path) -> dict[str, str]:
    """A process that loads an ASan/UBSan build of the kernels: the ASan runtime first (and
    libstdc++ with it, which ASan's ``__cxa_throw`` interceptor needs when python itself does
    not link it), leaks not reported (the interpreter's are not ours), any error fatal."""
    libs = []
    for name in ("libasan.so", "libstdc++.so.6"):
        found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(found):
            pytest.skip(f"gcc has no {name}: cannot build with -fsanitize=address")
        libs.append(found)
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_VARS}
    return {**base, "FINELINE_CACHE": str(tmp_path / "asan-cache"), CFLAGS_VAR: SANITIZE_FLAGS,
            "LD_PRELOAD": " ".join(libs),
            "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


@pytest.mark.sanitize
def test_the_kernel_tests_pass_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path: Path) -> None:
    """The kernels built with ``-fsanitize=address,undefined`` run the kernel tests and the
    seq2seq tests that use them (the decoder, the evaluation cell) without a report; an
    out-of-bounds read through a raw (unchecked) entry is reported: the check can fail."""
    kernels()
    env = sanitizer_env(tmp_path)
    overrun = (
        "import torch\nfrom trainables.models.ckernels import cpu_kernels\n"
        "k = cpu_kernels(); x = torch.randn(2, 16); out = torch.empty(4, dtype=torch.int64)\n"
        "k._argmax(4, 16, x.data_ptr(), out.data_ptr())  # 4 rows of a 2-row tensor\n"
    )
    bad = subprocess.run([sys.executable, "-c", overrun], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode != 0 and "heap-buffer-overflow" in bad.stderr, bad.stderr[-3000:]
    tests = ["tests/models/test_ckernels.py", "tests/models/test_logits_kernels.py",
             "tests/models/test_seq2seq.py"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
         "-m", "not slow and not cuda and not sanitize",
         "-k", "fused or not (torch_ops or seq2seq)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    report = res.stdout[-4000:] + res.stderr[-4000:]
    assert res.returncode == 0, report
    assert "Sanitizer" not in res.stderr and "runtime error" not in res.stderr, report
    assert "no working C compiler" not in res.stdout and " passed" in res.stdout, report
    assert len(list((tmp_path / "asan-cache" / "kernels").glob("*.so"))) == 1  # the sanitized build ran
