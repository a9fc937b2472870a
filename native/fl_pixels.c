/*
 * fl_pixels: whole-batch pixel passes (see fl_pixels.h). One pass over the batch instead of
 * torch's three (convert, multiply, add), each element rounded exactly as torch rounds it.
 */
#include "fl_pixels.h"

void fl_normalize_u8(const unsigned char *src, float *dst, size_t pixels, const float scale[3],
                     const float bias[3]) {
    /* A lookup table per channel: 768 floats, each computed once with torch's two roundings
     * (a product, then a sum; no fused multiply-add, which baseline x86-64 does not have). */
    float table[3][256];
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v++) {
            volatile float product = (float)v * scale[c];
            table[c][v] = product + bias[c];
        }
    }
    for (size_t i = 0; i < pixels; i++) {
        const unsigned char *s = src + 3 * i;
        float *d = dst + 3 * i;
        d[0] = table[0][s[0]];
        d[1] = table[1][s[1]];
        d[2] = table[2][s[2]];
    }
}

/* The three blends torchvision's ColorJitter makes of a uint8 image, each ending as
 * `output.clamp_(0, 255).to(uint8)`: clamped, then truncated toward zero. */

#include <math.h>

#define FL_FMA __attribute__((target("avx2,fma")))

static inline unsigned char clamp_trunc(float v) {
    v = v > 0.0f ? v : 0.0f; /* the comparisons vectorize (max/min), unlike fminf/fmaxf */
    v = v < 255.0f ? v : 255.0f;
    return (unsigned char)(int)v;
}

/* floor(r * 0.2989 + g * 0.587 + b * 0.114): `r.mul(0.2989).add_(g, alpha=0.587).add_(b,
 * alpha=0.114)`, then floor_(), as torchvision's grayscale for uint8 images. */
static inline float luma(const unsigned char *p) {
    /* >= 0, so truncation is the floor (and vectorizes, where floorf is a library call) */
    return (float)(int)fmaf((float)p[2], 0.114f, fmaf((float)p[1], 0.587f, (float)p[0] * 0.2989f));
}

/* One image, all its operations. `fmaf` is one instruction where the CPU has FMA (the FL_FMA
 * clone, also vectorized with AVX2), and a correctly rounded library call, with the same result,
 * where it has not. */
static inline __attribute__((always_inline)) void jitter_one(unsigned char *img, size_t pixels, const long long *order,
                              const float *factor) {
    for (int k = 0; k < 4; k++) {
        long long op = order[k];
        if (op < 0 || op > 2) continue;
        float f = factor[op];
        float alpha = (float)(1.0 - (double)f); /* torchvision's `1.0 - ratio`, in Python floats */
        size_t n = 3 * pixels;
        if (op == 0) { /* brightness: image * f */
            for (size_t i = 0; i < n; i++) img[i] = clamp_trunc((float)img[i] * f);
        } else if (op == 1) { /* contrast: blend with the mean of the floored luma */
            long long sum = 0;
            for (size_t i = 0; i < pixels; i++) sum += (long long)luma(img + 3 * i);
            float mean = (float)sum / (float)pixels; /* exact sum below 2**24: torch's too */
            for (size_t i = 0; i < n; i++) img[i] = clamp_trunc(fmaf(mean, alpha, (float)img[i] * f));
        } else { /* saturation: blend each pixel with its floored luma */
            for (size_t i = 0; i < pixels; i++) {
                unsigned char *p = img + 3 * i;
                float gray = luma(p);
                p[0] = clamp_trunc(fmaf(gray, alpha, (float)p[0] * f));
                p[1] = clamp_trunc(fmaf(gray, alpha, (float)p[1] * f));
                p[2] = clamp_trunc(fmaf(gray, alpha, (float)p[2] * f));
            }
        }
    }
}

FL_FMA static void jitter_fma(unsigned char *images, size_t count, size_t pixels,
                              const long long *order, const float *factors) {
    for (size_t i = 0; i < count; i++) {
        jitter_one(images + 3 * pixels * i, pixels, order + 4 * i, factors + 3 * i);
    }
}

static void jitter_plain(unsigned char *images, size_t count, size_t pixels, const long long *order,
                         const float *factors) {
    for (size_t i = 0; i < count; i++) {
        jitter_one(images + 3 * pixels * i, pixels, order + 4 * i, factors + 3 * i);
    }
}

void fl_color_jitter(unsigned char *images, size_t count, size_t pixels, const long long *order,
                     const float *factors) {
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        jitter_fma(images, count, pixels, order, factors);
    } else {
        jitter_plain(images, count, pixels, order, factors);
    }
}

#include <stdlib.h>
#include <string.h>

/* Compiled for the baseline target, which has no fused multiply-add to contract into: each
 * product and the sum are rounded apart, as torch's mul and add_ round them. */
int fl_mixup(float *images, size_t count, size_t values, float lam, float one_minus_lam) {
    if (count == 0) return 0;
    float *last = malloc(values * sizeof(float));
    if (last == NULL) return -1;
    memcpy(last, images + (count - 1) * values, values * sizeof(float));
    for (size_t i = count - 1; i > 0; i--) { /* from the end: image i-1 is still the original */
        float *x = images + i * values;
        const float *prev = x - values;
        for (size_t k = 0; k < values; k++) {
            x[k] = x[k] * lam + prev[k] * one_minus_lam;
        }
    }
    for (size_t k = 0; k < values; k++) {
        images[k] = images[k] * lam + last[k] * one_minus_lam;
    }
    free(last);
    return 0;
}
