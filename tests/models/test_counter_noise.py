"""Counter-based dropout masks (``trainables/models/counter_noise.py``): the hash against its
Python-int reference, keep rates, one stream per member whatever the bundle, compaction,
state, and the same bits on CPU and CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from trainables.models.counter_noise import M32, CounterNoise, hash32, hash32_reference

SEEDS = [12345, 2**40 + 7, 99]


def test_hash_equals_its_python_int_reference() -> None:
    rng = np.random.default_rng(0)
    xs = [0, 1, M32, M32 - 1, 2**31, 2**31 - 1, *rng.integers(0, 2**32, 200, dtype=np.uint64).tolist()]
    got = hash32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [hash32_reference(int(x)) for x in xs]
    assert all(0 <= v <= M32 for v in got)
    assert len(set(got)) == len(set(xs))  # a bijection on 32 bits


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_masks_keep_one_minus_p_and_scale_by_its_inverse(p: float) -> None:
    noise = CounterNoise(SEEDS)
    m = noise.dropout_mask(p, (200, 500))  # (3, 200, 500)
    assert torch.unique(m).tolist() == [0.0, pytest.approx(1 / (1 - p))]
    for k in range(3):
        kept = int((m[k] > 0).sum())
        assert stats.binomtest(kept, m[k].numel(), 1 - p).pvalue > 1e-4, (k, kept)
    # neighbouring positions and members are not correlated
    a, b = (m[0] > 0).float().flatten(), (m[1] > 0).float().flatten()
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1])) < 0.02


def test_each_member_draws_its_own_stream_whatever_the_bundle() -> None:
    elements = torch.arange(5000).view(1, 50, 100)
    bundle = CounterNoise(SEEDS)
    first, second = bundle.multipliers(0.3, elements), bundle.multipliers(0.3, elements)
    assert first is not None and second is not None
    assert not torch.equal(first, second)  # the counter moved on
    for k, seed in enumerate(SEEDS):
        lone = CounterNoise([seed])
        assert torch.equal(lone.multipliers(0.3, elements)[0], first[k])  # type: ignore[index]
        assert torch.equal(lone.multipliers(0.3, elements)[0], second[k])  # type: ignore[index]
    # a member keyed by its own positions: per-member element keys (K, ...) work the same
    per_member = torch.stack([elements[0], elements[0].flip(0), elements[0] + 7])
    m = CounterNoise(SEEDS).multipliers(0.3, per_member)
    for k, seed in enumerate(SEEDS):
        lone_m = CounterNoise([seed]).multipliers(0.3, per_member[k : k + 1])
        assert torch.equal(m[k], lone_m[0])  # type: ignore[index]


def test_member_rates_and_rate_zero_draw_ones() -> None:
    noise = CounterNoise(SEEDS, rates=[0.0, 0.5, 0.2])
    m = noise.multipliers(0.9, torch.arange(100_000).view(1, -1))  # the model's p is replaced
    assert m is not None
    assert torch.equal(m[0], torch.ones(100_000))
    assert set(torch.unique(m[1]).tolist()) == {0.0, 2.0}
    assert stats.binomtest(int((m[2] > 0).sum()), 100_000, 0.8).pvalue > 1e-4
    assert CounterNoise(SEEDS, rates=[0.0, 0.0, 0.0]).multipliers(0.5, torch.arange(4).view(1, -1)) is None
    assert CounterNoise(SEEDS).multipliers(0.0, torch.arange(4).view(1, -1)) is None


def test_compaction_and_state_keep_each_members_stream() -> None:
    elements = torch.arange(1000).view(1, -1)
    ref = CounterNoise(SEEDS)
    ref.multipliers(0.4, elements)
    want = ref.multipliers(0.4, elements)
    noise = CounterNoise(SEEDS)
    noise.multipliers(0.4, elements)
    state = noise.state()
    noise.keep([0, 2])
    got = noise.multipliers(0.4, elements)
    assert got is not None and want is not None
    assert torch.equal(got, want[[0, 2]])
    resumed = CounterNoise(SEEDS)
    resumed.set_state(state)
    assert torch.equal(resumed.multipliers(0.4, elements), want)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cuda_graphs"):
        resumed.set_state([torch.zeros(5, dtype=torch.int64)])


@pytest.mark.cuda
def test_cuda_draws_the_same_bits_as_the_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    elements = torch.arange(300_000).view(1, 300, 1000)
    cpu = CounterNoise(SEEDS, rates=[0.1, 0.3, 0.0]).multipliers(0.5, elements)
    gpu = CounterNoise(SEEDS, "cuda", rates=[0.1, 0.3, 0.0]).multipliers(0.5, elements.cuda())
    assert cpu is not None and gpu is not None
    assert torch.equal(cpu, gpu.cpu())
