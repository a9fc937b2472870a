/* fl_jpeg: decode only what a crop keeps; see fl_jpeg.h. */
#include "fl_jpeg.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "fl_resample.h"

#if !defined(JCS_EXTENSIONS)
#error "fastload._jpeg needs libjpeg-turbo (JCS_EXT_RGBX, jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

/* Images with more pixels are refused, as Pillow refuses them (DecompressionBombError at twice
 * Image.MAX_IMAGE_PIXELS): a corrupt or hostile header must not make libjpeg allocate gigabytes. */
#define FL_MAX_PIXELS 178956970ULL

/* Largest box overshoot past the image edge that is taken as float rounding and clamped. */
#define FL_BOX_SLACK 1e-3

/* ------------------------------------------------------------------------------------------ */
/* Error handling: libjpeg errors longjmp back to guarded(), which frees everything.          */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} fl_error_mgr;

static void fl_error_exit(j_common_ptr cinfo) {
    fl_error_mgr *err = (fl_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->msg);
    longjmp(err->jump, 1);
}

static void fl_emit_message(j_common_ptr cinfo, int msg_level) {
    if (msg_level < 0) {
        /* A warning. Running out of data is fatal (Pillow raises "image file is truncated");
         * other warnings (e.g. extraneous bytes, bad restart markers) are recoverable and, as in
         * Pillow, ignored. */
        if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
            fl_error_exit(cinfo);
        }
        cinfo->err->num_warnings++;
    }
}

static void fl_output_message(j_common_ptr cinfo) {
    (void)cinfo; /* never print to stderr */
}

/* Everything one call owns: heap-allocated so its fields are reliable after a longjmp. */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    fl_error_mgr err;
    fl_coeffs ch, cv;
    unsigned char *rows;   /* a few decoded rows (cropped width) */
    JSAMPROW *row_ptrs;
    unsigned char *tmp;    /* horizontally resampled rows: (crop rows) x out_w x channels */
    int32_t *acc;          /* vertical-pass accumulator row */
    int status;            /* status to report when a longjmp arrives (default FL_ERR_CORRUPT) */
} fl_ctx;

static fl_ctx *ctx_new(void) {
    fl_ctx *c = (fl_ctx *)calloc(1, sizeof(fl_ctx));
    if (!c) return NULL;
    c->cinfo.err = jpeg_std_error(&c->err.pub);
    c->err.pub.error_exit = fl_error_exit;
    c->err.pub.emit_message = fl_emit_message;
    c->err.pub.output_message = fl_output_message;
    c->status = FL_ERR_CORRUPT;
    return c;
}

static void ctx_free(fl_ctx *c) {
    /* Safe whether or not jpeg_create_decompress ran or completed: it checks cinfo->mem. */
    jpeg_destroy_decompress(&c->cinfo);
    fl_coeffs_free(&c->ch);
    fl_coeffs_free(&c->cv);
    free(c->rows);
    free(c->row_ptrs);
    free(c->tmp);
    free(c->acc);
    free(c);
}

static void set_msg(char *errmsg, const char *prefix, const char *msg) {
    if (errmsg) snprintf(errmsg, FL_ERRMSG_LEN, "%s%s", prefix, msg);
}

/* Raise an error from inside the decode: message, status, longjmp to guarded(). */
static void fail(fl_ctx *c, int status, const char *msg) {
    c->status = status;
    snprintf(c->err.msg, sizeof c->err.msg, "%s", msg);
    longjmp(c->err.jump, 1);
}

/*
 * NOTE [ guarded calls ]: every entry point runs its work as `body(c, arg)` under guarded(), which
 * owns the one fl_ctx of the call and the setjmp that libjpeg's error_exit and fail() longjmp to.
 * The setjmp has to sit in a frame that is still live when the longjmp comes, so it is here, in
 * the function that then calls `body` (and everything under it), not in a helper that would
 * return before `body` runs (longjmp into a returned frame is undefined). After a longjmp only
 * locals of guarded() that were not changed since setjmp may be read (C11 7.13.2.1): `c`,
 * `errmsg` and the arguments qualify; everything else the call owns lives in the heap fl_ctx,
 * which ctx_free() releases on both paths. Returns FL_OK or the status given to fail()
 * (FL_ERR_CORRUPT for libjpeg's own errors), with its message in `errmsg`.
 */
static int guarded(void (*body)(fl_ctx *c, void *arg), void *arg, char *errmsg) {
    fl_ctx *c = ctx_new();
    int status;
    if (!c) {
        set_msg(errmsg, "", "out of memory");
        return FL_ERR_NOMEM;
    }
    if (setjmp(c->err.jump)) {
        status = c->status;
        set_msg(errmsg, "", c->err.msg);
        ctx_free(c);
        return status;
    }
    body(c, arg);
    ctx_free(c);
    return FL_OK;
}

static int open_source(fl_ctx *c, const unsigned char *data, size_t len) {
    int rc;
    if (len > (size_t)ULONG_MAX) fail(c, FL_ERR_ARG, "data is too large");
    jpeg_create_decompress(&c->cinfo);
    jpeg_mem_src(&c->cinfo, data, (unsigned long)len);
    rc = jpeg_read_header(&c->cinfo, TRUE);
    if (rc != JPEG_HEADER_OK) fail(c, FL_ERR_CORRUPT, "no image in the data (tables only)");
    return 0;
}

static void check_pixels(fl_ctx *c) {
    unsigned long long px =
        (unsigned long long)c->cinfo.image_width * (unsigned long long)c->cinfo.image_height;
    if (px > FL_MAX_PIXELS) {
        char msg[JMSG_LENGTH_MAX];
        snprintf(msg, sizeof msg, "image of %ux%u pixels exceeds the limit of %llu pixels",
                 (unsigned)c->cinfo.image_width, (unsigned)c->cinfo.image_height, FL_MAX_PIXELS);
        fail(c, FL_ERR_CORRUPT, msg);
    }
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const unsigned char *data;
    size_t len;
    int *width, *height;
} size_args;

static void size_body(fl_ctx *c, void *arg) {
    const size_args *a = (const size_args *)arg;
    open_source(c, a->data, a->len);
    *a->width = (int)c->cinfo.image_width;
    *a->height = (int)c->cinfo.image_height;
}

int fl_jpeg_size(const unsigned char *data, size_t len, int *width, int *height, char *errmsg) {
    size_args a = {data, len, width, height};
    return guarded(size_body, &a, errmsg);
}

typedef struct {
    const unsigned char *data;
    size_t len;
} entropy_args;

static void entropy_body(fl_ctx *c, void *arg) {
    const entropy_args *a = (const entropy_args *)arg;
    open_source(c, a->data, a->len);
    check_pixels(c);
    (void)jpeg_read_coefficients(&c->cinfo);
    jpeg_finish_decompress(&c->cinfo);
}

int fl_jpeg_entropy_decode(const unsigned char *data, size_t len, char *errmsg) {
    entropy_args a = {data, len};
    return guarded(entropy_body, &a, errmsg);
}

/* ------------------------------------------------------------------------------------------ */

/* Largest of 8, 4, 2 (else 1) that keeps the box at least out_w x out_h once scaled down. */
static int choose_denom(double box_w, double box_h, int out_w, int out_h) {
    static const int denoms[] = {8, 4, 2};
    size_t i;
    for (i = 0; i < sizeof denoms / sizeof denoms[0]; i++) {
        if (box_w / denoms[i] >= out_w && box_h / denoms[i] >= out_h) return denoms[i];
    }
    return 1;
}

/* In place: Adobe-polarity CMYK (as libjpeg outputs it; Pillow reads it as "CMYK;I") to RGBX with
 * Pillow's cmyk2rgb arithmetic (the 4th byte is left as it is and ignored downstream). */
static void cmyk_to_rgbx_inplace(unsigned char *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++, p += 4) {
        const int c = 255 - p[0], m = 255 - p[1], y = 255 - p[2];
        const int nk = p[3]; /* 255 - K with K = 255 - raw */
        int t;
#define FL_MULDIV255(a, b) (t = (a) * (b) + 128, ((t >> 8) + t) >> 8)
        const int r = nk - FL_MULDIV255(c, nk);
        const int g = nk - FL_MULDIV255(m, nk);
        const int b = nk - FL_MULDIV255(y, nk);
#undef FL_MULDIV255
        p[0] = (unsigned char)r;
        p[1] = (unsigned char)g;
        p[2] = (unsigned char)b;
    }
}

/* Whether an EOI marker (FF D9) occurs in [p, end). Entropy-coded data cannot contain one (an FF
 * there is followed by 00 or an RSTn code), so one found after the decoder's position ends the
 * image's data. */
static int has_eoi(const unsigned char *p, const unsigned char *end) {
    while (p < end) {
        const unsigned char *ff = (const unsigned char *)memchr(p, 0xFF, (size_t)(end - p));
        if (!ff || ff + 1 >= end) return 0;
        if (ff[1] == 0xD9) return 1;
        p = ff + 1;
    }
    return 0;
}

static void *xmalloc(fl_ctx *c, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fail(c, FL_ERR_NOMEM, "out of memory");
    return p;
}

/* Coefficients for one axis ("x" or "y") of the scaled image (`size` samples): the interval
 * [b0, b1) of the source (unscaled) axis, read only within the source interval [c0, c1), both
 * scaled by 1/denom. The clip window is rounded outwards to whole samples as the Pillow backend
 * does before its crop: the filter then sees that window as the whole image (edge weights
 * renormalised). Fails the call with what went wrong: no memory for the tables, or a box whose
 * edges on this axis meet once rounded to float (the sizes and filter are checked before). */
static void axis_coeffs(fl_ctx *c, fl_coeffs *co, const char *axis, int size, double b0, double b1,
                        double c0, double c1, int denom, int out_size, int filter) {
    double lo = floor(c0 / denom + 1e-6), hi = ceil(c1 / denom - 1e-6);
    int w0, w1;
    if (lo < 0) lo = 0;
    if (hi > size) hi = size;
    w0 = (int)lo;
    w1 = (int)hi;
    if (w1 <= w0) { /* a clip narrower than a pixel: keep the pixel it is in */
        if (w0 > size - 1) w0 = size - 1;
        w1 = w0 + 1;
    }
    switch (fl_coeffs_init(co, w1 - w0, b0 / denom - w0, b1 / denom - w0, out_size, filter)) {
    case FL_COEFFS_OK:
        break;
    case FL_COEFFS_ENOMEM:
        fail(c, FL_ERR_NOMEM, "out of memory for the resampling coefficients");
        break;
    default: {
        char msg[JMSG_LENGTH_MAX];
        snprintf(msg, sizeof msg,
                 "box [%.9g, %.9g) along %s is too thin to resample: its edges are equal in "
                 "float precision",
                 b0, b1, axis);
        fail(c, FL_ERR_ARG, msg);
    }
    }
    fl_coeffs_shift(co, -w0);
}

static int inside(const double inner[4], const double outer[4]) {
    return inner[0] >= outer[0] - FL_BOX_SLACK && inner[1] >= outer[1] - FL_BOX_SLACK &&
           inner[2] <= outer[2] + FL_BOX_SLACK && inner[3] <= outer[3] + FL_BOX_SLACK &&
           inner[2] > inner[0] && inner[3] > inner[1];
}

static void clamp_to(double r[4], const double outer[4]) {
    int i;
    for (i = 0; i < 2; i++) {
        if (r[i] < outer[i]) r[i] = outer[i];
        if (r[i + 2] > outer[i + 2]) r[i + 2] = outer[i + 2];
    }
}

typedef struct {
    const unsigned char *data;
    size_t len;
    const double *box, *clip; /* clip may be NULL */
    unsigned char *out;
    int out_h, out_w, flip, filter;
    int *scale_denom;
} decode_args;

static void decode_body(fl_ctx *c, void *arg) {
    const decode_args *a = (const decode_args *)arg;
    const unsigned char *data = a->data;
    const size_t len = a->len;
    const double *box_in = a->box, *clip_in = a->clip;
    const int out_h = a->out_h, out_w = a->out_w, flip = a->flip, filter = a->filter;
    struct jpeg_decompress_struct *cinfo = &c->cinfo;
    double box[4], clip[4];
    int width, height, denom, in_ch, h_ch, i;
    JDIMENSION sw, sh, xoff, cw, ry0, ry1, y, nb;
    size_t tmp_stride, row_stride;

    open_source(c, data, len);
    check_pixels(c);
    width = (int)cinfo->image_width;
    height = (int)cinfo->image_height;

    /* The box and the clip window, in source pixels. */
    {
        const double image[4] = {0.0, 0.0, (double)width, (double)height};
        for (i = 0; i < 4; i++) {
            box[i] = box_in[i];
            clip[i] = clip_in ? clip_in[i] : image[i];
        }
        if (!inside(clip, image)) {
            char msg[JMSG_LENGTH_MAX];
            snprintf(msg, sizeof msg, "clip (%g, %g, %g, %g) is empty or not inside the %dx%d image",
                     clip[0], clip[1], clip[2], clip[3], width, height);
            fail(c, FL_ERR_ARG, msg);
        }
        clamp_to(clip, image);
        if (!inside(box, clip)) {
            char msg[JMSG_LENGTH_MAX];
            snprintf(msg, sizeof msg,
                     "box (%g, %g, %g, %g) is empty or not inside the %s (%g, %g, %g, %g)", box[0],
                     box[1], box[2], box[3], clip_in ? "clip" : "image", clip[0], clip[1], clip[2],
                     clip[3]);
            fail(c, FL_ERR_ARG, msg);
        }
        clamp_to(box, clip);
    }

    denom = choose_denom(box[2] - box[0], box[3] - box[1], out_w, out_h);
    *a->scale_denom = denom;

    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
        cinfo->out_color_space = JCS_GRAYSCALE;
        in_ch = 1;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        cinfo->out_color_space = JCS_CMYK;
        in_ch = 4;
        break;
    default:
        /* RGBX: 4-byte pixels suit the SIMD resampler; libjpeg-turbo writes them as fast */
        cinfo->out_color_space = JCS_EXT_RGBX;
        in_ch = 4;
        break;
    }
    h_ch = in_ch == 1 ? 1 : 3; /* channels after the horizontal pass */
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)denom;
    cinfo->dct_method = JDCT_ISLOW;      /* what Pillow uses */
    cinfo->do_fancy_upsampling = TRUE;   /* likewise */

    jpeg_start_decompress(cinfo);
    sw = cinfo->output_width;
    sh = cinfo->output_height;

    /* Coefficients in the scaled image: DCT scaling maps source x to x / denom. */
    axis_coeffs(c, &c->ch, "x", (int)sw, box[0], box[2], clip[0], clip[2], denom, out_w, filter);
    axis_coeffs(c, &c->cv, "y", (int)sh, box[1], box[3], clip[1], clip[3], denom, out_h, filter);

    /* Columns: only those the horizontal pass reads; libjpeg may widen to an iMCU boundary. */
    xoff = (JDIMENSION)c->ch.first;
    cw = (JDIMENSION)(c->ch.last - c->ch.first);
    if (xoff > 0 || cw < sw) {
        jpeg_crop_scanline(cinfo, &xoff, &cw);
    }
    fl_coeffs_shift(&c->ch, (int)xoff);
    if (c->ch.first < 0 || (JDIMENSION)c->ch.last > cw || cinfo->output_width != cw) {
        fail(c, FL_ERR_CORRUPT, "unexpected crop window from jpeg_crop_scanline");
    }

    /* Rows: skip those above the box's support, stop after its last one. */
    ry0 = (JDIMENSION)c->cv.first;
    ry1 = (JDIMENSION)c->cv.last;
    if (ry0 > 0) {
        if (jpeg_skip_scanlines(cinfo, ry0) != ry0) fail(c, FL_ERR_CORRUPT, "cannot skip rows");
    }

    nb = cinfo->rec_outbuf_height > 0 ? (JDIMENSION)cinfo->rec_outbuf_height : 1;
    if (nb > 16) nb = 16;
    row_stride = (size_t)cw * (size_t)in_ch;
    tmp_stride = (size_t)out_w * (size_t)h_ch;
    c->rows = (unsigned char *)xmalloc(c, row_stride * nb);
    c->row_ptrs = (JSAMPROW *)xmalloc(c, sizeof(JSAMPROW) * nb);
    for (y = 0; y < nb; y++) c->row_ptrs[y] = c->rows + (size_t)y * row_stride;
    if ((size_t)(ry1 - ry0) > SIZE_MAX / tmp_stride) fail(c, FL_ERR_NOMEM, "image too large");
    c->tmp = (unsigned char *)xmalloc(c, tmp_stride * (size_t)(ry1 - ry0));
    c->acc = (int32_t *)xmalloc(c, tmp_stride * sizeof(int32_t));

    for (y = ry0; y < ry1;) {
        JDIMENSION want = ry1 - y < nb ? ry1 - y : nb, got, j;
        got = jpeg_read_scanlines(cinfo, c->row_ptrs, want);
        if (got == 0) fail(c, FL_ERR_CORRUPT, "decoder returned no rows");
        for (j = 0; j < got; j++) {
            unsigned char *row = c->row_ptrs[j];
            if (cinfo->out_color_space == JCS_CMYK) cmyk_to_rgbx_inplace(row, cw);
            fl_resample_row(row, in_ch, c->tmp + (size_t)(y + j - ry0) * tmp_stride, h_ch, &c->ch,
                            flip);
        }
        y += got;
    }

    /* We never read the rows below the box, so check that the data does go on to an EOI marker:
     * a truncated file fails whatever the crop, as in a full decode. */
    if (!jpeg_input_complete(cinfo) && cinfo->unread_marker != 0xD9) {
        const unsigned char *pos = cinfo->src->next_input_byte;
        const unsigned char *end = pos + cinfo->src->bytes_in_buffer;
        if (pos > data) pos--; /* an FF just consumed could start the marker */
        if (!(pos >= data && end <= data + len && has_eoi(pos, end))) {
            fail(c, FL_ERR_CORRUPT, "premature end of JPEG data (no EOI marker)");
        }
    }
    jpeg_abort_decompress(cinfo);

    fl_resample_columns(c->tmp, tmp_stride, (int)ry0, out_w, h_ch, a->out, (size_t)out_w * 3,
                        &c->cv, c->acc);
}

int fl_jpeg_decode_crop_resize(const unsigned char *data, size_t len, const double box[4],
                               const double clip[4], unsigned char *out, int out_h, int out_w,
                               int flip, int filter, int *scale_denom, char *errmsg) {
    decode_args a = {data, len, box, clip, out, out_h, out_w, flip, filter, scale_denom};
    int i;

    if (out_h <= 0 || out_w <= 0 || out_h > 65535 || out_w > 65535) {
        set_msg(errmsg, "", "output size must be between 1 and 65535 in both dimensions");
        return FL_ERR_ARG;
    }
    if (!fl_filter_valid(filter)) {
        set_msg(errmsg, "", "unknown filter (use Pillow's numbering: NEAREST=0, LANCZOS=1, "
                            "BILINEAR=2, BICUBIC=3, BOX=4, HAMMING=5)");
        return FL_ERR_ARG;
    }
    for (i = 0; i < 4; i++) {
        if (!isfinite(box[i]) || (clip && !isfinite(clip[i]))) {
            set_msg(errmsg, "", "box and clip coordinates must be finite");
            return FL_ERR_ARG;
        }
    }
    return guarded(decode_body, &a, errmsg);
}
