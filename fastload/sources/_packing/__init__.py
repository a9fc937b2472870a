"""Packing: `pack` (`fastload pack SRC DST`) copies any source's encoded samples into the packed
format, here or across a Ray cluster, re-encoding large images when asked.

The top room of `sources/`: it reads through any source (the seam, the formats) and writes what
`_formats/pack_format.py` defines; nothing below imports it.

- `writer.py`: `pack` itself; `data_files.py`: its data files, written, made durable and
  checkpointed (a killed run goes on); `manifest.py`: what a pack's manifest says of how it was made,
  and whether a run may go on with it; `progress.py`: the progress line on stderr.
- `upload.py`: a pack for a URL, made whole locally and uploaded.
- `ray_pack.py`: the same samples read and re-encoded by Ray tasks.
- `reencode.py`: smaller stored images (`max_side`); `image_bytes.py`: whether a sample's bytes
  are a whole image, told without decoding it.

A private room (its name starts with `_`): users import `fastload.sources`, whose `__all__`
is the public face.
"""
