"""`num_workers=0`: batch tasks run in the trainer's own process, one per poll, behind the
engine's interface (`InlineExecutor`), so the pipeline above is the same code either way."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from fastload._loading.jobs.contract import Job, run_task
from fastload._loading.jobs.executor import Event, Task
from fastload._loading.slots.layout import BatchLayout


class InlineExecutor:
    """Runs tasks in the caller's process (num_workers=0), one per `poll`, with the Engine's interface."""

    def __init__(self, job: Job, slot_buffer: Callable[[str], Any]) -> None:
        """`slot_buffer(name)`: the memory of the ring slot `name` (the trainer's own ring)."""
        self._job = job
        self._slot_buffer = slot_buffer
        self._layout: BatchLayout | None = job.layout
        self._queue: deque[Task] = deque()

    @property
    def worker_pids(self) -> list[int]:
        return []

    def set_layout(self, layout: BatchLayout, job_id: int = 0) -> None:
        self._layout = layout

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def poll(self, timeout_s: float) -> list[Event]:
        if not self._queue:
            return []
        return [run_task(self._job, self._queue.popleft(), self._layout, self._slot_buffer, in_trainer=True)]

    def close(self) -> None:
        self._queue.clear()
        self._job.close()  # what the job opened in this process to read (an HDF5 file)
