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

/* ColorJitter's brightness, contrast and saturation on `count` interleaved-RGB uint8 images of
 * `pixels` pixels each, in place, as torchvision v2's uint8 tensor kernels compute them (float32,
 * fused multiply-adds as torch's vectorized CPU kernels use them, clamped, truncated). Image i
 * runs the operations order[4 * i + k] (0 brightness, 1 contrast, 2 saturation; any other value:
 * nothing) in turn with its factors[3 * i + op]. */
void fl_color_jitter(unsigned char *images, size_t count, size_t pixels, const long long *order,
                     const float *factors);

/* MixUp in place over `count` float32 images of `values` values each: image i becomes
 * image_i * lam + image_{i-1} * (1 - lam) (image_{-1} being the last), the batch rolled by one as
 * torchvision's `rolled * (1 - lam) + x * lam` with its roundings (two products, a sum). Returns
 * 0, or -1 when it could not allocate the one image it keeps aside. */
int fl_mixup(float *images, size_t count, size_t values, float lam, float one_minus_lam);
