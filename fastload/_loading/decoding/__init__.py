"""Decoding: encoded bytes to uint8 pixels — the decode+augment backends (Pillow, native
libjpeg-turbo, DALI), a padded crop's fill (`padding`, the CPU backends'), the GPU decoders'
kernels (crop/resize, nvJPEG), host normalization.

The kernels layer of the loader: imports foundations, `sources`, `transforms` and `_augment`,
nothing else of `_loading`. `backend.py` is the seam (`make_backend`, `BACKENDS`, `SampleFailure`).
"""
