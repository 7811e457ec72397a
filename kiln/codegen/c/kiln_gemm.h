/* kiln_gemm.h: packed single-precision GEMM micro-kernels, pasted into every generated model.c.
 *
 * C[M x N] = A[M x K] * B[K x N], computed in register tiles of KILN_MR rows x KILN_NR columns (12 x 32 with AVX-512,
 * 6 x 16 with AVX2 + FMA, 12 x 32 portable C the compiler vectorizes otherwise). B is read from
 * a "panel": KILN_NR consecutive columns stored k-major ([K][KILN_NR], zero-padded past N), so the kernel streams
 * it with aligned vector loads; constant B (weights) is packed once when the model is created, anything else is
 * packed per panel by the thread that uses it. A is read in place through (row, k) strides and broadcast. Tiles
 * land in a small buffer; the generated caller applies the fused epilogue (bias, activation, residual) from it.
 * This is the GotoBLAS/BLIS structure without the cache-level blocking of K, which the model sizes kiln targets
 * (K <= a few thousand) do not need: one KILN_NR-wide panel of B stays in L2 while every row block reuses it.
 */
#ifndef KILN_GEMM_H
#define KILN_GEMM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* KILN_ROW_COPY_MIN_CHANNELS: the input channels (per group) from which a convolution copies its consecutive im2col
 * rows with vector loads (kiln_masked_row) instead of gathers; below it the per-panel check costs more than it
 * saves. */
#if defined(__AVX512F__)
#define KILN_NR 32
#define KILN_MR 12  /* 24 zmm accumulators + 2 B vectors + 1 broadcast: 27 of 32 registers */
#define KILN_ROW_COPY_MIN_CHANNELS 1  /* the check is vectorized: an RGB stem copies rows too */
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_AVX2_GEMM 1
#define KILN_NR 16
#define KILN_MR 6   /* Haswell-class tile (BLIS, OpenBLAS): 12 ymm accumulators + 2 B vectors + 1 broadcast of 16 */
#define KILN_ROW_COPY_MIN_CHANNELS 1  /* Zen 3's gathers are slow: the CNN's RGB stem 6.5 -> 4.5 ms at batch 16 */
#else
#define KILN_NR 32
#define KILN_MR 12
#define KILN_ROW_COPY_MIN_CHANNELS 8
#endif

static inline int64_t kiln_panels(int64_t n) { return (n + KILN_NR - 1) / KILN_NR; }

/* KILN_LANES: floats in one of the build's vector registers. kiln_store_lanes stores the first n (<= KILN_LANES)
 * of a KILN_LANES-float block (64-byte aligned) with one masked store where the ISA has them: a stencil computes
 * whole vectors of a row and keeps the columns the row has. */
#if defined(__AVX512F__)
#define KILN_LANES 16
static inline void kiln_store_lanes(float* dst, const float* block, int n)
{
    _mm512_mask_storeu_ps(dst, (__mmask16)((1u << n) - 1u), _mm512_load_ps(block));
}
#elif defined(KILN_AVX2_GEMM)
#define KILN_LANES 8
static inline void kiln_store_lanes(float* dst, const float* block, int n)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(dst, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), _mm256_load_ps(block));
}
#else
#define KILN_LANES 4
static inline void kiln_store_lanes(float* dst, const float* block, int n) { memcpy(dst, block, (size_t)n * 4); }
#endif

/* a * b + c in one rounding where the ISA has FMA (the vectorizer emits vfmadd; -std=c11 keeps GCC from contracting
 * a * b + c itself), else as two operations. */
#if defined(__FMA__)
#define KILN_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define KILN_FMAF(a, b, c) ((a) * (b) + (c))
#endif

/* Matrix times vector, for a GEMM with one output column: out[r] = sum_k a[r * lda + k] * x[k * incx] for the
 * first `rows` (at most 4) rows of a, vectorized along k. Four rows share each load of x; a row past `rows` repeats
 * the first (its sum is not stored). The panel micro-kernel would compute 1 of its KILN_NR columns. */
static inline void kiln_gemv4(int rows, int64_t K, const float* a, int64_t lda, const float* x, int64_t incx,
                              float* out)
{
    const float* a0 = a;
    const float* a1 = rows > 1 ? a + lda : a;
    const float* a2 = rows > 2 ? a + 2 * lda : a;
    const float* a3 = rows > 3 ? a + 3 * lda : a;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    #pragma omp simd reduction(+:s0, s1, s2, s3)
    for (int64_t k = 0; k < K; ++k)
    {
        const float v = x[k * incx];
        s0 = KILN_FMAF(a0[k], v, s0);
        s1 = KILN_FMAF(a1[k], v, s1);
        s2 = KILN_FMAF(a2[k], v, s2);
        s3 = KILN_FMAF(a3[k], v, s3);
    }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

/* Entries 0..count-1 grouped by the matrix each reads (which[e] in 0..groups-1), a stable counting sort: group g's
 * entries are order[start[g] .. start[g + 1]). `cursor` is scratch for `groups` positions. */
static void kiln_group_entries(int64_t count, int64_t groups, const int64_t* which, int64_t* start, int64_t* cursor,
                               int64_t* order)
{
    for (int64_t g = 0; g <= groups; ++g) start[g] = 0;
    for (int64_t e = 0; e < count; ++e) ++start[which[e] + 1];
    for (int64_t g = 0; g < groups; ++g) start[g + 1] += start[g];
    for (int64_t g = 0; g < groups; ++g) cursor[g] = start[g];
    for (int64_t e = 0; e < count; ++e) order[cursor[which[e]]++] = e;
}

/* Pack columns [n0, n0 + KILN_NR) of B (element (k, n) at b[k * sk + n * sn]) into dst[K][KILN_NR]. */
static void kiln_pack_b_panel(int64_t K, int64_t N, int64_t n0, const float* b, int64_t sk, int64_t sn,
                              float* restrict dst)
{
    const int64_t width = N - n0 < KILN_NR ? N - n0 : KILN_NR;
    if (sn == 1) {
        for (int64_t k = 0; k < K; ++k) {
            memcpy(dst + k * KILN_NR, b + k * sk + n0, (size_t)width * sizeof(float));
            for (int64_t c = width; c < KILN_NR; ++c) dst[k * KILN_NR + c] = 0.0f;
        }
        return;
    }
    /* Columns strided (B = W^T of a linear layer: k runs contiguously): read along k, one column at a time. */
    for (int64_t c = 0; c < KILN_NR; ++c) {
        if (c < width) {
            const float* column = b + (n0 + c) * sn;
            for (int64_t k = 0; k < K; ++k) dst[k * KILN_NR + c] = column[k * sk];
        } else {
            for (int64_t k = 0; k < K; ++k) dst[k * KILN_NR + c] = 0.0f;
        }
    }
}

/* A [M x K] (element (m, k) at a[m * sm + k * sk]) in blocks of KILN_MR rows, each stored k-major ([K][KILN_MR],
 * zero rows past M): block b at dst + b * K * KILN_MR, read by the micro-kernel with row stride 1 and k stride
 * KILN_MR, one contiguous stream instead of KILN_MR strided ones (constant A: convolution weights). */
static void kiln_pack_a(int64_t M, int64_t K, const float* a, int64_t sm, int64_t sk, float* restrict dst)
{
    for (int64_t block = 0; block * KILN_MR < M; ++block)
        for (int64_t k = 0; k < K; ++k)
            for (int r = 0; r < KILN_MR; ++r) {
                const int64_t m = block * KILN_MR + r;
                dst[(block * K + k) * KILN_MR + r] = m < M ? a[m * sm + k * sk] : 0.0f;
            }
}

/* All panels of B, panel j at dst + j * K * KILN_NR. */
static void kiln_pack_b(int64_t K, int64_t N, const float* b, int64_t sk, int64_t sn, float* restrict dst)
{
    for (int64_t j = 0; j < kiln_panels(N); ++j) kiln_pack_b_panel(K, N, j * KILN_NR, b, sk, sn, dst + j * K * KILN_NR);
}

#if defined(__AVX512F__)
/* tile[r][0..KILN_NR) = sum_k a[r * sm + k * sk] * panel[k][.] for r < MR: 2 * MR zmm accumulators. */
#define KILN_DEFINE_UKERNEL(MR)                                                                                   \
    static inline void kiln_ukernel_##MR(int64_t K, const float* a, int64_t sm, int64_t sk,                      \
                                         const float* restrict panel, const float* ahead, float* restrict tile)  \
    {                                                                                                             \
        __m512 lo[MR], hi[MR];                                                                                    \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) { lo[r] = _mm512_setzero_ps(); hi[r] = lo[r]; }    \
        for (int64_t k = 0; k < K; ++k) {                                                                         \
            if (MR > 1) { /* one row streams at memory speed already: no room to hide a second stream */          \
                __builtin_prefetch(ahead + k * KILN_NR, 0, 2);                                                    \
                __builtin_prefetch(ahead + k * KILN_NR + 16, 0, 2);                                               \
            }                                                                                                     \
            const __m512 b0 = _mm512_load_ps(panel + k * KILN_NR);                                                \
            const __m512 b1 = _mm512_load_ps(panel + k * KILN_NR + 16);                                           \
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                               \
                const __m512 x = _mm512_set1_ps(a[r * sm + k * sk]);                                              \
                lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);                                                            \
                hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);                                                            \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                                   \
            _mm512_store_ps(tile + r * KILN_NR, lo[r]);                                                           \
            _mm512_store_ps(tile + r * KILN_NR + 16, hi[r]);                                                      \
        }                                                                                                         \
    }
#elif defined(KILN_AVX2_GEMM)
/* tile[r][0..16) = sum_k a[r * sm + k * sk] * panel[k][.] for r < MR: 2 * MR ymm accumulators (MR <= 6). */
#define KILN_DEFINE_UKERNEL(MR)                                                                                   \
    static inline void kiln_ukernel_##MR(int64_t K, const float* a, int64_t sm, int64_t sk,                      \
                                         const float* restrict panel, const float* ahead, float* restrict tile)  \
    {                                                                                                             \
        __m256 lo[MR], hi[MR];                                                                                    \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) { lo[r] = _mm256_setzero_ps(); hi[r] = lo[r]; }     \
        _Pragma("GCC unroll 4") for (int64_t k = 0; k < K; ++k) {                                                 \
            if (MR > 1) __builtin_prefetch(ahead + k * KILN_NR, 0, 2);                                            \
            const __m256 b0 = _mm256_load_ps(panel + k * KILN_NR);                                                \
            const __m256 b1 = _mm256_load_ps(panel + k * KILN_NR + 8);                                            \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                \
                const __m256 x = _mm256_broadcast_ss(a + r * sm + k * sk);                                        \
                lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);                                                            \
                hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);                                                            \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                    \
            _mm256_store_ps(tile + r * KILN_NR, lo[r]);                                                           \
            _mm256_store_ps(tile + r * KILN_NR + 8, hi[r]);                                                       \
        }                                                                                                         \
    }
#else
/* Portable kernel: the compiler vectorizes the KILN_NR-wide inner loop for whatever ISA -march selects. */
#define KILN_DEFINE_UKERNEL(MR)                                                                                   \
    static inline void kiln_ukernel_##MR(int64_t K, const float* a, int64_t sm, int64_t sk,                      \
                                         const float* restrict panel, const float* ahead, float* restrict tile)  \
    {                                                                                                             \
        float acc[MR][KILN_NR];                                                                                   \
        memset(acc, 0, sizeof acc);                                                                               \
        for (int64_t k = 0; k < K; ++k)                                                                           \
            for (int r = 0; r < MR; ++r) {                                                                        \
                if (MR > 1 && r == 0) __builtin_prefetch(ahead + k * KILN_NR, 0, 2);                              \
                const float x = a[r * sm + k * sk];                                                               \
                for (int c = 0; c < KILN_NR; ++c) acc[r][c] += x * panel[k * KILN_NR + c];                        \
            }                                                                                                     \
        memcpy(tile, acc, sizeof acc);                                                                            \
    }
#endif

KILN_DEFINE_UKERNEL(1)
KILN_DEFINE_UKERNEL(2)
KILN_DEFINE_UKERNEL(3)
KILN_DEFINE_UKERNEL(4)
KILN_DEFINE_UKERNEL(5)
KILN_DEFINE_UKERNEL(6)
#if KILN_MR > 6
KILN_DEFINE_UKERNEL(7)
KILN_DEFINE_UKERNEL(8)
KILN_DEFINE_UKERNEL(9)
KILN_DEFINE_UKERNEL(10)
KILN_DEFINE_UKERNEL(11)
KILN_DEFINE_UKERNEL(12)
#endif

/* One register tile of `rows` (1..KILN_MR) rows into tile[KILN_MR][KILN_NR]. While it runs, the panel the caller
 * uses next (`ahead`; prefetching is a hint, so any address is safe) streams into L2: a single thread otherwise
 * waits on memory once the weights outgrow the last-level cache (M = 32, 32 MB of weights: 66 -> 130 GFLOP/s).
 * Not inlined: every GEMM and convolution kernel calls this one copy (inlining its unrolled tiles into each of them
 * doubled a 6-layer encoder's build time and measured no faster). */
__attribute__((noinline)) static void kiln_ukernel(int rows, int64_t K, const float* a, int64_t sm, int64_t sk,
                                                   const float* panel, const float* ahead, float* tile)
{
    switch (rows) {
    case 1: kiln_ukernel_1(K, a, sm, sk, panel, ahead, tile); break;
    case 2: kiln_ukernel_2(K, a, sm, sk, panel, ahead, tile); break;
    case 3: kiln_ukernel_3(K, a, sm, sk, panel, ahead, tile); break;
    case 4: kiln_ukernel_4(K, a, sm, sk, panel, ahead, tile); break;
    case 5: kiln_ukernel_5(K, a, sm, sk, panel, ahead, tile); break;
#if KILN_MR > 6
    case 6: kiln_ukernel_6(K, a, sm, sk, panel, ahead, tile); break;
    case 7: kiln_ukernel_7(K, a, sm, sk, panel, ahead, tile); break;
    case 8: kiln_ukernel_8(K, a, sm, sk, panel, ahead, tile); break;
    case 9: kiln_ukernel_9(K, a, sm, sk, panel, ahead, tile); break;
    case 10: kiln_ukernel_10(K, a, sm, sk, panel, ahead, tile); break;
    case 11: kiln_ukernel_11(K, a, sm, sk, panel, ahead, tile); break;
    default: kiln_ukernel_12(K, a, sm, sk, panel, ahead, tile); break;
#else
    default: kiln_ukernel_6(K, a, sm, sk, panel, ahead, tile); break;
#endif
    }
}

/* One im2col panel row: dst[c] = plane[source[c]], or 0 where source[c] < 0 (padding). */
static inline void kiln_gather_row(const float* plane, const int32_t* restrict source, float* restrict dst)
{
#if defined(__AVX512F__)
    for (int c = 0; c < KILN_NR; c += 16) {
        const __m512i offsets = _mm512_loadu_si512((const void*)(source + c));
        const __mmask16 valid = _mm512_cmpge_epi32_mask(offsets, _mm512_setzero_si512());
        _mm512_storeu_ps(dst + c, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, offsets, plane, 4));
    }
#elif defined(KILN_AVX2_GEMM)
    for (int c = 0; c < KILN_NR; c += 8) {
        const __m256i offsets = _mm256_loadu_si256((const __m256i*)(source + c));
        const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(offsets, _mm256_set1_epi32(-1)));
        _mm256_storeu_ps(dst + c, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), plane, offsets, valid, 4));
    }
#else
    for (int c = 0; c < KILN_NR; ++c) dst[c] = source[c] >= 0 ? plane[source[c]] : 0.0f;
#endif
}

/* The step, at most `max_step`, at which a tap row's valid columns read the input, source[c] = start + step * c over
 * its first `lanes` columns: 1 (stride 1 along the pixels; in a "same" convolution even across output rows, since
 * pixel p then reads p + a per-tap offset), 2 (stride 2: ResNet's stem and downsampling convolutions), or 0 (gather
 * the row). With a step, `start` and the valid-column bits let kiln_masked_row, kiln_every_other_row or
 * kiln_block_row copy the row with vector loads. */
static inline int kiln_row_step_lanes(const int32_t* source, int lanes, int max_step, int32_t* start, uint32_t* valid)
{
    for (int step = 1; step <= max_step; ++step) {
        int32_t first = 0;
        uint32_t bits = 0;
        int c = 0;
        for (; c < lanes; ++c) {
            if (source[c] < 0) continue;
            if (!bits) first = source[c] - step * c;
            else if (source[c] - step * c != first) break;
            bits |= 1u << c;
        }
        if (c == lanes) {
            *start = first;
            *valid = bits;
            return step;
        }
    }
    return 0;
}

/* kiln_row_step_lanes over a whole KILN_NR-column panel row, up to the steps kiln_every_other_row copies with vector
 * code (2 with AVX2 and AVX-512, 1 in portable C). With AVX-512, vectorized: a dozen instructions instead of a
 * 32-iteration loop per tap, so an RGB stem's three channels repay the check. */
static inline int kiln_row_step(const int32_t* source, int32_t* start, uint32_t* valid)
{
#if defined(__AVX512F__)
    const __m512i low = _mm512_loadu_si512((const void*)source), high = _mm512_loadu_si512((const void*)(source + 16));
    const __mmask16 low_valid = _mm512_cmpge_epi32_mask(low, _mm512_setzero_si512());
    const __mmask16 high_valid = _mm512_cmpge_epi32_mask(high, _mm512_setzero_si512());
    const uint32_t bits = (uint32_t)low_valid | (uint32_t)high_valid << 16;
    const int lead = bits ? __builtin_ctz(bits) : 0;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int step = 1; step <= 2; ++step) {
        const int32_t first = bits ? source[lead] - step * lead : 0;
        const __m512i expected = _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_mullo_epi32(lane,
                                                                                              _mm512_set1_epi32(step)));
        const __mmask16 low_off = _mm512_mask_cmpneq_epi32_mask(low_valid, low, expected);
        const __mmask16 high_off = _mm512_mask_cmpneq_epi32_mask(
            high_valid, high, _mm512_add_epi32(expected, _mm512_set1_epi32(16 * step)));
        if (!(low_off | high_off)) {
            *start = first;
            *valid = bits;
            return step;
        }
    }
    return 0;
#elif defined(KILN_AVX2_GEMM)
    return kiln_row_step_lanes(source, KILN_NR, 2, start, valid);
#else
    return kiln_row_step_lanes(source, KILN_NR, 1, start, valid);
#endif
}

#if defined(KILN_AVX2_GEMM)
/* All ones in lane l where bit c + l of `valid` is set, else zero: the mask of columns c..c+7. */
static inline __m256 kiln_valid_lanes(uint32_t valid, int c)
{
    const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i chosen = _mm256_and_si256(_mm256_set1_epi32((int)(valid >> c)), lane_bits);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(chosen, lane_bits));
}
#endif

/* One k-row of an im2col row block (KILN_MR output pixels, the A operand of a convolution whose weights are the B
 * panels): dst[r] = plane[start + r] for the valid pixels of a step-1 row (kiln_row_step_lanes with max_step 1),
 * else plane[source[r]], and 0 in the padding. Only the KILN_MR lanes are stored (the block's next k-row follows). */
static inline void kiln_block_row(const float* plane, int step, int32_t start, uint32_t valid,
                                  const int32_t* restrict source, float* restrict dst)
{
#if defined(__AVX512F__)
    const __mmask16 lanes = (__mmask16)((1u << KILN_MR) - 1);
    if (step == 1) {  /* masked-off lanes are never read, so addresses outside the plane are safe */
        _mm512_mask_storeu_ps(dst, lanes, _mm512_maskz_loadu_ps((__mmask16)valid & lanes, plane + start));
        return;
    }
    const __m512i offsets = _mm512_maskz_loadu_epi32(lanes, source);
    const __mmask16 inside = _mm512_mask_cmpge_epi32_mask(lanes, offsets, _mm512_setzero_si512());
    _mm512_mask_storeu_ps(dst, lanes, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), inside, offsets, plane, 4));
#elif defined(KILN_AVX2_GEMM)
    _Static_assert(KILN_MR == 6, "the AVX2 row-block lanes below are KILN_MR's");
    const __m256i lanes = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    if (step == 1) {
        const __m256 mask = _mm256_and_ps(kiln_valid_lanes(valid, 0), _mm256_castsi256_ps(lanes));
        _mm256_maskstore_ps(dst, lanes, _mm256_maskload_ps(plane + start, _mm256_castps_si256(mask)));
        return;
    }
    for (int r = 0; r < KILN_MR; ++r) dst[r] = source[r] >= 0 ? plane[source[r]] : 0.0f;
#else
    if (step == 1)
        for (int r = 0; r < KILN_MR; ++r) dst[r] = (valid >> r) & 1u ? plane[start + r] : 0.0f;
    else
        for (int r = 0; r < KILN_MR; ++r) dst[r] = source[r] >= 0 ? plane[source[r]] : 0.0f;
#endif
}

/* dst[c] = plane[start + c] for the valid columns, 0 elsewhere. Masked-off lanes are never read by a masked load
 * (AVX-512 and AVX2 masked loads suppress faults), so the addresses before or after the plane they would name are
 * safe. With AVX2, when all KILN_NR lanes lie in [lo, hi) (plane-relative elements the caller knows are readable:
 * the input's buffer), a plain load and a bitwise AND with the mask replace the masked load: AMD Zen 3 runs
 * vmaskmovps so slowly that it took about a quarter of a 32-channel 3x3 convolution (perf, batch 16). */
static inline void kiln_masked_row(const float* plane, int32_t start, uint32_t valid, int64_t lo, int64_t hi,
                                   float* restrict dst)
{
#if defined(__AVX512F__)
    (void)lo, (void)hi;
    for (int c = 0; c < KILN_NR; c += 16)
        _mm512_storeu_ps(dst + c, _mm512_maskz_loadu_ps((__mmask16)(valid >> c), plane + start + c));
#elif defined(KILN_AVX2_GEMM)
    const int readable = start >= lo && start + KILN_NR <= hi;
    for (int c = 0; c < KILN_NR; c += 8) {
        const __m256 mask = kiln_valid_lanes(valid, c);
        _mm256_storeu_ps(dst + c, readable ? _mm256_and_ps(_mm256_loadu_ps(plane + start + c), mask)
                                           : _mm256_maskload_ps(plane + start + c, _mm256_castps_si256(mask)));
    }
#else
    (void)lo, (void)hi;
    for (int c = 0; c < KILN_NR; ++c) dst[c] = (valid >> c) & 1u ? plane[start + c] : 0.0f;
#endif
}

/* dst[c] = plane[start + 2 * c] for the valid columns, 0 elsewhere (kiln_row_step's step 2): where all
 * 2 * KILN_NR elements from start lie in [lo, hi), two loads and two shuffles per 8 columns (AVX2) or two loads and a
 * two-source permute per 16 (AVX-512) replace a gather (Zen 3's gathers took most of ResNet-18's 7x7 stride-2 stem
 * outside its GEMM); near the buffer's ends, one at a time. */
static inline void kiln_every_other_row(const float* plane, int32_t start, uint32_t valid, int64_t lo, int64_t hi,
                                        float* restrict dst)
{
#if defined(__AVX512F__)
    if (start >= lo && start + 2 * KILN_NR <= hi) {
        const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        for (int c = 0; c < KILN_NR; c += 16) {
            const __m512 low = _mm512_loadu_ps(plane + start + 2 * c), high = _mm512_loadu_ps(plane + start + 2 * c + 16);
            _mm512_storeu_ps(dst + c, _mm512_maskz_permutex2var_ps((__mmask16)(valid >> c), low, evens, high));
        }
        return;
    }
#elif defined(KILN_AVX2_GEMM)
    if (start >= lo && start + 2 * KILN_NR <= hi) {
        for (int c = 0; c < KILN_NR; c += 8) {
            const __m256 low = _mm256_loadu_ps(plane + start + 2 * c);
            const __m256 high = _mm256_loadu_ps(plane + start + 2 * c + 8);
            const __m256 evens = _mm256_shuffle_ps(low, high, _MM_SHUFFLE(2, 0, 2, 0));  /* l0 l2 h0 h2 | l4 l6 h4 h6 */
            const __m256 ordered = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(evens),
                                                                          _MM_SHUFFLE(3, 1, 2, 0)));
            _mm256_storeu_ps(dst + c, _mm256_and_ps(ordered, kiln_valid_lanes(valid, c)));
        }
        return;
    }
#endif
    (void)lo, (void)hi;
    for (int c = 0; c < KILN_NR; ++c) dst[c] = (valid >> c) & 1u ? plane[start + 2 * c] : 0.0f;
}

#endif /* KILN_GEMM_H */
