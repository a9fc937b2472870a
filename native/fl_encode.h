/*
 * fl_encode: encode 8-bit RGB or gray pixels as a baseline JPEG (no Python).
 *
 * fl_jpeg_encode() compresses a (height, width, channels) uint8 buffer, channels 1 (gray) or 3
 * (RGB), with libjpeg-turbo's libjpeg API: the standard quantisation tables scaled to `quality`
 * (1..100, libjpeg's jpeg_set_quality), YCbCr with 4:2:0 chroma subsampling for RGB (libjpeg's and
 * Pillow's default), the accurate integer DCT, optimised Huffman tables (smaller files, the same
 * pixels, no slower to decode), baseline (not progressive: a progressive file decodes slower and
 * cannot skip rows). No metadata is written (no JFIF thumbnail, EXIF or ICC profile). The output
 * is a function of the pixels, the size and the quality alone, for a given libjpeg-turbo: the same
 * bytes on every call. Re-entrant: no global state.
 */
#ifndef FL_ENCODE_H
#define FL_ENCODE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Encode `pixels` (height rows of width * channels bytes, no padding). On FL_OK, *out holds
 * *out_len bytes of JPEG, allocated with malloc: the caller frees it with free(). On failure
 * *out is NULL and `errmsg` (FL_ERRMSG_LEN bytes) says why: FL_ERR_ARG for a bad size, channel
 * count or quality, FL_ERR_NOMEM when memory ran out, FL_ERR_CORRUPT for any other libjpeg error.
 */
int fl_jpeg_encode(const unsigned char *pixels, int width, int height, int channels, int quality,
                   unsigned char **out, size_t *out_len, char *errmsg);

#ifdef __cplusplus
}
#endif

#endif /* FL_ENCODE_H */
