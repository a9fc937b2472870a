"""fastload.ScalarLogger: a loader's per-epoch figures as scalars, in TensorBoard's event file
(examples/tensorboard_scalars.py, run as a user runs it) and in a Lightning logger."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import RESIZE

import fastload
from fastload import FastLoader
from fastload._diagnostics.metrics import STAGES, VERDICTS

REPO = Path(__file__).resolve().parent.parent


def test_the_tensorboard_example_writes_the_loader_scalars(image_folder: Path, tmp_path: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logdir = tmp_path / "runs"
    command = [sys.executable, str(REPO / "examples" / "tensorboard_scalars.py"), "--data", str(image_folder),
               "--logdir", str(logdir), "--epochs", "2", "--batch-size", "8", "--workers", "1"]
    out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    events = accumulator.EventAccumulator(str(logdir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"train/loss", "fastload/img_per_s", "fastload/trainer_wait_share", "fastload/failures",
                "fastload/skipped", "fastload/verdict", *(f"fastload/share/{s}" for s in STAGES)}
    assert expected <= tags, expected - tags
    for tag in expected:
        assert [e.step for e in events.Scalars(tag)] == [0, 1], tag
    assert all(e.value > 0 for e in events.Scalars("fastload/img_per_s"))
    for step in (0, 1):
        shares = sum(events.Scalars(f"fastload/share/{s}")[step].value for s in STAGES)
        assert shares == pytest.approx(1.0, abs=1e-5)
        assert 0 <= events.Scalars("fastload/trainer_wait_share")[step].value <= 1
        assert events.Scalars("fastload/verdict")[step].value in range(len(VERDICTS))


def test_a_lightning_logger_gets_each_epochs_figures(image_folder: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("Lightning is not installed (the `test` extra installs it)")
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="run", version=0)
    with FastLoader(image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=1) as loader:
        scalars = fastload.ScalarLogger(loader, logger)
        assert scalars.log(0) == {}  # nothing before the first batch
        written = []
        for epoch in range(2):
            assert sum(len(labels) for _, labels in loader) == 24
            written.append(scalars.log(epoch))
    logger.save()
    with open(tmp_path / "run" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1]
    for row, figures in zip(rows, written, strict=True):
        assert figures["fastload/img_per_s"] > 0
        assert float(row["fastload/img_per_s"]) == pytest.approx(figures["fastload/img_per_s"])
        assert float(row["fastload/failures"]) == 0


def test_a_logger_without_a_scalar_method_is_refused(image_folder: Path) -> None:
    with FastLoader(image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=0) as loader, \
            pytest.raises(TypeError, match="neither add_scalar"):
        fastload.ScalarLogger(loader, object())
