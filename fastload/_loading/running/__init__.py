"""Running: the machinery that executes an epoch.

- `engine` (the worker pool, which grows and shrinks: NOTE [retiring workers]), `dispatch`
  (which worker runs which task), `supervision` (why a worker died, whom to blame, the hang
  bound), `worker` and `worker_link` (the worker's side and the wire);
- `inline` (tasks on the trainer's thread), `dali_executor` (GPU decoding in this process), and
  `executors` (which of them, or a daemon session, runs a loader's tasks);
- `pipeline` (executor, ring and delivery of one loader, across its epochs; `set_workers` and
  `set_in_flight`, the handles a tuner turns), `split_batches`
  (a batch cut into one part per worker, and joined), `in_flight` (the window: how many batches
  are in flight, its one owner), `epoch` (one epoch's submission loop), `iterations` (a
  loader's iterations over time: the pipeline kept across epochs, each iteration and its
  read-ahead), `stats` (the per-loader counters block).

May import every room of `_loading` below it; only the top level (`assembly.py`, and `loader.py`,
the facade) sits above it.
"""
