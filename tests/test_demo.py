"""The demo (`fastload demo`): its comparison says when it timed too little to mean anything."""

from __future__ import annotations

import io
from pathlib import Path

from fastload._demo import MIN_TIMED_BATCHES, run_demo, too_few


def test_a_short_comparison_says_it_is_too_short(image_folder: Path) -> None:
    out = io.StringIO()
    results = run_demo(image_folder, epochs=1, workers=0, batch_size=4, images=0, baseline=True, out=out)
    text = out.getvalue()
    assert results["fastload"] > 0 and results["dataloader"] > 0
    assert "vs torch DataLoader" in text and "too little to mean much" in text, text


def test_the_threshold() -> None:
    assert too_few(MIN_TIMED_BATCHES - 1, 60.0) and too_few(1000, 0.5)
    assert not too_few(MIN_TIMED_BATCHES, 2.0)
