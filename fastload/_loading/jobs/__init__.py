"""Jobs: what a batch task is (the executor contract: tasks out, events back) and what a worker
does with one — load its samples and write them into a slot (images, datasets, arrays,
IterableDataset streams).

May import foundations, `sources`, `transforms`, `_augment`, and the `decoding`, `slots` and
`order` rooms; not the rooms that run jobs (`running`, `link`) or configure them (`settings`).
"""
