"""Build the optional native JPEG decoder, `fastload._jpeg` (all other metadata is in pyproject.toml).

The extension needs libjpeg-turbo's headers and library (Debian/Ubuntu: libjpeg62-turbo-dev or
libjpeg-turbo8-dev; Fedora: libjpeg-turbo-devel). It is optional: where it cannot be built, the
install still succeeds (with a warning) and fastload decodes with Pillow instead.
"""

from setuptools import Extension, setup

NATIVE = "native"

setup(
    ext_modules=[
        Extension(
            "fastload._jpeg",
            sources=[
                f"{NATIVE}/fl_binding.c", f"{NATIVE}/fl_jpeg.c", f"{NATIVE}/fl_resample.c", f"{NATIVE}/fl_pixels.c",
                f"{NATIVE}/fl_encode.c",
            ],
            depends=[
                f"{NATIVE}/fl_jpeg.h", f"{NATIVE}/fl_encode.h", f"{NATIVE}/fl_resample.h", f"{NATIVE}/fl_pixels.h",
            ],
            include_dirs=[NATIVE],
            libraries=["jpeg"],
            # Portable: no -march=native. -O3 lets the vertical pass auto-vectorise (SSE2).
            extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ],
)
