"""A loader's `Position` on its own (`_loading.settings.position`): which epoch and batch the next
iteration runs, NOTE [drawn epochs], set_epoch, and where a checked state resumes. No workers: the
loader-level behaviour is held by test_state_dict.py and test_dropin.py; these pin the rules."""

from __future__ import annotations

from typing import Any

from fastload._loading.order.plan import BatchSampler, SamplerPlan, ShuffledPlan
from fastload._loading.settings.position import Position

PLAN = ShuffledPlan(10, 4, shuffle=True, drop_last=False, seed=0)  # 3 batches an epoch


def test_a_fresh_position_runs_epoch_0_from_its_start() -> None:
    position = Position()
    assert position.next_iteration(PLAN) == (0, 0)
    assert position.current == (0, 0)


def test_the_first_batch_drawn_puts_its_epoch_under_way() -> None:
    position = Position()
    position.started(0, 0)
    assert position.next_iteration(PLAN) == (0, 0)  # made, never drawn from: no epoch used up
    position.yielded(0, 1)
    assert position.current == (0, 1)
    assert position.next_iteration(PLAN) == (1, 0)
    position.yielded(0, 2)  # later batches of the same iteration change only the position
    assert position.next_iteration(PLAN) == (1, 0)


def test_set_epoch_during_an_iteration_wins_over_the_drawn_epoch() -> None:
    position = Position()
    position.started(0, 0)
    position.set_epoch(5, PLAN)
    position.yielded(0, 1)
    assert position.next_iteration(PLAN) == (5, 0)


def _state(epoch: int, yielded: int) -> dict[str, Any]:
    return {"version": 2, "epoch": epoch, "batches_yielded": yielded}


def test_a_resumed_position_starts_after_the_saved_batch_and_set_epoch_keeps_it() -> None:
    position = Position()
    position.resume(_state(3, 2), 2, False, PLAN)
    assert position.next_iteration(PLAN) == (3, 2)
    assert position.current == (3, 2)
    position.set_epoch(3, PLAN)  # the epoch being resumed: the position in it is kept
    assert position.next_iteration(PLAN) == (3, 2)
    position.set_epoch(4, PLAN)  # another epoch starts at its first batch
    assert position.next_iteration(PLAN) == (4, 0)


def test_a_state_at_an_epochs_end_resumes_at_the_next_epoch() -> None:
    for epoch_over, yielded in ((True, 3), (False, 3)):  # over as saved, or a full epoch here
        position = Position()
        position.resume(_state(3, yielded), yielded, epoch_over, PLAN)
        assert position.next_iteration(PLAN) == (4, 0)


class _EpochSampler:
    """A sampler holding an epoch, as DistributedSampler does."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        return iter(range(8))

    def __len__(self) -> int:
        return 8


def test_a_samplers_own_epoch_names_the_next_iteration_and_gets_set_epoch() -> None:
    sampler = _EpochSampler()
    plan = SamplerPlan(BatchSampler(sampler, 4, False))
    position = Position()
    position.resume(_state(2, 1), 1, False, plan)
    assert sampler.epoch == 2  # set to the epoch resumed
    assert position.next_iteration(plan) == (2, 1)
    sampler.set_epoch(7)  # set on the sampler itself: wins, from its first batch
    assert position.next_iteration(plan) == (7, 0)
    position.set_epoch(9, plan)
    assert sampler.epoch == 9
