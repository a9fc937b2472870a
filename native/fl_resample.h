/*
 * fl_resample: Pillow-compatible separable resampling of 8-bit rows (no Python, no libjpeg).
 *
 * The arithmetic follows Pillow's libImaging/Resample.c (`Image.resize(size, filter, box=...)`):
 * per output sample a window [xmin, xmin + xlen) of source samples and normalised filter weights,
 * the filter support stretched by the downscale factor (antialiasing), weights in 22-bit fixed
 * point, a horizontal pass into an 8-bit intermediate and a vertical pass from it. On the same
 * source pixels the result is bit-identical to Pillow's (NEAREST excepted, see below).
 *
 * Filters use Pillow's `Image.Resampling` numbering. NEAREST is a one-tap kernel picking the
 * source sample under the output sample's centre, like Pillow's affine nearest path (Pillow
 * accumulates the position incrementally, so at exact ties it may pick the neighbour).
 */
#ifndef FL_RESAMPLE_H
#define FL_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FL_FILTER_NEAREST = 0,
    FL_FILTER_LANCZOS = 1,
    FL_FILTER_BILINEAR = 2,
    FL_FILTER_BICUBIC = 3,
    FL_FILTER_BOX = 4,
    FL_FILTER_HAMMING = 5
};

/* 1-D resampling coefficients for one axis. */
typedef struct {
    int out_size; /* number of output samples */
    int ksize;    /* stride of `kk` (taps reserved per output sample) */
    int *bounds;  /* 2 * out_size: xmin, xlen per output sample (source sample indices) */
    int32_t *kk;  /* out_size * ksize fixed-point weights (FL_PRECISION_BITS) */
    int first;    /* smallest xmin: first source sample used */
    int last;     /* largest xmin + xlen: one past the last source sample used */
} fl_coeffs;

#define FL_PRECISION_BITS (32 - 8 - 2)

/* 1 if `filter` is one of the FL_FILTER_* values. */
int fl_filter_valid(int filter);

/* What fl_coeffs_init returns. */
enum {
    FL_COEFFS_OK = 0,
    FL_COEFFS_EINVAL = -1, /* out_size <= 0, in_size <= 0, in1 <= in0 once rounded to float (as
                            * Pillow does: a box thinner than float precision), unknown filter,
                            * or tables too large to index with an int */
    FL_COEFFS_ENOMEM = -2  /* the tables could not be allocated */
};

/*
 * Compute the coefficients that resample the source interval [in0, in1) of an axis of `in_size`
 * samples onto `out_size` samples. Returns FL_COEFFS_OK or, on failure, FL_COEFFS_EINVAL or
 * FL_COEFFS_ENOMEM; on failure `c` owns nothing.
 */
int fl_coeffs_init(fl_coeffs *c, int in_size, double in0, double in1, int out_size, int filter);

/* Release what fl_coeffs_init allocated (safe on a zeroed struct and twice). */
void fl_coeffs_free(fl_coeffs *c);

/* Subtract `offset` from every window start (the source now begins at sample `offset`). */
void fl_coeffs_shift(fl_coeffs *c, int offset);

/*
 * Horizontal pass of one row: `in` holds pixels of `in_bpp` bytes (1: gray; 3: RGB; 4: RGBX, the
 * 4th byte ignored), indexed as the (shifted) coefficients expect; writes c->out_size pixels of
 * `out_ch` samples (1 for gray input, else 3) to `out`, mirrored left-right when `flip`.
 */
void fl_resample_row(const uint8_t *in, int in_bpp, uint8_t *out, int out_ch, const fl_coeffs *c,
                     int flip);

/*
 * Vertical pass: `in` holds rows of `width * in_channels` samples, `in_stride` bytes apart, row 0
 * being source row `row0` of the (vertical) coefficients `c`. Writes c->out_size rows of `width`
 * pixels with 3 samples each to `out` (`out_stride` bytes apart); a 1-channel input is replicated
 * to RGB. `acc` is scratch of width * in_channels int32 values.
 */
void fl_resample_columns(const uint8_t *in, size_t in_stride, int row0, int width, int in_channels,
                         uint8_t *out, size_t out_stride, const fl_coeffs *c, int32_t *acc);

/*
 * SIMD switch (for tests and benchmarks): enable = 1 uses AVX2 where the CPU has it, 0 forces the
 * portable code, -1 only queries. Returns whether AVX2 code is in use. Results are identical.
 */
int fl_resample_simd(int enable);

#ifdef __cplusplus
}
#endif

#endif /* FL_RESAMPLE_H */
