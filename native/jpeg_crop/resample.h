/* PIL's (pillow-simd 12) bilinear resize of an RGBX image, computing only a window of the output.
 *
 * resample_window() gives, for the output pixels [left, left + win_w) x [top, top + win_h) of
 * `Image.resize((out_w, out_h), Image.BILINEAR, box=box)` on the RGBX image `in`, the same
 * values PIL computes: the same coefficients (double arithmetic on the float32 box, as
 * ImagingResample), the same 16-bit fixed-point normalisation (its precision chosen over the
 * WHOLE output axis, as PIL does), the same integer sums and rounding, horizontal pass first,
 * each pass skipped where PIL skips it. Only the input rows the window's output rows read are
 * resampled horizontally, and only the window's columns. The result's three colour channels
 * are written through strides (so an HWC view of a CHW batch slot works), mirrored if `flip`.
 * No Python calls: safe without the GIL.
 */
#ifndef JPEG_CROP_RESAMPLE_H
#define JPEG_CROP_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct resample_out {
    uint8_t *data;          /* pixel (0, 0), channel 0 of the window */
    ptrdiff_t row, column, channel;  /* byte strides */
    int width, height;      /* the window's size */
    int flip;               /* mirror the columns */
};

/* 0 on success, -1 if memory ran out. `box` = (x0, y0, x1, y1) in input pixels, as PIL takes it. */
int resample_window(const uint8_t *in, size_t in_stride, int in_w, int in_h, const float box[4],
                    int out_w, int out_h, int left, int top, const struct resample_out *out);

/* Use the kernels of `level`: 0 scalar, 1 SSE2, 2 AVX2 (-1, or a level this CPU lacks: the best it has).
 * Returns the level now used. Every level computes the same bytes; tests compare them. */
int resample_simd(int level);

#endif
