/*
 * fl_jpeg: decode only what a crop keeps (no Python).
 *
 * fl_jpeg_decode_crop_resize() decodes a JPEG with libjpeg-turbo's libjpeg API straight into a
 * caller's (out_h, out_w, 3) uint8 RGB buffer:
 *   - DCT-domain scaling by 1/1, 1/2, 1/4 or 1/8 (the scales libjpeg-turbo has fast, SIMD IDCTs
 *     for; 3/8, 5/8, 3/4 and 7/8 are slower than a full decode): the smallest one that keeps the
 *     crop box at least as large as the output in both dimensions;
 *   - only the columns the resampler reads (jpeg_crop_scanline, widened by libjpeg to an iMCU
 *     boundary) and only the rows it reads (jpeg_skip_scanlines above, abort below);
 *   - Pillow-compatible resampling (see fl_resample.h) and a horizontal flip in the same pass:
 *     each decoded row is resampled horizontally as it arrives into a buffer of
 *     (crop rows x out_w), then the vertical pass writes the output. No full-size image exists.
 * Grayscale comes out replicated to RGB; CMYK/YCCK the way Pillow's convert("RGB") does it
 * (Adobe polarity, as Pillow assumes). Every libjpeg error, and running out of data (libjpeg's
 * "premature end of data" warning, or no EOI marker after the rows we stopped at), is reported
 * as FL_ERR_CORRUPT; nothing is leaked on any path. Re-entrant: no global state.
 */
#ifndef FL_JPEG_H
#define FL_JPEG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FL_OK = 0,
    FL_ERR_CORRUPT = 1, /* not a JPEG, corrupt or truncated data: message from libjpeg */
    FL_ERR_ARG = 2,     /* bad argument (box, sizes, filter) */
    FL_ERR_NOMEM = 3
};

#define FL_ERRMSG_LEN 256

/* Read the header only: image width and height. */
int fl_jpeg_size(const unsigned char *data, size_t len, int *width, int *height, char *errmsg);

/*
 * box: (left, top, right, bottom) in source pixels of the unscaled image, possibly fractional,
 * 0 <= left < right <= width, 0 <= top < bottom <= height (a 1e-3 pixel overshoot from float
 * rounding is clamped). out: out_h * out_w * 3 bytes, rows of out_w RGB pixels.
 * clip: NULL, or a window (same form, containing the box) outside which the filter reads nothing,
 * as if the image had been cropped to it (rounded outwards to whole pixels) before resizing:
 * torchvision's crop-then-resize. With NULL the filter may read any pixel, like Pillow's
 * Image.resize(box=...).
 * filter: an FL_FILTER_* value (Pillow's Image.Resampling numbering).
 * *scale_denom receives the DCT scale denominator used (1, 2, 4 or 8).
 */
int fl_jpeg_decode_crop_resize(const unsigned char *data, size_t len, const double box[4],
                               const double clip[4], unsigned char *out, int out_h, int out_w,
                               int flip, int filter, int *scale_denom, char *errmsg);

/* Entropy-decode the whole image (jpeg_read_coefficients) and nothing else: a benchmark floor. */
int fl_jpeg_entropy_decode(const unsigned char *data, size_t len, char *errmsg);

#ifdef __cplusplus
}
#endif

#endif /* FL_JPEG_H */
