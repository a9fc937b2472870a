/* fl_resample: Pillow-compatible separable resampling; see fl_resample.h. */
#include "fl_resample.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* The filters of Pillow's Resample.c, with its supports. */

static double box_filter(double x) {
    return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0;
}

static double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double hamming_filter(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x));
}

static double bicubic_filter(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc_filter(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos_filter(double x) {
    if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
    return 0.0;
}

int fl_filter_valid(int filter) {
    return filter >= FL_FILTER_NEAREST && filter <= FL_FILTER_HAMMING;
}

static int filter_for(int filter, double (**fn)(double), double *support) {
    switch (filter) {
    case FL_FILTER_BOX: *fn = box_filter; *support = 0.5; return 0;
    case FL_FILTER_BILINEAR: *fn = bilinear_filter; *support = 1.0; return 0;
    case FL_FILTER_HAMMING: *fn = hamming_filter; *support = 1.0; return 0;
    case FL_FILTER_BICUBIC: *fn = bicubic_filter; *support = 2.0; return 0;
    case FL_FILTER_LANCZOS: *fn = lanczos_filter; *support = 3.0; return 0;
    default: return -1;
    }
}

static int32_t to_fixed(double w) {
    /* normalize_coeffs_8bpc: round half away from zero */
    return w < 0 ? (int32_t)(-0.5 + w * (1 << FL_PRECISION_BITS))
                 : (int32_t)(0.5 + w * (1 << FL_PRECISION_BITS));
}

void fl_coeffs_free(fl_coeffs *c) {
    free(c->bounds);
    free(c->kk);
    c->bounds = NULL;
    c->kk = NULL;
}

int fl_coeffs_init(fl_coeffs *c, int in_size, double in0_d, double in1_d, int out_size, int filter) {
    double (*fn)(double) = NULL;
    double support = 0.0, scale, filterscale, ss;
    double *w = NULL;
    /* Pillow passes the box as C floats; keep that rounding so the arithmetic matches. */
    float in0 = (float)in0_d, in1 = (float)in1_d;
    int xx, x, ksize;

    memset(c, 0, sizeof *c);
    if (out_size <= 0 || in_size <= 0 || !(in1 > in0) || !fl_filter_valid(filter)) {
        return FL_COEFFS_EINVAL;
    }

    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filter == FL_FILTER_NEAREST) {
        ksize = 1;
    } else {
        if (filter_for(filter, &fn, &support) != 0) return FL_COEFFS_EINVAL;
        if (filterscale < 1.0) filterscale = 1.0;
        support = support * filterscale;
        if (support > (double)(INT_MAX / 4)) return FL_COEFFS_EINVAL;
        ksize = (int)ceil(support) * 2 + 1;
    }
    if ((size_t)out_size > ((size_t)INT_MAX / sizeof(int32_t)) / (size_t)ksize) {
        return FL_COEFFS_EINVAL;
    }

    c->bounds = (int *)malloc((size_t)out_size * 2 * sizeof(int));
    c->kk = (int32_t *)calloc((size_t)out_size * (size_t)ksize, sizeof(int32_t));
    if (filter != FL_FILTER_NEAREST) w = (double *)malloc((size_t)ksize * sizeof(double));
    if (!c->bounds || !c->kk || (filter != FL_FILTER_NEAREST && !w)) {
        free(w);
        fl_coeffs_free(c);
        return FL_COEFFS_ENOMEM;
    }
    c->out_size = out_size;
    c->ksize = ksize;
    c->first = INT_MAX;
    c->last = 0;

    ss = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        int xmin, xmax;
        int32_t *k = &c->kk[(size_t)xx * ksize];
        if (filter == FL_FILTER_NEAREST) {
            xmin = (int)center;
            if (xmin < 0) xmin = 0;
            if (xmin > in_size - 1) xmin = in_size - 1;
            xmax = 1;
            k[0] = 1 << FL_PRECISION_BITS;
        } else {
            double ww = 0.0;
            xmin = (int)(center - support + 0.5);
            if (xmin < 0) xmin = 0;
            xmax = (int)(center + support + 0.5);
            if (xmax > in_size) xmax = in_size;
            xmax -= xmin;
            if (xmax < 0) xmax = 0;
            if (xmax > ksize) xmax = ksize; /* cannot happen; keeps the writes in bounds */
            for (x = 0; x < xmax; x++) {
                w[x] = fn((x + xmin - center + 0.5) * ss);
                ww += w[x];
            }
            for (x = 0; x < xmax; x++) {
                k[x] = to_fixed(ww != 0.0 ? w[x] / ww : w[x]);
            }
        }
        c->bounds[xx * 2 + 0] = xmin;
        c->bounds[xx * 2 + 1] = xmax;
        if (xmin < c->first) c->first = xmin;
        if (xmin + xmax > c->last) c->last = xmin + xmax;
    }
    if (c->last <= c->first) { /* no sample used at all: cannot happen for a valid interval */
        c->first = 0;
        c->last = 1;
    }
    free(w);
    return FL_COEFFS_OK;
}

void fl_coeffs_shift(fl_coeffs *c, int offset) {
    int xx;
    for (xx = 0; xx < c->out_size; xx++) c->bounds[xx * 2] -= offset;
    c->first -= offset;
    c->last -= offset;
}

static inline uint8_t clip8(int32_t v) {
    v >>= FL_PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

#define FL_HALF (1 << (FL_PRECISION_BITS - 1))

/* ------------------------------------------------------------------------------------------ */
/* Runtime dispatch: on x86 with GCC/Clang an AVX2 version of each pass is compiled alongside the
 * portable one (no -march flag needed) and picked once per process by CPUID. Both compute the
 * same exact integer sums, so their outputs are identical. */

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(FL_NO_SIMD)
#define FL_X86 1
#include <immintrin.h>
#define FL_AVX2 __attribute__((target("avx2")))
#endif

static int simd_state = -1; /* -1 unknown, 0 off, 1 AVX2 */

static int use_avx2(void) {
    int v = __atomic_load_n(&simd_state, __ATOMIC_RELAXED);
    if (v < 0) {
#ifdef FL_X86
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
        v = 0;
#endif
        __atomic_store_n(&simd_state, v, __ATOMIC_RELAXED);
    }
    return v;
}

int fl_resample_simd(int enable) {
    int have = 0;
#ifdef FL_X86
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    if (enable >= 0) __atomic_store_n(&simd_state, enable && have, __ATOMIC_RELAXED);
    return use_avx2();
}

/* ------------------------------------------------------------------------------------------ */
/* Horizontal pass */

static void row_scalar(const uint8_t *in, int in_bpp, uint8_t *out, int out_ch, const fl_coeffs *c,
                       int flip) {
    const int n = c->out_size, ksize = c->ksize;
    const int *bounds = c->bounds;
    const int32_t *kk = c->kk;
    int xx, x;
    if (out_ch == 3) {
        for (xx = 0; xx < n; xx++) {
            const int xmin = bounds[xx * 2], xlen = bounds[xx * 2 + 1];
            const int32_t *k = kk + (size_t)xx * ksize;
            const uint8_t *p = in + (size_t)xmin * in_bpp;
            int32_t s0 = FL_HALF, s1 = FL_HALF, s2 = FL_HALF;
            uint8_t *o = out + (size_t)(flip ? n - 1 - xx : xx) * 3;
            for (x = 0; x < xlen; x++) {
                const int32_t kv = k[x];
                s0 += p[0] * kv;
                s1 += p[1] * kv;
                s2 += p[2] * kv;
                p += in_bpp;
            }
            o[0] = clip8(s0);
            o[1] = clip8(s1);
            o[2] = clip8(s2);
        }
    } else {
        for (xx = 0; xx < n; xx++) {
            const int xmin = bounds[xx * 2], xlen = bounds[xx * 2 + 1];
            const int32_t *k = kk + (size_t)xx * ksize;
            const uint8_t *p = in + (size_t)xmin * in_bpp;
            int32_t s0 = FL_HALF;
            for (x = 0; x < xlen; x++) s0 += p[(size_t)x * in_bpp] * k[x];
            out[flip ? n - 1 - xx : xx] = clip8(s0);
        }
    }
}

#ifdef FL_X86
/* 4-byte pixels (RGBX) to 3-channel output: one 32-bit lane per channel, two taps per step. */
FL_AVX2 static void row_avx2_rgbx(const uint8_t *in, uint8_t *out, const fl_coeffs *c, int flip) {
    const int n = c->out_size, ksize = c->ksize;
    const int *bounds = c->bounds;
    const int32_t *kk = c->kk;
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m128i half = _mm_set1_epi32(FL_HALF);
    int xx;
    for (xx = 0; xx < n; xx++) {
        const int xmin = bounds[xx * 2], xlen = bounds[xx * 2 + 1];
        const int32_t *k = kk + (size_t)xx * ksize;
        const uint8_t *p = in + (size_t)xmin * 4;
        __m256i acc = _mm256_setzero_si256();
        __m128i sum;
        uint32_t v;
        int x = 0;
        uint8_t *o = out + (size_t)(flip ? n - 1 - xx : xx) * 3;
        for (; x + 1 < xlen; x += 2) {
            const __m128i px2 = _mm_loadl_epi64((const __m128i *)(p + (size_t)x * 4)); /* 2 px */
            const __m128i k2 = _mm_loadl_epi64((const __m128i *)(k + x));               /* 2 taps */
            acc = _mm256_add_epi32(
                acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px2),
                                        _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(k2), spread)));
        }
        sum = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        sum = _mm_add_epi32(sum, half);
        if (x < xlen) {
            int32_t px1;
            memcpy(&px1, p + (size_t)x * 4, 4);
            sum = _mm_add_epi32(sum, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(px1)),
                                                     _mm_set1_epi32(k[x])));
        }
        sum = _mm_srai_epi32(sum, FL_PRECISION_BITS);
        sum = _mm_packs_epi32(sum, sum);
        sum = _mm_packus_epi16(sum, sum);
        v = (uint32_t)_mm_cvtsi128_si32(sum);
        memcpy(o, &v, 3);
    }
}
#endif

void fl_resample_row(const uint8_t *in, int in_bpp, uint8_t *out, int out_ch, const fl_coeffs *c,
                     int flip) {
#ifdef FL_X86
    if (in_bpp == 4 && out_ch == 3 && use_avx2()) {
        row_avx2_rgbx(in, out, c, flip);
        return;
    }
#endif
    row_scalar(in, in_bpp, out, out_ch, c, flip);
}

/* ------------------------------------------------------------------------------------------ */
/* Vertical pass: the same plain C twice; the compiler vectorises the AVX2 copy 8 lanes wide. */

static inline __attribute__((always_inline)) void columns_body(
    const uint8_t *in, size_t in_stride, int row0, int width, int in_channels, uint8_t *out,
    size_t out_stride, const fl_coeffs *c, int32_t *acc) {
    const int n = c->out_size, ksize = c->ksize;
    const int len = width * in_channels;
    int yy, y, i;
    for (yy = 0; yy < n; yy++) {
        const int ymin = c->bounds[yy * 2] - row0, ylen = c->bounds[yy * 2 + 1];
        const int32_t *k = c->kk + (size_t)yy * ksize;
        uint8_t *o = out + (size_t)yy * out_stride;
        for (i = 0; i < len; i++) acc[i] = FL_HALF;
        for (y = 0; y < ylen; y++) {
            const uint8_t *restrict r = in + (size_t)(ymin + y) * in_stride;
            const int32_t kv = k[y];
            int32_t *restrict a = acc;
            for (i = 0; i < len; i++) a[i] += (int32_t)r[i] * kv;
        }
        if (in_channels == 1) {
            for (i = 0; i < len; i++) {
                const uint8_t v = clip8(acc[i]);
                o[3 * i] = v;
                o[3 * i + 1] = v;
                o[3 * i + 2] = v;
            }
        } else {
            for (i = 0; i < len; i++) o[i] = clip8(acc[i]);
        }
    }
}

static void columns_generic(const uint8_t *in, size_t in_stride, int row0, int width,
                            int in_channels, uint8_t *out, size_t out_stride, const fl_coeffs *c,
                            int32_t *acc) {
    columns_body(in, in_stride, row0, width, in_channels, out, out_stride, c, acc);
}

#ifdef FL_X86
FL_AVX2 static void columns_avx2(const uint8_t *in, size_t in_stride, int row0, int width,
                                 int in_channels, uint8_t *out, size_t out_stride,
                                 const fl_coeffs *c, int32_t *acc) {
    columns_body(in, in_stride, row0, width, in_channels, out, out_stride, c, acc);
}
#endif

void fl_resample_columns(const uint8_t *in, size_t in_stride, int row0, int width, int in_channels,
                         uint8_t *out, size_t out_stride, const fl_coeffs *c, int32_t *acc) {
#ifdef FL_X86
    if (use_avx2()) {
        columns_avx2(in, in_stride, row0, width, in_channels, out, out_stride, c, acc);
        return;
    }
#endif
    columns_generic(in, in_stride, row0, width, in_channels, out, out_stride, c, acc);
}
