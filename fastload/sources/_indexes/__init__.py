"""The index layer: what a worker reads samples through, whatever the format that made it.

A format's `open()` returns one of these; the loader, its workers and a daemon's workers know
only this layer (and its `SampleIndex` protocol), never a format. It may import storage (for
reads beneath roots and through the node cache) and the foundations; never the formats, the
`Source` seam or packing.

- `sample_index.py`: the `SampleIndex` protocol, `RemoteCapable` (the declared protocol of an
  index that reads from object storage; `remote_reads` asks for it), `ReadFailure`,
  `ReadBuffer`, the registry of indexes a daemon's worker attaches from shared memory, and
  `PathIndex` (one file a sample).
- `extents.py`: `ExtentIndex`, samples that are byte ranges inside container files (tar shards,
  packs, remote objects); `extent_files.py`: a process's descriptors and positioned reads of
  them; `extent_layout.py`: its shared-memory layout.
- `arrays.py`: `ArrayIndex`, fixed-shape rows delivered as stored (no decoding).
- `mixed.py`: `MixIndex`, the children of a `sources.Mix` as one index, reads routed to each.
- `targets.py`: torchvision ImageFolder's `class_to_idx` and `targets` of any index, one meaning
  for every format.

A private room (its name starts with `_`): users import `fastload.sources`, whose `__all__`
is the public face.
"""
