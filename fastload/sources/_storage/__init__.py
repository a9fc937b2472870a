"""Storage: where a source's bytes lie and how they are reached, whatever the format.

The lowest room of `sources/`; it imports only fastload's foundations (never the index, the
formats or packing), so that every format reads local files and object storage the same way.

- `bounds.py`: the limits every read holds to, and the checks that apply them (bounded reads of
  regular files, a file's identity, clipped text for messages).
- `beneath.py`: opening files only beneath a daemon's root directories.
- `remote.py`: objects at URLs (sizes, ranged and whole reads, listings, writes); `wire.py`: one
  attempt of one request on the wire; `remote_file.py`: `RemoteFile`, one version of an object
  as an index names it.
- `node_cache.py`: the node-local cache of remote objects' chunks; `chunk_file.py`: one chunk
  as it is stored there.
- `private_dir.py`: a user's private directory under a shared parent; `scan_cache.py`: the tar
  shard scan cache kept in one; `decompressed.py`: compressed tar shards' uncompressed copies,
  kept in another.

A private room (its name starts with `_`): users import `fastload.sources`, whose `__all__`
is the public face.
"""
