"""Tuning: the loader that sets its own worker count and batches in flight while it runs
(`num_workers="auto"`, `prefetch="auto"`; issue 32).

- `decisions` (what a tuner may decide and why: the reasons iostat and the metrics name),
- `machine_load` (the machine's cores, run-queue pressure and the processes' CPU, read from /proc),
- `observation` (one interval of a loader and its machine, made from two counter snapshots),
- `controller` (the pure policy: an interval's observations in, a damped decision out),
- `tuner` (the glue that feeds the controller from a loader's counters and turns the handles:
  the engine's workers, the in-flight window and the ring).

May import `running` and the rooms below it; only the top level sits above it.
"""
