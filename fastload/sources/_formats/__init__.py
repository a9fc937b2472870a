"""The formats: each a `Source` (the seam in `sources/_base.py`) that opens one kind of dataset
into an index, from local disk or, where the format allows it, object storage.

It may import the index layer, storage and the seam; never packing (which writes the packed
format and so sits above it). The public names are re-exported by `fastload.sources`.

- `folder.py`: `ImageFolder` and its scan; `file_list.py`: `FileList` (its rows parsed by
  `list_rows.py`; a list at a URL read through storage).
- `tar.py`: WebDataset tar shards (`TarShards`), each scanned by `tar_scan.py`; what its
  patterns name, bounded before any walk, in `shard_names.py`.
- `packed.py`: `Packed`, a pack read back, locally or from a URL (its on-disk format in
  `pack_format.py`, which the writer in `_packing/` shares).
- `hdf5.py`: `HDF5` (its indexes in `hdf5_indexes.py`; opening files and datasets in
  `hdf5_files.py`; every file the HDF5 library may open in `hdf5_reach.py`).
- `mix.py`: `Mix`, other sources sampled in set proportions (not a format: the one kind made of
  kinds; it opens its children into a `MixIndex`, `_indexes/mixed.py`).

A private room (its name starts with `_`): users import `fastload.sources`, whose `__all__`
is the public face.
"""
