"""Jobs: what a batch task is (the executor contract: tasks out, events back) and what a worker
does with one — load its samples and write them into a slot (images, datasets, arrays,
IterableDataset streams).

`executor.py`: tasks and events; `contract.py`: the `Job` protocol, `run_task` and what the jobs
share (failures naming samples, `SourceJob`); one module per job: `image_job.py`,
`dataset_job.py`, `array_job.py`, `iterable.py`.

May import foundations, `sources`, `transforms`, `_augment`, and the `decoding`, `slots` and
`order` rooms; not the rooms that run jobs (`running`, `link`) or configure them (`settings`).
"""
