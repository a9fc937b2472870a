"""The demo (`fastload demo`): its default run times enough to mean something (whole epochs after
a warm-up, the median of several), it says when a run chosen smaller times too little, and its
output in a log is plain lines (NOTE [demo timing], NOTE [progress lines])."""

from __future__ import annotations

import io
from pathlib import Path

from fastload.__main__ import _build_parser
from fastload._demo import MIN_TIMED_BATCHES, WARMUP_EPOCHS, run_demo, too_few


def test_a_short_comparison_says_it_is_too_short(image_folder: Path) -> None:
    out = io.StringIO()
    results = run_demo(image_folder, epochs=1, workers=0, batch_size=4, images=0, baseline=True, out=out)
    text = out.getvalue()
    assert results["fastload"] > 0 and results["dataloader"] > 0
    assert "vs torch DataLoader" in text and "too short to compare" in text, text


def test_the_output_in_a_log_is_whole_lines_of_whole_epochs(image_folder: Path) -> None:
    out = io.StringIO()  # not a terminal: no \r redraws
    run_demo(image_folder, epochs=3, workers=0, batch_size=4, images=0, baseline=False, out=out)
    text = out.getvalue()
    assert "\r" not in text, text
    epochs = [line for line in text.splitlines() if line.startswith("fastload epoch ")]
    warmups = [line for line in text.splitlines() if line.startswith("fastload warm-up ")]
    assert len(epochs) == 3 and len(warmups) == WARMUP_EPOCHS, text
    assert "the median of 3 whole epochs" in text, text


def test_the_default_run_times_enough_to_compare() -> None:
    """The first figure a newcomer sees: several timed epochs, each of enough batches (the old
    default timed 7 batches of 2 epochs and said itself that this meant little)."""
    args = _build_parser().parse_args(["demo"])
    assert args.epochs >= 3 and not args.no_baseline
    assert args.images // args.batch_size >= 2 * MIN_TIMED_BATCHES


def test_the_threshold() -> None:
    assert too_few(MIN_TIMED_BATCHES - 1, 60.0) and too_few(1000, 0.1)
    assert not too_few(MIN_TIMED_BATCHES, 2.0)
