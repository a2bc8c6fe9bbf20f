/* Region decode of one JPEG with the system libjpeg-turbo: the rows and columns that cover a box.
 *
 * header(data) -> (width, height, color_space) | raises JpegError
 * decode_into(data, out, scale_denom, x0, y0, x1, y1) -> (xs, ys, xe, ye) | None
 * resize_into(canvas, width, height, bx0, by0, bx1, by1, out_width, out_height, left, top, out, flip
 *             [, x0, y0, stride]) -> None
 *
 * decode_into decodes the image at 1/scale_denom (libjpeg's DCT scaling) and writes the pixels of
 * the region covering [x0, x1) x [y0, y1) (scaled coordinates) as RGBX into `out`, a writable
 * C-contiguous buffer holding the WHOLE scaled image (out_height rows of out_width * 4 bytes):
 * each pixel lands where a full decode would put it, so the caller can resample with the same
 * image geometry as a full decode. Only the written rectangle [xs, xe) x [ys, ye) is defined;
 * it contains the requested one (columns widen to iMCU boundaries). Rows above y0 are skipped
 * (jpeg_skip_scanlines), columns outside are not decoded (jpeg_crop_scanline), and decoding
 * stops after row y1 - 1. Settings equal PIL's default JPEG decode: JDCT_ISLOW, fancy
 * upsampling, the colour space libjpeg infers from the markers.
 * Returns None (decodes nothing) for colour spaces other than YCbCr, RGB and grayscale (CMYK,
 * YCCK): the caller decodes those another way. libjpeg errors and a premature end of data raise
 * JpegError with libjpeg's message; other libjpeg warnings are ignored, as PIL ignores them.
 *
 * resize_into writes into `out`, a writable (rows, columns, 3) uint8 buffer with any strides, the
 * window [left, left + columns) x [top, top + rows) of PIL's
 * `image.resize((out_width, out_height), Image.BILINEAR, box=(bx0, by0, bx1, by1))`, where `image`
 * is the RGBX image of width x height at pixel (x0, y0) of `canvas`, whose rows are `stride` pixels
 * long (default 0, 0 and width: the whole canvas; else what `canvas_image.crop((x0, y0, x0 + width,
 * y0 + height))` gives PIL): the same pixel values, computing only the window (resample.h), columns
 * mirrored if `flip`. Only the image's pixels are read. The GIL is released while it runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "resample.h"

static PyObject *JpegError;

struct error_manager {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct error_manager *err = (struct error_manager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    /* Warnings (level -1) are ignored except running out of data: libjpeg would fill the rest
     * of the image with gray, where PIL reports a truncated file. Never print to stderr. */
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
        on_error(cinfo);
}

static void on_output(j_common_ptr cinfo) { (void)cinfo; }

static void init_errors(struct jpeg_decompress_struct *cinfo, struct error_manager *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->pub.output_message = on_output;
    err->message[0] = '\0';
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    init_errors(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_SetString(JpegError, err.message);
        return NULL;
    }
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    result = Py_BuildValue("(IIi)", cinfo.image_width, cinfo.image_height, (int)cinfo.jpeg_color_space);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return result;
}

struct region {
    unsigned int scale_denom, x0, y0, x1, y1;  /* request */
    unsigned int xs, ys, xe, ye;               /* written */
    int unsupported, failed;
};

/* The decode proper, without the GIL: no Python calls in here. */
static void decode_region(const unsigned char *bytes, size_t length, unsigned char *out, size_t out_length,
                          struct region *r, char *message) {
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    JDIMENSION xoffset, width, row;
    size_t stride;
    init_errors(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        strncpy(message, err.message, JMSG_LENGTH_MAX);
        r->failed = 1;
        return;
    }
    jpeg_mem_src(&cinfo, bytes, (unsigned long)length);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_RGB &&
        cinfo.jpeg_color_space != JCS_GRAYSCALE) {
        jpeg_destroy_decompress(&cinfo);
        r->unsupported = 1;
        return;
    }
    cinfo.out_color_space = JCS_EXT_RGBX;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = r->scale_denom;
    jpeg_calc_output_dimensions(&cinfo);
    stride = (size_t)cinfo.output_width * 4;
    if (stride * cinfo.output_height > out_length) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(message, JMSG_LENGTH_MAX, "output buffer of %zu bytes is smaller than the %ux%u RGBX image",
                 out_length, cinfo.output_width, cinfo.output_height);
        r->failed = 2;
        return;
    }
    if (r->x1 > cinfo.output_width) r->x1 = cinfo.output_width;
    if (r->y1 > cinfo.output_height) r->y1 = cinfo.output_height;
    if (r->x0 >= r->x1 || r->y0 >= r->y1) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(message, JMSG_LENGTH_MAX, "empty region for a %ux%u image", cinfo.output_width,
                 cinfo.output_height);
        r->failed = 2;
        return;
    }
    jpeg_start_decompress(&cinfo);
    xoffset = r->x0;
    width = r->x1 - r->x0;
    if (width < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &xoffset, &width);  /* widens the left edge to an iMCU boundary */
    if (r->y0 > 0)
        jpeg_skip_scanlines(&cinfo, r->y0);
    r->ys = cinfo.output_scanline;
    while (cinfo.output_scanline < r->y1) {
        JSAMPROW pointer = out + (size_t)cinfo.output_scanline * stride + (size_t)xoffset * 4;
        row = jpeg_read_scanlines(&cinfo, &pointer, 1);
        if (row != 1) {  /* cannot happen with a memory source; never loop forever */
            jpeg_destroy_decompress(&cinfo);
            snprintf(message, JMSG_LENGTH_MAX, "libjpeg returned no scanline at row %u", cinfo.output_scanline);
            r->failed = 1;
            return;
        }
    }
    r->xs = xoffset;
    r->xe = xoffset + width;
    r->ye = cinfo.output_scanline;
    jpeg_abort_decompress(&cinfo);  /* the rows below are not needed */
    jpeg_destroy_decompress(&cinfo);
}

static PyObject *decode_into(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    struct region r;
    char message[JMSG_LENGTH_MAX];
    (void)self;
    memset(&r, 0, sizeof(r));
    if (!PyArg_ParseTuple(args, "y*w*IIIII", &data, &out, &r.scale_denom, &r.x0, &r.y0, &r.x1, &r.y1))
        return NULL;
    if (r.scale_denom != 1 && r.scale_denom != 2 && r.scale_denom != 4 && r.scale_denom != 8) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, not %u", r.scale_denom);
        return NULL;
    }
    if (!PyBuffer_IsContiguous(&out, 'C')) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous buffer");
        return NULL;
    }
    message[0] = '\0';
    Py_BEGIN_ALLOW_THREADS
    decode_region((const unsigned char *)data.buf, (size_t)data.len, (unsigned char *)out.buf, (size_t)out.len,
                  &r, message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (r.failed) {
        PyErr_SetString(r.failed == 1 ? JpegError : PyExc_ValueError, message);
        return NULL;
    }
    if (r.unsupported)
        Py_RETURN_NONE;
    return Py_BuildValue("(IIII)", r.xs, r.ys, r.xe, r.ye);
}

static int window_buffer(PyObject *object, Py_buffer *view, struct resample_out *out) {
    if (PyObject_GetBuffer(object, view, PyBUF_RECORDS) < 0)
        return -1;
    if (view->ndim != 3 || view->shape[2] != 3 || view->itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "out must be a (rows, columns, 3) uint8 buffer");
        PyBuffer_Release(view);
        return -1;
    }
    out->data = (uint8_t *)view->buf;
    out->row = view->strides[0];
    out->column = view->strides[1];
    out->channel = view->strides[2];
    out->height = (int)view->shape[0];
    out->width = (int)view->shape[1];
    return 0;
}

static PyObject *resize_into(PyObject *self, PyObject *args) {
    Py_buffer canvas, view;
    PyObject *out_object;
    struct resample_out out;
    int width, height, out_width, out_height, left, top, flip, status, x0 = 0, y0 = 0, stride = 0;
    size_t extent;
    double box_d[4];
    float box[4];
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiddddiiiiOp|iii", &canvas, &width, &height, &box_d[0], &box_d[1], &box_d[2],
                          &box_d[3], &out_width, &out_height, &left, &top, &out_object, &flip, &x0, &y0, &stride))
        return NULL;
    if (stride == 0)
        stride = width;
    if (window_buffer(out_object, &view, &out) < 0) {
        PyBuffer_Release(&canvas);
        return NULL;
    }
    out.flip = flip;
    for (status = 0; status < 4; status++)
        box[status] = (float)box_d[status]; /* PIL takes the box as C floats */
    /* the bytes the image [x0, x0 + width) x [y0, y0 + height) of a canvas `stride` pixels wide spans */
    extent = width > 0 && height > 0 && x0 >= 0 && y0 >= 0 && x0 + width <= stride
                 ? ((size_t)(y0 + height - 1) * stride + x0 + width) * 4 : (size_t)-1;
    if (width <= 0 || height <= 0 || extent == (size_t)-1 || (size_t)canvas.len < extent || out_width <= 0 ||
        out_height <= 0 || left < 0 || top < 0 || out.width <= 0 || out.height <= 0 ||
        left + out.width > out_width || top + out.height > out_height || box[0] < 0 || box[1] < 0 ||
        box[2] > width || box[3] > height || box[0] >= box[2] || box[1] >= box[3]) {
        PyBuffer_Release(&canvas);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "resize_into: a %dx%d window at (%d, %d) of a %dx%d resize of a %dx%d "
                     "image at (%d, %d) of a canvas %d px wide (%zd bytes) does not fit", out.width, out.height,
                     left, top, out_width, out_height, width, height, x0, y0, stride, canvas.len);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = resample_window((const uint8_t *)canvas.buf + ((size_t)y0 * stride + x0) * 4, (size_t)stride * 4,
                             width, height, box, out_width,
                             out_height, left, top, &out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&canvas);
    PyBuffer_Release(&view);
    if (status < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *simd(PyObject *self, PyObject *args) {
    int level = -1;
    if (!PyArg_ParseTuple(args, "|i", &level))
        return NULL;
    return PyLong_FromLong(resample_simd(level));
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS, "header(data) -> (width, height, libjpeg J_COLOR_SPACE number)"},
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(data, out, scale_denom, x0, y0, x1, y1) -> (xs, ys, xe, ye) written, or None if unsupported"},
    {"resize_into", resize_into, METH_VARARGS,
     "resize_into(canvas, width, height, bx0, by0, bx1, by1, out_width, out_height, left, top, out, flip[, x0, y0, "
     "stride]) -> None"},
    {"simd", simd, METH_VARARGS,
     "simd(level=-1) -> the resize kernels now used (0 scalar, 1 SSE2, 2 AVX2); level: use that one, or the best "
     "this CPU has (-1 or a level above it). Every level computes the same bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_crop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_crop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    JpegError = PyErr_NewException("_jpeg_crop.JpegError", PyExc_OSError, NULL);
    if (PyModule_AddObject(m, "JpegError", JpegError) < 0 ||
        PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "JCS_GRAYSCALE", JCS_GRAYSCALE) < 0 ||
        PyModule_AddIntConstant(m, "JCS_RGB", JCS_RGB) < 0 ||
        PyModule_AddIntConstant(m, "JCS_YCbCr", JCS_YCbCr) < 0) {
        Py_XDECREF(JpegError);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
