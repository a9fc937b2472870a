"""Which executor runs a pipeline's batch tasks: a daemon session's pool, the in-process DALI
executor (`spec.decodes_in_trainer`: GPU decoding in this process), the local worker pool
(`Engine`), or this thread (`InlineExecutor`, num_workers=0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._loading.jobs.contract import Job
from fastload._loading.jobs.executor import Executor, RemoteExecutor
from fastload._loading.running.engine import Engine
from fastload._loading.running.inline import InlineExecutor
from fastload._loading.settings.spec import LoaderSpec
from fastload._loading.slots.ring import Ring


class RingSlots:
    """A slot's memory by name, once the ring exists (for the inline executor). It holds the
    ring, never the pipeline: see NOTE [no reference back] in `pipeline`."""

    ring: Ring | None = None

    def buffer(self, name: str) -> Any:
        if self.ring is None:
            raise RuntimeError(f"slot {name} was named before the ring was made")
        return self.ring.buffer(name)


def make_executor(
    job: Job | None, spec: LoaderSpec, session: RemoteExecutor | None, slot_buffer: Callable[[str], Any]
) -> Executor:
    """The executor for `job` as `spec` says (or the daemon `session`, given one); `slot_buffer`
    finds a slot's memory by name for tasks run on this thread."""
    if session is not None:
        return session
    if job is None:
        raise ValueError("a pipeline needs a job or a daemon session")
    if spec.decodes_in_trainer:
        return dali_executor(job, spec)
    if spec.num_workers > 0:
        return Engine(
            {0: job},
            num_workers=spec.num_workers,
            mp_context=spec.mp_context,
            worker_init_fn=spec.worker_init_fn,
            hang_timeout_s=spec.hang_timeout_s,
        )
    return InlineExecutor(job, slot_buffer)


def dali_executor(job: Job, spec: LoaderSpec) -> Executor:
    """The in-process GPU-decoding executor for a source's image job (`spec.decodes_in_trainer`)."""
    from fastload._loading.decoding.nvjpeg_decoder import NVJPEG_READ_THREADS
    from fastload._loading.jobs.image_job import ImageJob
    from fastload._loading.running.dali_executor import DaliExecutor
    from fastload._native_jpeg import built_native_jpeg

    if not isinstance(job, ImageJob) or spec.transforms is None or spec.images is None:
        raise ValueError("the DALI executor runs sources of encoded images only")
    threads = max(1, spec.num_workers)
    if spec.backend == "nvjpeg":
        threads = min(threads, NVJPEG_READ_THREADS)
    return DaliExecutor(
        job.index, spec.transforms, spec.seed, spec.slot_batch_size, spec.images, spec.device,
        threads=threads, pin_memory=spec.pin_memory, jpeg=built_native_jpeg(), decoder=spec.backend,
    )
