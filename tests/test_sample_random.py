"""Per-sample random numbers (`_sample_random`): a sample's draws depend on (seed, epoch,
index) alone, whatever else is in its task, and look uniform."""

from __future__ import annotations

import numpy as np

from fastload._sample_random import DRAWS, SampleRandom, sample_randoms, sample_uniforms


def test_a_samples_draws_do_not_depend_on_its_task() -> None:
    alone = sample_uniforms(7, 3, np.array([41]))
    in_a_batch = sample_uniforms(7, 3, np.array([5, 41, 2**40]))
    assert np.array_equal(alone[0], in_a_batch[1])


def test_seed_epoch_and_index_each_change_the_draws() -> None:
    base = sample_uniforms(7, 3, np.array([41]))[0]
    for other in (
        sample_uniforms(8, 3, np.array([41])),
        sample_uniforms(7, 4, np.array([41])),
        sample_uniforms(7, 3, np.array([42])),
    ):
        assert not np.any(other[0] == base)


def test_the_draws_look_uniform_and_independent() -> None:
    u = sample_uniforms(0, 0, np.arange(20_000)).ravel()  # deterministic: no flakiness
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.005
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert counts.min() > 0.98 * len(u) / 10


def test_generator_methods_and_a_long_chain() -> None:
    (r,) = sample_randoms(1, 2, np.array([9]))
    values = [r.integers(3, 6) for _ in range(DRAWS)]
    assert set(values) == {3, 4, 5}
    # Past the precomputed draws it goes on, deterministically.
    (again,) = sample_randoms(1, 2, np.array([9]))
    for _ in range(DRAWS):
        again.random()
    more = [r.uniform(2.0, 4.0) for _ in range(5)]
    assert all(2.0 <= v < 4.0 for v in more)
    assert more == [again.uniform(2.0, 4.0) for _ in range(5)]
    assert isinstance(r, SampleRandom)
