"""Order: which samples form which batch, from (seed, epoch) alone — the epoch plan (`plan`;
a `sources.Mix`'s in `mixture`), the plans of `fastload.samplers` (`sampling`), this process's
shard (ranks), and read-ahead of the plan's next chunks.

May import foundations, `sources` and `samplers`; no other room of `_loading`.
"""
