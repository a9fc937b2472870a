"""Running: the machinery that executes an epoch — the worker pool and its wire, supervision,
in-process and GPU executors, the pipeline that ties executor, ring and delivery together, one
epoch's submission loop, a loader's iterations over time (`iterations`: the pipeline kept
across epochs, each iteration and its read-ahead), and the per-loader counters block.

May import every room of `_loading` below it; only the top level (`assembly.py`, and `loader.py`,
the facade) sits above it.
"""
