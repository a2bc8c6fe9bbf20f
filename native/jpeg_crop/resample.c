/* See resample.h. The arithmetic mirrors libImaging/Resample.c of pillow-simd 12 (bilinear, 8 bits
 * per channel); any change there shows up in tests/test_jpeg_crop.py, which compares whole outputs. */
#include "resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h> /* baseline on x86-64: the same integer sums as PIL's SIMD code, 4 channels at once */
#endif
#if defined(__x86_64__) && defined(__GNUC__)
/* AVX2 kernels, compiled for AVX2 alone and chosen at run time where the CPU has it (the module itself
 * stays baseline x86-64). Integer sums are exact whatever their grouping: every path gives the same bytes. */
#define RESAMPLE_AVX2 1
#include <immintrin.h>
#define TARGET_AVX2 __attribute__((target("avx2")))
#endif

#define PRECISION_BITS (32 - 8 - 2)
#define MAX_COEFS_PRECISION (16 - 1)
#define SCRATCH_LIMIT (16u << 20) /* bytes of intermediate rows kept between calls (per thread) */

struct axis {
    int ksize, precision;
    int *first, *count; /* per output pixel: first input pixel read, how many */
    int32_t *k;         /* ksize fixed-point coefficients per output pixel */
    double *weights;    /* the same in double, before normalisation to fixed point */
};

static double bilinear(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static void axis_free(struct axis *a) {
    free(a->first);
    free(a->count);
    free(a->k);
    free(a->weights);
}

/* Coefficients of every output pixel of the axis: the precision depends on the largest of them all. */
static int axis_init(struct axis *a, int in_size, float in0, float in1, int out_size) {
    double scale, filterscale, support, center, ss, ww, maxkk;
    int xx, x, xmin, xmax;
    memset(a, 0, sizeof(*a));
    filterscale = scale = (double)(in1 - in0) / out_size; /* float subtraction, as PIL's float box */
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = 1.0 * filterscale;
    a->ksize = (int)ceil(support) * 2 + 1;
    a->first = malloc(sizeof(int) * out_size);
    a->count = malloc(sizeof(int) * out_size);
    a->k = malloc(sizeof(int32_t) * out_size * a->ksize);
    a->weights = calloc((size_t)out_size * a->ksize, sizeof(double));
    if (!a->first || !a->count || !a->k || !a->weights) {
        axis_free(a);
        return -1;
    }
    ss = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double *w = a->weights + (size_t)xx * a->ksize;
        center = in0 + (xx + 0.5) * scale;
        ww = 0.0;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            w[x] = bilinear((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0)
                w[x] /= ww;
        a->first[xx] = xmin;
        a->count[xx] = xmax;
    }
    maxkk = a->weights[0];
    for (x = 0; x < out_size * a->ksize; x++)
        if (maxkk < a->weights[x])
            maxkk = a->weights[x];
    for (a->precision = 0; a->precision < PRECISION_BITS; a->precision++)
        if ((int)(0.5 + maxkk * (1 << (a->precision + 1))) >= (1 << MAX_COEFS_PRECISION))
            break;
    for (x = 0; x < out_size * a->ksize; x++) {
        double v = a->weights[x] * (1 << a->precision);
        a->k[x] = (int16_t)(a->weights[x] < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    return 0;
}

static int simd_level = -1; /* 0 scalar, 1 SSE2, 2 AVX2; -1: not yet chosen */

static int simd(void) {
    if (simd_level < 0) {
        simd_level = 0;
#ifdef __SSE2__
        simd_level = 1;
#endif
#ifdef RESAMPLE_AVX2
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2"))
            simd_level = 2;
#endif
    }
    return simd_level;
}

int resample_simd(int level) {
    int best;
    simd_level = -1;
    best = simd();
    simd_level = level < 0 || level > best ? best : level;
    return simd_level;
}

static inline uint8_t clip(int32_t sum, int precision) {
    int32_t v = sum >> precision;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

static __thread uint8_t *scratch;
static __thread size_t scratch_size;

static uint8_t *scratch_bytes(size_t n) {
    if (n <= scratch_size)
        return scratch;
    if (n > SCRATCH_LIMIT)
        return malloc(n); /* not kept: freed by the caller */
    free(scratch);
    scratch = malloc(n);
    scratch_size = scratch ? n : 0;
    return scratch;
}

#ifdef __SSE2__
/* 32-bit sums >> precision, saturated to bytes as PIL's packs/packus do. */
static inline __m128i narrow(__m128i a, __m128i b, __m128i c, __m128i d, int precision) {
    __m128i shift = _mm_cvtsi32_si128(precision);
    return _mm_packus_epi16(_mm_packs_epi32(_mm_sra_epi32(a, shift), _mm_sra_epi32(b, shift)),
                            _mm_packs_epi32(_mm_sra_epi32(c, shift), _mm_sra_epi32(d, shift)));
}
#endif

#ifdef RESAMPLE_AVX2
/* Two taps' 16-bit weights (k[0], k[1]) in every 32-bit lane, for madd. */
TARGET_AVX2 static inline __m256i tap_pair(const int32_t *k) {
    return _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)k[0] | ((uint32_t)(uint16_t)k[1] << 16)));
}

/* `bytes` (8 or 16) of two rows: `a` in the low 128-bit lane, `b` in the high one. */
TARGET_AVX2 static inline __m256i two_rows(const uint8_t *a, const uint8_t *b, int bytes) {
    __m128i lo = bytes == 16 ? _mm_loadu_si128((const __m128i *)a) : _mm_loadl_epi64((const __m128i *)a);
    __m128i hi = bytes == 16 ? _mm_loadu_si128((const __m128i *)b) : _mm_loadl_epi64((const __m128i *)b);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* horizontal()'s 4-row groups from y0 on, AVX2: two rows a register, four taps a step (pillow-simd's
 * shuffle into 16-bit pairs); returns the first row left undone. */
TARGET_AVX2 static int horizontal_avx2(const uint8_t *in, size_t in_stride, int in_w, int y0, int y1,
                                       const struct axis *a, int left, int width, uint8_t *temp) {
    int y = y0, xx, half = 1 << (a->precision - 1);
    size_t out_stride = (size_t)width * 4;
    const __m256i lo = _mm256_set_epi8(-1, 7, -1, 3, -1, 6, -1, 2, -1, 5, -1, 1, -1, 4, -1, 0,
                                       -1, 7, -1, 3, -1, 6, -1, 2, -1, 5, -1, 1, -1, 4, -1, 0);
    const __m256i hi = _mm256_set_epi8(-1, 15, -1, 11, -1, 14, -1, 10, -1, 13, -1, 9, -1, 12, -1, 8,
                                       -1, 15, -1, 11, -1, 14, -1, 10, -1, 13, -1, 9, -1, 12, -1, 8);
    const __m128i shift = _mm_cvtsi32_si128(a->precision);
    for (; y + 3 < y1; y += 4) {
        const uint8_t *r0 = in + (size_t)y * in_stride, *r1 = r0 + in_stride, *r2 = r1 + in_stride,
                      *r3 = r2 + in_stride;
        uint8_t *dst = temp + (size_t)(y - y0) * out_stride;
        for (xx = 0; xx < width; xx++) {
            const int32_t *k = a->k + (size_t)(xx + left) * a->ksize;
            size_t first = (size_t)a->first[xx + left] * 4;
            int count = a->count[xx + left], x = 0;
            __m256i s01 = _mm256_set1_epi32(half), s23 = s01;
            /* Up to 4 taps inside the row: one 4-tap step, the taps past `count` weighing 0 (axis_init
             * leaves them 0; ksize >= 4 keeps them this pixel's) whatever the pixels there hold. */
            int padded = count < 4 && a->ksize >= 4 && a->first[xx + left] + 4 <= in_w ? 4 : count;
            for (; x + 3 < padded; x += 4) { /* pixels x..x+3 of rows (0, 1) and (2, 3) */
                __m256i w01 = tap_pair(k + x), w23 = tap_pair(k + x + 2);
                size_t at = first + 4 * (size_t)x;
                __m256i a01 = two_rows(r0 + at, r1 + at, 16), a23 = two_rows(r2 + at, r3 + at, 16);
                s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(_mm256_shuffle_epi8(a01, lo), w01));
                s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(_mm256_shuffle_epi8(a01, hi), w23));
                s23 = _mm256_add_epi32(s23, _mm256_madd_epi16(_mm256_shuffle_epi8(a23, lo), w01));
                s23 = _mm256_add_epi32(s23, _mm256_madd_epi16(_mm256_shuffle_epi8(a23, hi), w23));
            }
            if (padded > count)
                x = count;
            for (; x + 1 < count; x += 2) {
                __m256i w = tap_pair(k + x);
                size_t at = first + 4 * (size_t)x;
                __m256i a01 = two_rows(r0 + at, r1 + at, 8), a23 = two_rows(r2 + at, r3 + at, 8);
                s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(_mm256_shuffle_epi8(a01, lo), w));
                s23 = _mm256_add_epi32(s23, _mm256_madd_epi16(_mm256_shuffle_epi8(a23, lo), w));
            }
            if (x < count) { /* one tap: the pixel's channels against (k, 0) */
                __m256i w = _mm256_set1_epi32((uint16_t)k[x]);
                size_t at = first + 4 * (size_t)x;
                int32_t p0, p1, p2, p3;
                memcpy(&p0, r0 + at, 4);
                memcpy(&p1, r1 + at, 4);
                memcpy(&p2, r2 + at, 4);
                memcpy(&p3, r3 + at, 4);
                s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(
                    _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, p1, p0)), w)); /* lane 0 row 0, lane 1 row 1 */
                s23 = _mm256_add_epi32(s23, _mm256_madd_epi16(
                    _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, p3, p2)), w));
            }
            {
                __m256i n01 = _mm256_sra_epi32(s01, shift), n23 = _mm256_sra_epi32(s23, shift);
                __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(n01, n23), _mm256_setzero_si256());
                /* lane 0: row 0 (bytes 0-3), row 2 (4-7); lane 1: row 1 (16-19), row 3 (20-23) */
                uint8_t value[32];
                _mm256_storeu_si256((__m256i *)value, bytes);
                memcpy(dst + 4 * xx, value, 4);
                memcpy(dst + out_stride + 4 * xx, value + 16, 4);
                memcpy(dst + 2 * out_stride + 4 * xx, value + 4, 4);
                memcpy(dst + 3 * out_stride + 4 * xx, value + 20, 4);
            }
        }
    }
    return y;
}

/* vertical_row()'s 8-pixel groups, AVX2 (the SSE2 steps in each 128-bit lane); returns the first byte left. */
TARGET_AVX2 static int vertical_row_avx2(const uint8_t *rows, size_t stride, const int32_t *k, int count,
                                         int precision, int width, uint8_t *dst) {
    int half = 1 << (precision - 1), i = 0, y;
    __m256i zero = _mm256_setzero_si256();
    __m128i shift = _mm_cvtsi32_si128(precision);
    for (; i + 32 <= width * 4; i += 32) {
        __m256i s0 = _mm256_set1_epi32(half), s1 = s0, s2 = s0, s3 = s0;
        for (y = 0; y < count; y += 2) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(rows + (size_t)y * stride + i));
            __m256i b = y + 1 < count ? _mm256_loadu_si256((const __m256i *)(rows + (size_t)(y + 1) * stride + i)) : zero;
            __m256i weights = _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)k[y] |
                                                          ((uint32_t)(uint16_t)(y + 1 < count ? k[y + 1] : 0) << 16)));
            __m256i l = _mm256_unpacklo_epi8(a, b), h = _mm256_unpackhi_epi8(a, b);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(l, zero), weights));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(l, zero), weights));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(h, zero), weights));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(h, zero), weights));
        }
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm256_packus_epi16(_mm256_packs_epi32(_mm256_sra_epi32(s0, shift), _mm256_sra_epi32(s1, shift)),
                                                _mm256_packs_epi32(_mm256_sra_epi32(s2, shift), _mm256_sra_epi32(s3, shift))));
    }
    return i;
}
#endif

/* Rows [y0, y1) of `in`, resampled horizontally to output columns [left, left + width), RGBX. */
static void horizontal(const uint8_t *in, size_t in_stride, int in_w, int y0, int y1, const struct axis *a,
                       int left, int width, uint8_t *temp) {
    int y = y0, xx, half = 1 << (a->precision - 1);
    size_t out_stride = (size_t)width * 4;
#ifdef RESAMPLE_AVX2
    if (simd() >= 2)
        y = horizontal_avx2(in, in_stride, in_w, y0, y1, a, left, width, temp);
#endif
#ifdef __SSE2__
    for (; simd() >= 1 && y + 3 < y1; y += 4) { /* 4 rows share each pixel's taps and weights */
        const uint8_t *row = in + (size_t)y * in_stride;
        uint8_t *dst = temp + (size_t)(y - y0) * out_stride;
        for (xx = 0; xx < width; xx++) {
            const int32_t *k = a->k + (size_t)(xx + left) * a->ksize;
            const uint8_t *src = row + (size_t)a->first[xx + left] * 4;
            int count = a->count[xx + left], x = 0, r;
            __m128i zero = _mm_setzero_si128(), sum[4];
            for (r = 0; r < 4; r++)
                sum[r] = _mm_set1_epi32(half);
            for (; x + 1 < count; x += 2) {
                __m128i weights = _mm_set1_epi32((int32_t)((uint32_t)(uint16_t)k[x] |
                                                           ((uint32_t)(uint16_t)k[x + 1] << 16)));
                for (r = 0; r < 4; r++) { /* pixels x, x+1 as r0 r1 g0 g1 b0 b1 a0 a1 (16 bits) */
                    __m128i two = _mm_unpacklo_epi8(
                        _mm_loadl_epi64((const __m128i *)(src + r * in_stride + 4 * x)), zero);
                    sum[r] = _mm_add_epi32(sum[r], _mm_madd_epi16(_mm_unpacklo_epi16(two, _mm_srli_si128(two, 8)),
                                                                  weights));
                }
            }
            if (x < count) {
                __m128i weight = _mm_set1_epi32((uint16_t)k[x]);
                for (r = 0; r < 4; r++) {
                    int32_t pixel;
                    memcpy(&pixel, src + r * in_stride + 4 * x, 4);
                    sum[r] = _mm_add_epi32(sum[r], _mm_madd_epi16(
                        _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(pixel), zero), zero), weight));
                }
            }
            {
                __m128i bytes = narrow(sum[0], sum[1], sum[2], sum[3], a->precision);
                int32_t value[4];
                _mm_storeu_si128((__m128i *)value, bytes);
                for (r = 0; r < 4; r++)
                    memcpy(dst + r * out_stride + 4 * xx, &value[r], 4);
            }
        }
    }
#endif
    for (; y < y1; y++) {
        const uint8_t *row = in + (size_t)y * in_stride;
        uint8_t *dst = temp + (size_t)(y - y0) * out_stride;
        for (xx = 0; xx < width; xx++) {
            const int32_t *k = a->k + (size_t)(xx + left) * a->ksize;
            const uint8_t *src = row + (size_t)a->first[xx + left] * 4;
            int32_t s0 = half, s1 = half, s2 = half;
            int x;
            for (x = 0; x < a->count[xx + left]; x++) {
                s0 += src[4 * x] * k[x];
                s1 += src[4 * x + 1] * k[x];
                s2 += src[4 * x + 2] * k[x];
            }
            dst[4 * xx] = clip(s0, a->precision);
            dst[4 * xx + 1] = clip(s1, a->precision);
            dst[4 * xx + 2] = clip(s2, a->precision);
        }
    }
}

/* One output row of the vertical pass: `count` input rows (stride apart) weighted by k, RGBX out. */
static void vertical_row(const uint8_t *rows, size_t stride, const int32_t *k, int count, int precision, int width,
                         uint8_t *dst) {
    int half = 1 << (precision - 1), i = 0, y;
#ifdef RESAMPLE_AVX2
    if (simd() >= 2)
        i = vertical_row_avx2(rows, stride, k, count, precision, width, dst);
#endif
#ifdef __SSE2__
    __m128i zero = _mm_setzero_si128();
    for (; simd() >= 1 && i + 16 <= width * 4; i += 16) { /* 4 pixels: 16 channel values */
        __m128i s0 = _mm_set1_epi32(half), s1 = s0, s2 = s0, s3 = s0;
        for (y = 0; y < count; y += 2) {
            __m128i a = _mm_loadu_si128((const __m128i *)(rows + (size_t)y * stride + i));
            __m128i b = y + 1 < count ? _mm_loadu_si128((const __m128i *)(rows + (size_t)(y + 1) * stride + i)) : zero;
            __m128i weights = _mm_set1_epi32((int32_t)((uint32_t)(uint16_t)k[y] |
                                                       ((uint32_t)(uint16_t)(y + 1 < count ? k[y + 1] : 0) << 16)));
            __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b); /* a0 b0 a1 b1 ... */
            s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), weights));
            s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), weights));
            s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), weights));
            s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), weights));
        }
        _mm_storeu_si128((__m128i *)(dst + i), narrow(s0, s1, s2, s3, precision));
    }
#endif
    for (; i < width * 4; i++) {
        int32_t sum = half;
        for (y = 0; y < count; y++)
            sum += rows[(size_t)y * stride + i] * k[y];
        dst[i] = clip(sum, precision);
    }
}

#ifdef __SSE2__
/* 16 RGBX pixels into 16 R, 16 G and 16 B bytes: three rounds of byte interleaving. */
static inline void deinterleave16(const uint8_t *src, __m128i plane[3]) {
    __m128i a0 = _mm_loadu_si128((const __m128i *)src), a1 = _mm_loadu_si128((const __m128i *)(src + 16));
    __m128i a2 = _mm_loadu_si128((const __m128i *)(src + 32)), a3 = _mm_loadu_si128((const __m128i *)(src + 48));
    __m128i t0 = _mm_unpacklo_epi8(a0, a1), t1 = _mm_unpackhi_epi8(a0, a1); /* r0 r4 g0 g4 ... */
    __m128i t2 = _mm_unpacklo_epi8(a2, a3), t3 = _mm_unpackhi_epi8(a2, a3);
    __m128i u0 = _mm_unpacklo_epi8(t0, t1), u1 = _mm_unpackhi_epi8(t0, t1); /* r0 r2 r4 r6 g0 ... */
    __m128i u2 = _mm_unpacklo_epi8(t2, t3), u3 = _mm_unpackhi_epi8(t2, t3);
    __m128i v0 = _mm_unpacklo_epi8(u0, u1), v1 = _mm_unpackhi_epi8(u0, u1); /* r0..r7 g0..g7, b0..b7 x0..x7 */
    __m128i v2 = _mm_unpacklo_epi8(u2, u3), v3 = _mm_unpackhi_epi8(u2, u3);
    plane[0] = _mm_unpacklo_epi64(v0, v2);
    plane[1] = _mm_unpackhi_epi64(v0, v2);
    plane[2] = _mm_unpacklo_epi64(v1, v3);
}

/* The 16 bytes in reverse order (SSE2 has no byte shuffle: bytes in words, words, then halves). */
static inline __m128i reverse16(__m128i v) {
    v = _mm_or_si128(_mm_slli_epi16(v, 8), _mm_srli_epi16(v, 8));
    v = _mm_shufflehi_epi16(_mm_shufflelo_epi16(v, 0x1B), 0x1B);
    return _mm_shuffle_epi32(v, 0x4E);
}
#endif

/* The three colour channels of an RGBX row into the window's row yy; the two layouts batches use
 * (HWC, and the HWC view of a CHW slot) get loops the compiler can unroll. */
static void copy_row(const struct resample_out *out, int yy, const uint8_t *src) {
    int xx, c, w = out->width;
    uint8_t *row = out->data + yy * out->row;
    if (out->column == 3 && out->channel == 1) {
        for (xx = 0; xx < w; xx++) {
            uint8_t *pixel = row + 3 * (out->flip ? w - 1 - xx : xx);
            pixel[0] = src[4 * xx];
            pixel[1] = src[4 * xx + 1];
            pixel[2] = src[4 * xx + 2];
        }
    } else if (out->column == 1) { /* CHW */
        xx = 0;
#ifdef __SSE2__
        for (; xx + 16 <= w; xx += 16) {
            __m128i plane[3];
            deinterleave16(src + 4 * xx, plane);
            for (c = 0; c < 3; c++) {
                if (out->flip)
                    _mm_storeu_si128((__m128i *)(row + c * out->channel + w - 16 - xx), reverse16(plane[c]));
                else
                    _mm_storeu_si128((__m128i *)(row + c * out->channel + xx), plane[c]);
            }
        }
#endif
        for (c = 0; c < 3; c++) {
            uint8_t *plane = row + c * out->channel;
            int x;
            if (out->flip)
                for (x = xx; x < w; x++)
                    plane[w - 1 - x] = src[4 * x + c];
            else
                for (x = xx; x < w; x++)
                    plane[x] = src[4 * x + c];
        }
    } else {
        for (xx = 0; xx < w; xx++) {
            uint8_t *pixel = row + (out->flip ? w - 1 - xx : xx) * out->column;
            for (c = 0; c < 3; c++)
                pixel[c * out->channel] = src[4 * xx + c];
        }
    }
}

int resample_window(const uint8_t *in, size_t in_stride, int in_w, int in_h, const float box[4],
                    int out_w, int out_h, int left, int top, const struct resample_out *out) {
    struct axis ax, ay;
    int need_h = out_w != in_w || box[0] != 0 || box[2] != out_w; /* PIL's tests, quirks included */
    int need_v = out_h != in_h || box[1] != 0 || box[3] != out_h;
    int y0 = top, y1 = top + out->height, yy, status = -1;
    size_t temp_stride;
    const uint8_t *rows;
    uint8_t *temp = NULL;
    uint8_t *line = NULL;
    memset(&ax, 0, sizeof(ax));
    memset(&ay, 0, sizeof(ay));
    if ((need_h && axis_init(&ax, in_w, box[0], box[2], out_w)) ||
        (need_v && axis_init(&ay, in_h, box[1], box[3], out_h)))
        goto done;
    if (need_v) { /* the input rows the window's output rows read */
        y0 = ay.first[top];
        y1 = ay.first[top + out->height - 1] + ay.count[top + out->height - 1];
    }
    if (need_h) {
        temp = scratch_bytes((size_t)(y1 - y0) * out->width * 4);
        if (!temp)
            goto done;
        horizontal(in, in_stride, in_w, y0, y1, &ax, left, out->width, temp);
        rows = temp;
        temp_stride = (size_t)out->width * 4;
    } else {
        rows = in + (size_t)y0 * in_stride + (size_t)left * 4;
        temp_stride = in_stride;
    }
    if (!need_v) {
        for (yy = 0; yy < out->height; yy++)
            copy_row(out, yy, rows + (size_t)yy * temp_stride);
        status = 0;
        goto done;
    }
    line = malloc((size_t)out->width * 4);
    if (!line)
        goto done;
    for (yy = 0; yy < out->height; yy++) {
        vertical_row(rows + (size_t)(ay.first[yy + top] - y0) * temp_stride, temp_stride,
                     ay.k + (size_t)(yy + top) * ay.ksize, ay.count[yy + top], ay.precision, out->width, line);
        copy_row(out, yy, line);
    }
    status = 0;
done:
    if (temp && temp != scratch)
        free(temp);
    free(line);
    axis_free(&ax);
    axis_free(&ay);
    (void)in_h;
    return status;
}
