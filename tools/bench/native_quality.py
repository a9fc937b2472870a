"""Print how closely the native JPEG decoder (fastload._jpeg) matches Pillow, per image kind and filter.

The images, boxes and references are those of tests/test_native_decode.py, which asserts the
bounds (>= 30 dB PSNR, >= 40 dB at DCT scale 1/1, no worse than Pillow's draft() at the same
scale); this prints the figures behind them. For every kind of JPEG (4:2:0, 4:2:2, 4:4:4, gray,
CMYK, YCCK, progressive, restart markers, ...), every box of the test (whole images, tiny,
fractional, edge and RandomResizedCrop-like crops) and both flips, the native output is compared
with Pillow's full decode + `resize(box=...)`:

  minPSNR  the worst case          pooled  PSNR of the mean MSE over all cases
  draft    the worst case of Pillow's draft() + resize over the DCT-scaled cases
  MAD      mean absolute difference per sample (mean and worst case)
  exact    bit-identical outputs   scales  how many cases used each DCT scale

Needs the extension built and the test extra (pytest), as tools/test.sh installs them:

    .venv/bin/python tools/bench/native_quality.py
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parents[2] / "tests"
FILTERS = (("bilinear", 2), ("bicubic", 3), ("nearest", 0))


def load_cases() -> ModuleType:
    """tests/test_native_decode.py, whose images, boxes and references this report uses."""
    try:
        importlib.import_module("fastload._jpeg")
    except ImportError as e:
        sys.exit(f"fastload._jpeg is not built ({e}); run: pip install -e .")
    sys.path.insert(0, str(TESTS))
    return importlib.import_module("test_native_decode")


def compare(cases: ModuleType, kind: str, filt: int) -> list[dict[str, Any]]:
    """One row per (box, flip) of the test's cases for `kind`: scale used, PSNR, MSE, MAD."""
    data, rgb = cases.sample(kind)
    rows = []
    for box, out_w, out_h in cases.boxes(*rgb.size, seed=len(kind)):
        for flip in (False, True):
            got, denom = cases.native(data, box, out_w, out_h, flip, filt)
            ref = cases.reference(rgb, box, out_w, out_h, flip, filt)
            draft = cases.pillow_draft(data, box, out_w, out_h, flip, filt, denom) if denom > 1 else ref
            rows.append(
                {
                    "denom": denom,
                    "psnr": cases.psnr(got, ref),
                    "mse": float(np.mean((got.astype(np.float64) - ref.astype(np.float64)) ** 2)),
                    "mad": float(np.mean(np.abs(got.astype(np.int16) - ref.astype(np.int16)))),
                    "draft_psnr": cases.psnr(draft, ref),
                }
            )
    return rows


def psnr_of(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cases = load_cases()
    print("PSNR and MAD of the native decoder against Pillow's full decode + resize(box=...);")
    print("'draft' is Pillow's own draft() path at the same DCT scale, for comparison.")
    print(
        f"{'kind':20s} {'filter':8s} {'cases':>5s} {'minPSNR':>8s} {'pooled':>7s} {'draft':>7s} "
        f"{'meanMAD':>8s} {'maxMAD':>7s} {'exact':>5s}  scales"
    )
    for filt_name, filt in FILTERS:
        for kind in cases.KINDS:
            rows = compare(cases, kind, filt)
            pooled = psnr_of(float(np.mean([r["mse"] for r in rows])))
            scaled = [r for r in rows if r["denom"] > 1]
            draft_min = min((r["draft_psnr"] for r in scaled), default=math.inf)
            exact = sum(1 for r in rows if r["mse"] == 0)
            mads = [r["mad"] for r in rows]
            scales: dict[int, int] = {}
            for r in rows:
                scales[r["denom"]] = scales.get(r["denom"], 0) + 1
            print(
                f"{kind:20s} {filt_name:8s} {len(rows):5d} {min(r['psnr'] for r in rows):8.2f} "
                f"{pooled:7.2f} {draft_min:7.2f} {np.mean(mads):8.3f} {max(mads):7.3f} {exact:5d}  "
                + " ".join(f"1/{d}:{n}" for d, n in sorted(scales.items()))
            )
    print("minPSNR: worst case; pooled: PSNR of the mean MSE over all cases; draft: worst case of")
    print("Pillow draft() + resize over the DCT-scaled cases; exact: bit-identical outputs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
