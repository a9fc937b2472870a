/* fl_encode: encode pixels as a baseline JPEG; see fl_encode.h. */
#include "fl_encode.h"

#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "fl_jpeg.h"

/* Everything one call owns, on the heap so that its fields are reliable after a longjmp (the
 * decoder's NOTE [ guarded calls ] in fl_jpeg.c explains the rule; this is its encoder twin). */
typedef struct {
    struct jpeg_compress_struct cinfo;
    struct jpeg_error_mgr err;
    struct jpeg_destination_mgr dest;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    int status;         /* reported when a longjmp arrives (default FL_ERR_CORRUPT) */
    unsigned char *buf; /* the output, grown by doubling */
    size_t cap;
} fl_enc;

static void enc_error_exit(j_common_ptr cinfo) {
    fl_enc *e = (fl_enc *)cinfo->client_data;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jump, 1);
}

static void enc_output_message(j_common_ptr cinfo) {
    (void)cinfo; /* never print to stderr */
}

static void enc_fail(fl_enc *e, int status, const char *msg) {
    e->status = status;
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jump, 1);
}

/* A destination in memory of our own (not jpeg_mem_dest, whose buffer a longjmp would leak). */
static void dest_init(j_compress_ptr cinfo) {
    fl_enc *e = (fl_enc *)cinfo->client_data;
    e->dest.next_output_byte = e->buf;
    e->dest.free_in_buffer = e->cap;
}

static boolean dest_empty(j_compress_ptr cinfo) {
    /* Called when the buffer is full (all of it, whatever free_in_buffer says): double it. */
    fl_enc *e = (fl_enc *)cinfo->client_data;
    size_t used = e->cap;
    unsigned char *grown = (unsigned char *)realloc(e->buf, 2 * e->cap);
    if (!grown) enc_fail(e, FL_ERR_NOMEM, "out of memory for the encoded JPEG");
    e->buf = grown;
    e->cap *= 2;
    e->dest.next_output_byte = e->buf + used;
    e->dest.free_in_buffer = e->cap - used;
    return TRUE;
}

static void dest_term(j_compress_ptr cinfo) {
    (void)cinfo; /* the length is cap - free_in_buffer, read by the caller */
}

static void enc_free(fl_enc *e) {
    jpeg_destroy_compress(&e->cinfo); /* safe before or after jpeg_create_compress completed */
    free(e->buf);
    free(e);
}

int fl_jpeg_encode(const unsigned char *pixels, int width, int height, int channels, int quality,
                   unsigned char **out, size_t *out_len, char *errmsg) {
    fl_enc *e;
    int status;
    *out = NULL;
    *out_len = 0;
    if (width <= 0 || height <= 0 || width > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION ||
        (channels != 1 && channels != 3) || quality < 1 || quality > 100) {
        if (errmsg)
            snprintf(errmsg, FL_ERRMSG_LEN,
                     "cannot encode %d x %d x %d at quality %d: sides must be 1..%d, channels 1 or "
                     "3, quality 1..100",
                     width, height, channels, quality, (int)JPEG_MAX_DIMENSION);
        return FL_ERR_ARG;
    }
    e = (fl_enc *)calloc(1, sizeof(fl_enc));
    if (!e) {
        if (errmsg) snprintf(errmsg, FL_ERRMSG_LEN, "out of memory");
        return FL_ERR_NOMEM;
    }
    e->status = FL_ERR_CORRUPT;
    /* A first guess of the size (about 2 bits a sample, plus headers); grown when short. */
    e->cap = (size_t)width * (size_t)height * (size_t)channels / 4 + 4096;
    e->buf = (unsigned char *)malloc(e->cap);
    e->cinfo.err = jpeg_std_error(&e->err);
    e->err.error_exit = enc_error_exit;
    e->err.output_message = enc_output_message;
    e->cinfo.client_data = e;
    if (setjmp(e->jump)) {
        status = e->status;
        if (errmsg) snprintf(errmsg, FL_ERRMSG_LEN, "%s", e->msg);
        enc_free(e);
        return status;
    }
    if (!e->buf) enc_fail(e, FL_ERR_NOMEM, "out of memory for the encoded JPEG");
    jpeg_create_compress(&e->cinfo);
    e->dest.init_destination = dest_init;
    e->dest.empty_output_buffer = dest_empty;
    e->dest.term_destination = dest_term;
    e->cinfo.dest = &e->dest;
    e->cinfo.image_width = (JDIMENSION)width;
    e->cinfo.image_height = (JDIMENSION)height;
    e->cinfo.input_components = channels;
    e->cinfo.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&e->cinfo); /* YCbCr 4:2:0 for RGB, JFIF marker, islow DCT */
    jpeg_set_quality(&e->cinfo, quality, TRUE);
    e->cinfo.optimize_coding = TRUE;
    e->cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_compress(&e->cinfo, TRUE);
    while (e->cinfo.next_scanline < e->cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)e->cinfo.next_scanline * (size_t)width * (size_t)channels);
        jpeg_write_scanlines(&e->cinfo, &row, 1);
    }
    jpeg_finish_compress(&e->cinfo);
    *out_len = e->cap - e->dest.free_in_buffer;
    *out = e->buf;
    e->buf = NULL; /* now the caller's */
    enc_free(e);
    return FL_OK;
}
