/*
 * fastload._jpeg: the Python binding of fl_jpeg (the only file that includes Python.h).
 *
 * Every call holds the buffers it was given (buffer protocol) and releases the GIL for the whole
 * per-image work, so decoding scales across Python threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "fl_encode.h"
#include "fl_jpeg.h"
#include "fl_pixels.h"
#include "fl_resample.h"

static PyObject *raise_status(int status, const char *msg, const char *corrupt_prefix) {
    switch (status) {
    case FL_ERR_NOMEM: /* MemoryError, saying what could not be allocated when the C side says */
        if (msg[0] == '\0') return PyErr_NoMemory();
        PyErr_SetString(PyExc_MemoryError, msg);
        return NULL;
    case FL_ERR_ARG:
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    default:
        PyErr_Format(PyExc_ValueError, "%s%s", corrupt_prefix, msg);
        return NULL;
    }
}

/* Get a contiguous read-only view of `obj`; TypeError if it is not bytes-like. */
static int get_data(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "data must be a contiguous bytes-like object, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(jpeg_size_doc,
             "jpeg_size(data) -> (width, height)\n\n"
             "Read a JPEG header. Raises ValueError if `data` is not a JPEG or its header is corrupt.");

static PyObject *py_jpeg_size(PyObject *self, PyObject *arg) {
    Py_buffer view;
    char msg[FL_ERRMSG_LEN] = "";
    int w = 0, h = 0, status;
    (void)self;
    if (get_data(arg, &view) != 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = fl_jpeg_size((const unsigned char *)view.buf, (size_t)view.len, &w, &h, msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status != FL_OK) return raise_status(status, msg, "not a JPEG or corrupt header: ");
    return Py_BuildValue("(ii)", w, h);
}

PyDoc_STRVAR(
    decode_doc,
    "decode_crop_resize(data, box, out, out_h, out_w, flip=False, filter=2, clip=None) -> int\n\n"
    "Decode the JPEG `data`, resample the source box `box` = (left, top, right, bottom) (floats,\n"
    "in pixels of the unscaled image) to out_h x out_w, mirror it left-right when `flip`, and\n"
    "write RGB into `out`, a writable C-contiguous uint8 buffer of shape (out_h, out_w, 3) (or\n"
    "flat, of out_h * out_w * 3 bytes). Only the rows and columns the resampling reads are\n"
    "decoded, at the coarsest DCT scale (1/1, 1/2, 1/4, 1/8) that leaves the box at least as large\n"
    "as the output. `filter` uses Pillow's Image.Resampling numbering: NEAREST=0, LANCZOS=1,\n"
    "BILINEAR=2, BICUBIC=3, BOX=4, HAMMING=5; the result matches\n"
    "Image.resize((out_w, out_h), filter, box=box) on a full decode up to the DCT scaling.\n"
    "`clip` (optional, same form, containing `box`) bounds the pixels the filter may read, as if\n"
    "the image were first cropped to it (rounded outwards to whole pixels): torchvision's\n"
    "crop-then-resize; for a RandomResizedCrop pass clip=box. None: no bound, as Pillow.\n"
    "Returns the DCT scale denominator used (1, 2, 4 or 8).\n\n"
    "Raises ValueError('corrupt JPEG: ...') for bad or truncated data, ValueError for a box\n"
    "outside the image or a wrongly sized `out`, TypeError for arguments of the wrong type.\n"
    "The GIL is released while decoding.");

static PyObject *py_decode_crop_resize(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "box", "out", "out_h", "out_w", "flip", "filter", "clip", NULL};
    PyObject *data_obj, *out_obj, *clip_obj = Py_None;
    double box[4], clip[4];
    int out_h, out_w, flip = 0, filter = FL_FILTER_BILINEAR, denom = 0, status;
    Py_buffer data, out;
    char msg[FL_ERRMSG_LEN] = "";
    Py_ssize_t need;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(dddd)Oii|piO:decode_crop_resize", kwlist,
                                     &data_obj, &box[0], &box[1], &box[2], &box[3], &out_obj,
                                     &out_h, &out_w, &flip, &filter, &clip_obj)) {
        return NULL;
    }
    if (clip_obj != Py_None) {
        PyObject *t = PySequence_Tuple(clip_obj);
        int ok;
        if (!t) return NULL;
        ok = PyArg_ParseTuple(t, "dddd;clip must be None or 4 numbers (left, top, right, bottom)",
                              &clip[0], &clip[1], &clip[2], &clip[3]);
        Py_DECREF(t);
        if (!ok) return NULL;
    }
    if (out_h <= 0 || out_w <= 0 || out_h > 65535 || out_w > 65535) {
        PyErr_Format(PyExc_ValueError, "out_h and out_w must be in 1..65535, got %d x %d", out_h,
                     out_w);
        return NULL;
    }
    need = (Py_ssize_t)out_h * out_w * 3;
    if (get_data(data_obj, &data) != 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&data);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "out must be a writable C-contiguous uint8 buffer, not %.100s",
                     Py_TYPE(out_obj)->tp_name);
        return NULL;
    }
    if (out.itemsize != 1 ||
        (out.format != NULL && strcmp(out.format, "B") != 0 && strcmp(out.format, "=B") != 0 &&
         strcmp(out.format, "<B") != 0 && strcmp(out.format, ">B") != 0 &&
         strcmp(out.format, "|B") != 0)) {
        PyErr_Format(PyExc_TypeError, "out must hold uint8 items, not format '%s'",
                     out.format ? out.format : "?");
        goto fail;
    }
    if (out.ndim == 3 && out.shape != NULL) {
        if (out.shape[0] != out_h || out.shape[1] != out_w || out.shape[2] != 3) {
            PyErr_Format(PyExc_ValueError, "out has shape (%zd, %zd, %zd), expected (%d, %d, 3)",
                         out.shape[0], out.shape[1], out.shape[2], out_h, out_w);
            goto fail;
        }
    } else if (out.ndim > 1) {
        PyErr_Format(PyExc_ValueError, "out must have shape (%d, %d, 3) or be flat, got %d dims",
                     out_h, out_w, out.ndim);
        goto fail;
    }
    if (out.len != need) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, expected %zd (%d x %d x 3)", out.len,
                     need, out_h, out_w);
        goto fail;
    }

    Py_BEGIN_ALLOW_THREADS
    status = fl_jpeg_decode_crop_resize((const unsigned char *)data.buf, (size_t)data.len, box,
                                        clip_obj == Py_None ? NULL : clip,
                                        (unsigned char *)out.buf, out_h, out_w, flip, filter,
                                        &denom, msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    if (status != FL_OK) return raise_status(status, msg, "corrupt JPEG: ");
    return PyLong_FromLong(denom);

fail:
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return NULL;
}

PyDoc_STRVAR(entropy_doc,
             "entropy_decode_only(data) -> None\n\n"
             "Entropy-decode the whole JPEG (jpeg_read_coefficients) and discard the result: the\n"
             "floor any decoder pays. Raises ValueError('corrupt JPEG: ...') for bad data.");

static PyObject *py_entropy_decode_only(PyObject *self, PyObject *arg) {
    Py_buffer view;
    char msg[FL_ERRMSG_LEN] = "";
    int status;
    (void)self;
    if (get_data(arg, &view) != 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = fl_jpeg_entropy_decode((const unsigned char *)view.buf, (size_t)view.len, msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status != FL_OK) return raise_status(status, msg, "corrupt JPEG: ");
    Py_RETURN_NONE;
}

PyDoc_STRVAR(
    encode_doc,
    "encode_jpeg(pixels, width, height, quality) -> bytes\n\n"
    "Encode `pixels`, a C-contiguous uint8 buffer of height x width RGB pixels (width * height * 3\n"
    "bytes) or gray ones (width * height bytes), as a baseline JPEG at `quality` (1..100): 4:2:0\n"
    "chroma for RGB, optimised Huffman tables, no metadata. The same input gives the same bytes.\n"
    "Raises ValueError for a size, buffer length or quality out of range. The GIL is released.");

static PyObject *py_encode_jpeg(PyObject *self, PyObject *args) {
    PyObject *pixels_obj, *result;
    int width, height, quality, channels, status;
    Py_buffer pixels;
    unsigned char *out = NULL;
    size_t out_len = 0;
    char msg[FL_ERRMSG_LEN] = "";
    (void)self;
    if (!PyArg_ParseTuple(args, "Oiii:encode_jpeg", &pixels_obj, &width, &height, &quality)) return NULL;
    if (width <= 0 || height <= 0) {
        PyErr_Format(PyExc_ValueError, "encode_jpeg: width and height must be positive, got %d x %d", width,
                     height);
        return NULL;
    }
    if (PyObject_GetBuffer(pixels_obj, &pixels, PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "pixels must be a C-contiguous uint8 buffer, not %.100s",
                     Py_TYPE(pixels_obj)->tp_name);
        return NULL;
    }
    if (pixels.len == (Py_ssize_t)width * height * 3) {
        channels = 3;
    } else if (pixels.len == (Py_ssize_t)width * height) {
        channels = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "encode_jpeg: %zd bytes are neither %d x %d RGB nor gray pixels",
                     pixels.len, width, height);
        PyBuffer_Release(&pixels);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = fl_jpeg_encode((const unsigned char *)pixels.buf, width, height, channels, quality, &out,
                            &out_len, msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&pixels);
    if (status != FL_OK) return raise_status(status, msg, "cannot encode JPEG: ");
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_len);
    free(out);
    return result;
}

PyDoc_STRVAR(normalize_doc,
             "normalize_u8(src, dst, scale, bias) -> None\n\n"
             "dst = src * scale + bias per channel: `src` a C-contiguous uint8 buffer of interleaved RGB\n"
             "(NHWC), `dst` a writable C-contiguous float32 buffer of as many items, `scale` and `bias`\n"
             "3 floats each. Rounds as torch's x.float().mul_(scale).add_(bias). The GIL is released.");

static PyObject *py_normalize_u8(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    float scale[3], bias[3];
    Py_buffer src, dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO(fff)(fff):normalize_u8", &src_obj, &dst_obj, &scale[0], &scale[1],
                          &scale[2], &bias[0], &bias[1], &bias[2])) {
        return NULL;
    }
    if (get_data(src_obj, &src) != 0) return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&src);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "dst must be a writable C-contiguous float32 buffer, not %.100s",
                     Py_TYPE(dst_obj)->tp_name);
        return NULL;
    }
    if (dst.itemsize != 4 || (dst.format != NULL && strcmp(dst.format, "f") != 0 &&
                              strcmp(dst.format, "<f") != 0 && strcmp(dst.format, "=f") != 0)) {
        PyErr_Format(PyExc_TypeError, "dst must hold float32 items, not format '%s'",
                     dst.format ? dst.format : "?");
        goto fail;
    }
    if (src.len % 3 != 0 || dst.len != 4 * src.len) {
        PyErr_Format(PyExc_ValueError, "src has %zd bytes (a multiple of 3 needed) and dst %zd; dst must "
                     "hold one float32 per source byte", src.len, dst.len);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    fl_normalize_u8((const unsigned char *)src.buf, (float *)dst.buf, (size_t)src.len / 3, scale, bias);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;

fail:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return NULL;
}

PyDoc_STRVAR(color_jitter_doc,
             "color_jitter(images, count, order, factors) -> None\n\n"
             "ColorJitter's brightness (0), contrast (1) and saturation (2), in place, as torchvision v2's\n"
             "uint8 kernels: `images` a writable C-contiguous uint8 buffer of `count` interleaved-RGB\n"
             "images of equal size, `order` int64 (count, 4) (the operation at each position; other\n"
             "values: none), `factors` float32 (count, 3). The GIL is released.");

static PyObject *py_color_jitter(PyObject *self, PyObject *args) {
    PyObject *images_obj, *order_obj, *factors_obj;
    Py_ssize_t count;
    Py_buffer images, order, factors;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnOO:color_jitter", &images_obj, &count, &order_obj, &factors_obj)) {
        return NULL;
    }
    if (PyObject_GetBuffer(images_obj, &images, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "images must be a writable C-contiguous uint8 buffer");
        return NULL;
    }
    if (get_data(order_obj, &order) != 0) {
        PyBuffer_Release(&images);
        return NULL;
    }
    if (get_data(factors_obj, &factors) != 0) {
        PyBuffer_Release(&order);
        PyBuffer_Release(&images);
        return NULL;
    }
    if (count <= 0 || images.len % (3 * count) != 0 || order.len != 32 * count || factors.len != 12 * count) {
        PyErr_Format(PyExc_ValueError, "color_jitter: %zd images need %zd-byte order (int64 x 4) and "
                     "%zd-byte factors (float32 x 3), and images of 3 * count * pixels bytes; got %zd, "
                     "%zd and %zd", count, 32 * count, 12 * count, order.len, factors.len, images.len);
        PyBuffer_Release(&factors);
        PyBuffer_Release(&order);
        PyBuffer_Release(&images);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    fl_color_jitter((unsigned char *)images.buf, (size_t)count, (size_t)(images.len / (3 * count)),
                    (const long long *)order.buf, (const float *)factors.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&factors);
    PyBuffer_Release(&order);
    PyBuffer_Release(&images);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(mixup_doc,
             "mixup(images, count, lam, one_minus_lam) -> None\n\n"
             "MixUp in place: `images` a writable C-contiguous float32 buffer of `count` equal images;\n"
             "image i becomes image_i * lam + image_{i-1} * one_minus_lam (image_{-1}: the last), with\n"
             "torch's roundings. The GIL is released.");

static PyObject *py_mixup(PyObject *self, PyObject *args) {
    PyObject *images_obj;
    Py_ssize_t count;
    float lam, one_minus_lam;
    Py_buffer images;
    int status;
    (void)self;
    if (!PyArg_ParseTuple(args, "Onff:mixup", &images_obj, &count, &lam, &one_minus_lam)) return NULL;
    if (PyObject_GetBuffer(images_obj, &images, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "images must be a writable C-contiguous float32 buffer");
        return NULL;
    }
    if (count <= 0 || images.len % (4 * count) != 0) {
        PyErr_Format(PyExc_ValueError, "mixup: %zd bytes are not %zd equal float32 images", images.len, count);
        PyBuffer_Release(&images);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = fl_mixup((float *)images.buf, (size_t)count, (size_t)(images.len / (4 * count)), lam, one_minus_lam);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&images);
    if (status != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_set_simd(PyObject *self, PyObject *arg) {
    int enable;
    (void)self;
    if (arg == Py_None) {
        enable = -1;
    } else {
        enable = PyObject_IsTrue(arg);
        if (enable < 0) return NULL;
    }
    return PyBool_FromLong(fl_resample_simd(enable));
}

static PyMethodDef methods[] = {
    {"_set_simd", py_set_simd, METH_O,
     "_set_simd(enable: bool | None) -> bool\n\nTesting aid: use (True, the default where the CPU "
     "has AVX2) or avoid (False) the SIMD resampler; None only queries. Returns whether SIMD is "
     "in use. Outputs are identical either way."},
    {"jpeg_size", py_jpeg_size, METH_O, jpeg_size_doc},
    {"decode_crop_resize", (PyCFunction)(void (*)(void))py_decode_crop_resize,
     METH_VARARGS | METH_KEYWORDS, decode_doc},
    {"entropy_decode_only", py_entropy_decode_only, METH_O, entropy_doc},
    {"encode_jpeg", py_encode_jpeg, METH_VARARGS, encode_doc},
    {"normalize_u8", py_normalize_u8, METH_VARARGS, normalize_doc},
    {"color_jitter", py_color_jitter, METH_VARARGS, color_jitter_doc},
    {"mixup", py_mixup, METH_VARARGS, mixup_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "fastload._jpeg",
    "Native JPEG decode of only what a crop keeps (libjpeg-turbo), with Pillow-compatible\n"
    "resampling. Filters use Pillow's Image.Resampling numbering.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "NEAREST", FL_FILTER_NEAREST) < 0 ||
        PyModule_AddIntConstant(m, "LANCZOS", FL_FILTER_LANCZOS) < 0 ||
        PyModule_AddIntConstant(m, "BILINEAR", FL_FILTER_BILINEAR) < 0 ||
        PyModule_AddIntConstant(m, "BICUBIC", FL_FILTER_BICUBIC) < 0 ||
        PyModule_AddIntConstant(m, "BOX", FL_FILTER_BOX) < 0 ||
        PyModule_AddIntConstant(m, "HAMMING", FL_FILTER_HAMMING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
