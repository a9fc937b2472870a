/*
 * fl_pixels: whole-batch pixel passes the trainer would otherwise make in several torch passes.
 */
#ifndef FL_PIXELS_H
#define FL_PIXELS_H

#include <stddef.h>

/* dst[i] = (float)src[i] * scale[i % 3] + bias[i % 3] for i in [0, 3 * pixels): interleaved RGB
 * (NHWC) uint8 to float32, the same two roundings as torch's x.float().mul_(scale).add_(bias). */
void fl_normalize_u8(const unsigned char *src, float *dst, size_t pixels, const float scale[3],
                     const float bias[3]);

#endif
