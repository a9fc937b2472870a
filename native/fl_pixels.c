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
