"""The tuner, visible: its state and changes in the statistics block, iostat's tuner column and
words, the verdict's advice for a tuned loader, the Prometheus series, ScalarLogger and the summary.

Blocks are written by hand with a `StatsWriter`, as a tuner would (`tuning`, `tuner_changed`);
a real loader only shows that every loader's block holds its ring's slots.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import RESIZE
from helpers import loader_series

from fastload import FastLoader
from fastload._diagnostics.iostat import Sampler, format_report, tuner_cell
from fastload._diagnostics.loader_rates import LoaderRates, MachineRates, loader_rates
from fastload._diagnostics.scalars import ScalarLogger
from fastload._diagnostics.verdict import classify
from fastload._loading.running.stats import LoaderStats, StatsWriter, format_summary
from fastload._loading.tuning.decisions import REASON_CHANGES, REASON_WORDS, Reason, reason_tag

IDLE = MachineRates(
    cpu={"user": 5.0, "system": 1.0, "iowait": 0.0, "idle": 94.0}, disk=None, device="tmpfs",
    device_kind="memory", page_cache_bytes=0, shm_used_bytes=0, shm_total_bytes=1, gpu_percent=None,
)
NOW = 2_000_000_000.0  # the report's clock, unix seconds


@pytest.fixture
def writer() -> Iterator[StatsWriter]:
    """A loader's block that started with 2 workers, as a pipeline makes it (its ring: 6 slots)."""
    w = StatsWriter("/data/train", "local", "cpu", num_workers=2, batch_size=8)
    try:
        w.ring_sized(6)
        yield w
    finally:
        w.close()


def decode_bound(before: LoaderStats, workers: int) -> LoaderRates:
    """One second after `before` in which `workers` workers decoded flat out and the trainer waited."""
    after = dataclasses.replace(
        before, updated=before.updated + 1.0, batches=before.batches + 10, samples=before.samples + 80,
        read_s=before.read_s + 0.1, read_cpu_s=before.read_cpu_s + 0.1,
        decode_s=before.decode_s + 0.95 * workers - 0.1, trainer_wait_s=before.trainer_wait_s + 0.6,
        next_calls=before.next_calls + 10,
    )
    return loader_rates("block", before, after, 1.0)


def tuned_once(w: StatsWriter) -> LoaderStats:
    """The tuner started at 2 workers and 6 in flight, then added a worker (decode-bound)."""
    w.tuning(2, 6, 6)
    w.tuning(3, 6, 8)
    w.tuner_changed(Reason.DECODE_BOUND, REASON_WORDS[Reason.DECODE_BOUND])
    return w.snapshot()


# --- the block ---------------------------------------------------------------------------------


def test_an_untuned_block_says_so_and_holds_its_ring(writer: StatsWriter) -> None:
    s = writer.snapshot()
    assert not s.is_tuned
    assert (s.tuner_workers, s.tuner_in_flight, s.tuned, s.tuner_changes) == (0, 0, 0, 0)
    assert s.tuner_changed == 0.0
    assert s.ring_slots == 6


def test_the_tuners_state_and_changes_are_counted(writer: StatsWriter) -> None:
    writer.tuning(2, 6, 6)
    start = writer.snapshot()
    assert start.is_tuned and start.tuned == 3 and start.tuner_changes == 0 and start.tuner_reason == 0
    writer.tuning(3, 10, 12)
    writer.tuner_changed(Reason.DECODE_BOUND)
    writer.tuner_changed(Reason.BURSTY)
    s = writer.snapshot()
    assert (s.tuner_workers, s.tuner_in_flight, s.ring_slots) == (3, 10, 12)
    assert s.tuner_changes == 2 and s.tuner_reason == Reason.BURSTY
    assert start.created <= s.tuner_changed and s.tuner_changed > 0  # unix seconds, like `updated`
    assert s.num_workers == 2  # the header keeps the count the loader started with


def test_a_loader_not_tuned_counts_its_rings_slots(image_folder: Path) -> None:
    with FastLoader(image_folder, batch_size=4, transform=RESIZE, num_workers=0, autotune=False) as loader:
        next(iter(loader))
        s = loader.stats()
        assert s is not None and not s.is_tuned
        assert s.ring_slots > 0


def test_every_reason_is_worded_and_moves_something_known() -> None:
    for reason in Reason:
        assert REASON_WORDS[reason].strip(), reason
        assert REASON_CHANGES[reason] in {"", "+w", "-w", "+f", "-f", "undo"}, reason
        assert reason_tag(reason) and " " not in reason_tag(reason)
    assert [r for r in Reason if not REASON_CHANGES[r]] == [Reason.NONE]


# --- iostat ------------------------------------------------------------------------------------


def test_iostat_shows_no_tuner_column_when_no_loader_is_tuned(writer: StatsWriter) -> None:
    r = classify_into(decode_bound(writer.snapshot(), 2), cores=4)
    report = format_report([r], IDLE, extended=False, now=NOW)
    head = report.splitlines()[2]
    assert head.split() == ["pid", "mode", "samples/s", "rMB/s", "busy%", "queue", "wait%", "verdict"]
    assert "tuner" not in report
    assert "raise num_workers to 4" in report  # an untuned loader's advice, as before


def test_iostat_shows_the_tuner_column_for_a_tuned_loader_beside_an_untuned_one(writer: StatsWriter) -> None:
    untuned = decode_bound(writer.snapshot(), 2)
    tuned_stats = tuned_once(writer)
    tuned = classify_into(decode_bound(tuned_stats, 3), cores=4)
    assert tuned.workers == 3 and tuned.tuner is not None and tuned.ring_slots == 8
    report = format_report([untuned, tuned], IDLE, extended=False, now=tuned_stats.tuner_changed + 4.2)
    lines = report.splitlines()
    assert lines[2].split()[-2:] == ["tuner", "verdict"]
    assert tuner_cell(tuned, tuned_stats.tuner_changed + 4.2) == "w3 f6 +w 4s decode-bound"
    assert "w3 f6 +w 4s decode-bound" in lines[4]
    assert lines[3].split()[7] == "-"  # the untuned loader's cell
    detail = "tuner (workers and batches in flight tuned): 3 workers, 6 batches in flight, a ring of 8 slots"
    assert f"- {detail}; 1 change, the last 4s ago: {REASON_WORDS[Reason.DECODE_BOUND]}" in report


def test_the_column_before_any_change_and_its_ages(writer: StatsWriter) -> None:
    writer.tuning(2, 6, 6)
    r = decode_bound(writer.snapshot(), 2)
    assert tuner_cell(r, NOW) == "w2 f6"
    assert "no change yet" in format_report([r], IDLE, extended=False, now=NOW)
    writer.tuner_changed(Reason.TRAINER_BOUND)
    changed = writer.snapshot().tuner_changed
    r = decode_bound(writer.snapshot(), 2)
    for age, shown in ((0.3, "0s"), (59.9, "59s"), (61, "1m"), (7300, "2h"), (2 * 86400 + 5, "2d")):
        assert tuner_cell(r, changed + age) == f"w2 f6 -w {shown} trainer-bound"


def test_a_reason_this_version_does_not_know_is_shown_by_its_code(writer: StatsWriter) -> None:
    writer.tuning(2, 6, 6)
    writer.tuner_changed(99)
    t = decode_bound(writer.snapshot(), 2).tuner
    assert t is not None and (t.reason, t.reason_words, t.change) == ("reason-99", "reason code 99", "?")


def test_iostat_json_carries_the_tuner(writer: StatsWriter) -> None:
    tuned_once(writer)
    mine = writer.segment.name
    loaders, _ = Sampler().sample()
    [r] = [r for r in loaders if r.name == mine]
    record = json.loads(json.dumps(dataclasses.asdict(r)))
    assert record["ring_slots"] == 8 and record["workers"] == 3
    tuner = record["tuner"]
    assert (tuner["workers"], tuner["in_flight"], tuner["changes"], tuner["change"]) == (3, 6, 1, "+w")
    assert tuner["reason"] == "decode-bound" and tuner["reason_words"] == REASON_WORDS[Reason.DECODE_BOUND]
    assert tuner["tunes_workers"] and tuner["tunes_in_flight"] and tuner["last_change"] > 0


# --- the verdict -------------------------------------------------------------------------------


def classify_into(r: LoaderRates, cores: int) -> LoaderRates:
    verdict, advice = classify(r, IDLE, cores)
    return dataclasses.replace(r, verdict=verdict, advice=advice)


def test_a_tuned_decode_bound_loader_is_told_what_the_tuner_holds_not_to_set_num_workers(
    writer: StatsWriter,
) -> None:
    r = classify_into(decode_bound(tuned_once(writer), 3), cores=4)
    assert r.verdict == "decode-bound"
    advice = " ".join(r.advice)
    assert "num_workers to" not in advice and "raise" not in advice
    assert "the tuner holds num_workers at 3" in advice
    assert REASON_WORDS[Reason.DECODE_BOUND] in advice


def test_a_tuned_augment_bound_loader_on_cuda_is_not_told_to_add_workers(writer: StatsWriter) -> None:
    before = dataclasses.replace(tuned_once(writer), device="cuda")
    after = dataclasses.replace(
        before, updated=before.updated + 1.0, batches=10, samples=80, read_s=0.1, read_cpu_s=0.1,
        decode_s=0.8, augment_s=2.0, trainer_wait_s=0.6, next_calls=10,
    )
    r = classify_into(loader_rates("block", before, after, 1.0), cores=4)
    assert r.verdict == "augment-bound"
    assert "more workers" not in r.advice[0] and "the tuner holds num_workers at 3" in r.advice[0]


def test_a_loader_whose_workers_are_not_tuned_is_still_told_to_set_them(writer: StatsWriter) -> None:
    writer.tuning(2, 6, 6, tunes_workers=False)  # an IterableDataset's streams: only the window is tuned
    r = classify_into(decode_bound(writer.snapshot(), 2), cores=4)
    assert "raise num_workers to 4" in " ".join(r.advice)


def test_a_tuned_window_is_not_advice_to_raise_prefetch(writer: StatsWriter) -> None:
    writer.tuning(2, 4, 6)
    writer.tuner_changed(Reason.WINDOW_UNUSED)
    before = writer.snapshot()
    after = dataclasses.replace(  # workers idle, trainer waiting: transport-bound
        before, updated=before.updated + 1.0, batches=10, samples=80, read_s=0.1, read_cpu_s=0.1,
        decode_s=0.3, trainer_wait_s=0.5, next_calls=10,
    )
    r = classify_into(loader_rates("block", before, after, 1.0), cores=4)
    assert r.verdict == "transport-bound"
    advice = " ".join(r.advice)
    assert "raise prefetch" not in advice
    assert "the tuner holds the batches in flight at 4" in advice
    assert REASON_WORDS[Reason.WINDOW_UNUSED] in advice
    before, after = (dataclasses.replace(s, tuner_workers=0) for s in (before, after))
    untuned = classify_into(loader_rates("block", before, after, 1.0), cores=4)
    assert "raise prefetch" in " ".join(untuned.advice)


# --- metrics, scalars, summary -----------------------------------------------------------------


def scrape(stats: LoaderStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The loader's series, keyed by name and the labels besides rank and loader."""
    return {
        (name, tuple((k, v) for k, v in labels if k not in ("rank", "loader"))): value
        for (name, labels), value in loader_series(stats).items()
    }


def test_the_tuner_is_exported_as_metrics(writer: StatsWriter) -> None:
    stats = tuned_once(writer)
    series = scrape(stats)
    assert series[("fastload_tuner_workers", ())] == 3
    assert series[("fastload_tuner_in_flight", ())] == 6
    assert series[("fastload_ring_slots", ())] == 8
    assert series[("fastload_tuner_changes_total", ())] == 1
    assert series[("fastload_tuner_last_change_timestamp_seconds", ())] == pytest.approx(stats.tuner_changed)
    reasons = {dict(k[1])["reason"]: v for k, v in series.items() if k[0] == "fastload_tuner_reason"}
    assert reasons == {reason_tag(r): float(r == Reason.DECODE_BOUND) for r in Reason}


def test_an_untuned_loader_exports_its_ring_and_no_tuner(writer: StatsWriter) -> None:
    series = scrape(writer.snapshot())
    assert series[("fastload_ring_slots", ())] == 6
    assert not [name for name, _ in series if name.startswith("fastload_tuner")]


class _Loader:
    """What ScalarLogger reads of a loader: its `stats()`."""

    def __init__(self, writer: StatsWriter) -> None:
        self.writer = writer

    def stats(self) -> LoaderStats:
        return self.writer.snapshot()


class _Logger:
    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars[tag] = value


def test_scalar_logger_writes_the_tuners_figures_when_tuned(writer: StatsWriter) -> None:
    logger = _Logger()
    scalars = ScalarLogger(_Loader(writer), logger)
    assert not [tag for tag in scalars.log(0) if "tuner" in tag]  # not tuned: as before
    tuned_once(writer)
    figures = scalars.log(1)
    assert {k: v for k, v in figures.items() if "tuner" in k} == {
        "fastload/tuner/workers": 3.0, "fastload/tuner/in_flight": 6.0, "fastload/tuner/ring_slots": 8.0,
        "fastload/tuner/changes": 1.0, "fastload/tuner/reason": float(Reason.DECODE_BOUND),
    }
    assert logger.scalars["fastload/tuner/workers"] == 3.0
    assert scalars.log(2)["fastload/tuner/changes"] == 0.0  # since the previous call


def test_the_summary_has_a_tuner_line_only_when_tuned(writer: StatsWriter) -> None:
    assert "tuner" not in format_summary(writer.snapshot())
    stats = tuned_once(writer)
    line = format_summary(stats, writer.last_change).splitlines()[-1]
    ended = "tuner: ended at 3 workers (started at 2) and 6 batches in flight, a ring of 8 slots"
    assert line.startswith(ended)
    assert line.endswith(f"1 change, the last 0 s before the end: {REASON_WORDS[Reason.DECODE_BOUND]}")
    assert format_summary(stats).splitlines()[-1].endswith("reason 1")  # no words given: its code


def test_the_plot_draws_the_workers_a_tuner_ran(writer: StatsWriter, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fastload._diagnostics.plot import plot_history, tuned_loaders

    untuned = dataclasses.asdict(decode_bound(writer.snapshot(), 2))
    tuned = dataclasses.asdict(decode_bound(tuned_once(writer), 3))
    history = [
        {"time": float(t), "cpu": {"user": 50.0}, "loaders": [
            {**untuned, "name": "pid 1 a"}, *([{**tuned, "name": "pid 2 b"}] if t else []),
        ]}
        for t in range(3)
    ]
    assert tuned_loaders(history) == ["pid 2 b"]
    plot_history(history, str(tmp_path / "run.png"))
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_a_loader_not_tuned_prints_its_summary_without_a_tuner_line(
    image_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, num_workers=0, autotune=False, summary=True
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == 24
    err = capsys.readouterr().err
    assert "fastload summary:" in err and "tuner" not in err
