"""The venv the test command builds (tools/_venv.sh) is one a user can work in: one PIL (pillow-simd
where it was built, never Pillow over it), nothing installed that fails to import (torchvision,
Lightning, timm, matplotlib), and the README's Lightning example trains in it.

These look at the running interpreter's environment; the imports run in a fresh interpreter of it,
as a user's would, without the tests' own path (tests/helpers.py may add the test references).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (distribution, module): each, where installed, must import.
IMPORTED = [("torchvision", "torchvision"), ("lightning", "lightning"), ("timm", "timm"),
            ("matplotlib", "matplotlib")]

_IMPORT_EACH = """
import importlib, json, sys
from importlib.metadata import PackageNotFoundError, distribution
failed = {}
for dist, module in json.loads(sys.argv[1]):
    try:
        distribution(dist)
    except PackageNotFoundError:
        continue
    try:
        importlib.import_module(module)
    except Exception as e:
        failed[dist] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


def _installed(name: str) -> bool:
    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_pil_is_pillow_simd_alone() -> None:
    """Pillow beside pillow-simd (a dependency that requires `pillow`) overwrites its PIL package."""
    if not _installed("pillow-simd"):
        pytest.skip("pillow-simd is not installed here (no AVX2, or its build failed): Pillow is PIL")
    import PIL

    assert not _installed("pillow"), (
        f"Pillow {version('pillow')} is installed beside pillow-simd {version('pillow-simd')} and PIL "
        f"is {PIL.__version__}: a dependency pulled it in (tools/_venv.sh removes it and reinstalls "
        "pillow-simd)"
    )
    assert PIL.__version__ == version("pillow-simd")


def test_what_is_installed_imports() -> None:
    """No package that fails at import, as a torchvision built for another torch does (and with it
    Lightning and timm, which import it)."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(IMPORTED)], env=_user_env(), cwd=REPO,
        capture_output=True, text=True, timeout=100, check=True,
    )
    assert json.loads(proc.stdout) == {}


def test_the_lightning_example_trains(image_folder: Path, tmp_path: Path) -> None:
    """examples/lightning_datamodule.py, as the README shows it (2 CPU processes, DDP), briefly."""
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("Lightning is not installed (the `test` extra installs it)")
    example = REPO / "examples" / "lightning_datamodule.py"
    command = [sys.executable, str(example), "--data", str(image_folder), "--epochs", "1",
               "--batch-size", "8", "--workers", "1", "--check-shards"]
    with subprocess.Popen(
        command, cwd=tmp_path, env=_user_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=100)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"the Lightning example did not finish in 100 s:\n{out}")
    assert proc.returncode == 0, out
    for rank in range(2):  # 24 images, sharded over 2 ranks
        assert f"rank {rank}/2 epoch 0: 12 samples" in out, out
    # By sample ids across the ranks: each of the 24 on one rank (no padding: 12 a rank).
    assert "shards epoch 0: 24 samples over 2 ranks, each on one rank (0 repeated" in out, out
