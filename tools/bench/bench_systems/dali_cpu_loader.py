"""Benchmark system: an NVIDIA DALI CPU-only pipeline (device_id=None) over the image folder,
num_threads=W, fn.readers.file(random_shuffle=True) -> decoders.image_random_crop (scale 0.08-1,
ratio 3/4-4/3) -> resize(224x224) -> flip(coin_flip): uint8 HWC batches, copied to numpy.
With `--val`: decoders.image -> resize(resize_shorter=256) -> crop(224x224), no shuffle.

Run with a python that has nvidia-dali (e.g. $BENCH_VENVS/dali/bin/python); prints the bench_common
JSON line. DALI's "workers" are threads of this process; the pipeline runs ahead asynchronously
(DALI's default prefetch_queue_depth=2), as it would in training.
"""

from __future__ import annotations

import sys
import time

from bench_common import batches_of, measure, parse_args
from nvidia.dali import fn, pipeline_def, types


def main() -> None:
    val = "--val" in sys.argv  # removed before the common parser runs
    if val:
        sys.argv.remove("--val")
    options = parse_args(__doc__.splitlines()[0])
    start = time.monotonic()

    @pipeline_def(batch_size=options.batch_size, num_threads=max(1, options.workers), device_id=None, seed=0)
    def pipeline():
        jpegs, labels = fn.readers.file(
            file_root=str(options.data), random_shuffle=not val, name="reader"
        )
        if val:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop(images, crop=(224, 224))
        else:
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB,
                random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
            )
            images = fn.resize(images, resize_x=224, resize_y=224)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, labels

    pipe = pipeline()
    pipe.build()
    epoch_batches = pipe.epoch_size("reader") // options.batch_size  # drop_last

    class Epochs:
        """One epoch per iteration, like a torch loader (the reader itself wraps around)."""

        def __iter__(self):
            for _ in range(epoch_batches):
                images, labels = pipe.run()
                yield images.as_array(), labels.as_array()

    measure(start, batches_of(Epochs(), options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
