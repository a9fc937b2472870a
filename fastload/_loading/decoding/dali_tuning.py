"""`DaliTuning`: the shape of the in-trainer executor's DALI pipeline (NOTE [GPU decode tuning]).

No DALI import here: the executor reads its tuning before it knows it will build a pipeline.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

from fastload._errors import ConfigError

# NOTE [GPU decode tuning]: the in-trainer executor's pipeline (DALI's `mixed` decoder) has the
# shape of a `DaliTuning`; `tools/bench/bench_gpu_decode.py` measures the shapes on a GPU machine in
# one run (`FASTLOAD_DALI_TUNING` sets them) and the defaults follow its table (docs/BENCHMARKS.md,
# "DALI's shapes", one H100, DALI 2.4, 2026-11-26, medians of 3 rounds): the clip box decoded as a
# region (image_slice) with every image given to the hardware JPEG engines (hw_decoder_load=1)
# was the fastest shape in every round, 12.3k img/s [11.6-12.5k] with 2.5 trainer cores; whole
# images + `fn.slice` 11.8k [10.1-11.8k]; DALI's own share 7.9-9.0k with 5.6 cores (one round);
# the hardware decoder off 2.4k; unpipelined with a queue of one 4.9k, so DALI's pipelined
# executor two batches deep stays (three deep and more threads bought nothing). The issue's
# suspicion that a region decode keeps nvJPEG off the hardware engines did not hold on DALI 2.4.
# The CPU workers always decode regions (libjpeg's region decode skips what a crop leaves out),
# one batch at a time.


@dataclasses.dataclass(frozen=True)
class DaliTuning:
    """How the in-trainer DALI pipeline is built (NOTE [GPU decode tuning])."""

    region: bool = True  # decode the clip box only (image_slice), else whole images + fn.slice
    hw_decoder_load: float | None = 1.0  # the share for the hardware decoder; None: DALI's default
    queue_depth: int = 2  # DALI's prefetch_queue_depth: runs scheduled ahead of the collected one
    pipelined: bool = True  # DALI's exec_pipelined: a batch's stages overlap the next one's
    threads: int | None = None  # DALI's CPU threads; None: the executor's

    _KEYS: ClassVar[dict[str, str]] = {  # each setting's type
        "region": "bool", "hw_decoder_load": "float", "queue_depth": "int", "pipelined": "bool",
        "threads": "int",
    }

    @classmethod
    def from_environment(cls) -> DaliTuning:
        """From FASTLOAD_DALI_TUNING, e.g. "region=0,hw_decoder_load=0.9,queue_depth=3" (a benchmark's
        aid: tools/bench/bench_gpu_decode.py); the defaults where it is unset."""
        return cls.parse(os.environ.get("FASTLOAD_DALI_TUNING", ""))

    @classmethod
    def parse(cls, text: str) -> DaliTuning:
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = (part.strip() for part in item.partition("="))
            kind = cls._KEYS.get(key)
            try:
                if kind is None:
                    raise ValueError(f"no setting {key!r}")
                convert = float if kind == "float" else int
                parsed: Any = bool(int(value)) if kind == "bool" else convert(value)
                if kind != "bool" and parsed < (0 if key == "hw_decoder_load" else 1):
                    raise ValueError(f"{key} must be positive")
            except ValueError as e:
                raise ConfigError(
                    f"FASTLOAD_DALI_TUNING={text!r}: {e}; it takes {', '.join(cls._KEYS)} as key=value, "
                    "comma-separated"
                ) from None
            values[key] = parsed
        return cls(**values)
