"""Order: which samples form which batch, from (seed, epoch) alone — the epoch plan, this
process's shard (ranks), and read-ahead of the plan's next chunks.

May import foundations and `sources`; no other room of `_loading`.
"""
