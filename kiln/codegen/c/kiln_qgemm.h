/* kiln_qgemm.h: uint8 x int8 -> int32 GEMM micro-kernels for quantized linear and convolution layers, and their
 * epilogue, pasted into a generated model.c that has one.
 *
 * C[M x N] (int32) = A[M x K] (uint8, the quantized activations, rows in place) * B[K x N] (int8, W^T of a linear
 * layer's [N x K] weight). Products accumulate exactly in int32, whatever the ISA:
 *   - AMX: tdpbusd on 16 x 64-byte tiles, steps of 32 rows (below); B in VNNI's k-quads, K padded to 64;
 *   - AVX-512 VNNI: vpdpbusd sums four u8 x s8 products per int32 lane; B is packed in k-quads, [K/4][NR][4] int8;
 *   - AVX-512 and AVX2: vpmaddwd sums two s16 x s16 products per lane; B is packed in k-pairs, [K/2][NR][2]:
 *     int16 on AVX-512, int8 on AVX2, widened as it loads (an 8-bit MLP at batch 1 reads its weights at twice
 *     the speed). AVX2's linear layers copy a chunk's activation rows once as int16 (kiln_qwiden_rows), so the
 *     pair each lane multiplies is one broadcast load; convolutions build it from their uint8 im2col rows.
 *     (vpmaddubsw saturates its int16 pair sums on full 8-bit activations: 2 x 255 x 127 > 32767. That is why
 *     torch's x86 recipe offers reduce_range, 7-bit activations, for CPUs without VNNI. Widening keeps every
 *     activation exact.)
 *   - otherwise portable C over k-quads, which the compiler vectorizes for what -march selects.
 * Narrow layers, whose uint8 activations are proven to be at most 127 (reduce_range's 7-bit activations: the code
 * generator checks the producer's clamp), take vpmaddubsw on AVX2: its int16 pair sums cannot saturate there
 * (2 x 127 x 128 < 32767), and vpmaddwd against ones widens them exactly. Their B is packed in int8 k-quads,
 * [K/4][NR][4]. On Zen 3 their micro-kernel ran 150-160 against 124 GOP/s per core: both forms spend two multiplies
 * per 32 products (vpmaddubsw + vpmaddwd against ones, or two vpmaddwd), the narrow one fewer shuffles and adds.
 * Every function that packs or reads B takes `narrow`; where the ISA has no narrow path (VNNI is as
 * fast on every activation; AVX-512BW keeps the widened pairs) a narrow layer packs and runs like any other.
 * int8 activations read as uint8 with their sign bit flipped (x + 128), the caller adding 128 to the zero point.
 * B panels are packed once, when the model is created (or per call, panel by panel, when the weight is an input),
 * with each column's sum of weights: the caller subtracts zero_point x column sum from the tile, so
 * sum_k (a - zero_point) * b needs no per-element offset.
 * Convolutions with packed weights convolve directly where the ISA takes them (kiln_qdirect_takes, further down),
 * else through im2col rows and the same GEMM steps. Weight-only layers (float activations) are at the end.
 */
#ifndef KILN_QGEMM_H
#define KILN_QGEMM_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KILN_QK 4   /* k values per packed group */
#define KILN_QNR 32 /* columns per panel: two zmm of int32 */
#define KILN_QMR 12
typedef int8_t kiln_qb_t;
#elif defined(__AVX512BW__)
#define KILN_QK 2
#define KILN_QNR 32
#define KILN_QMR 12
typedef int16_t kiln_qb_t;
#elif defined(__AVX2__)
#define KILN_QK 2
#define KILN_QNR 16 /* two ymm of int32 */
#define KILN_QMR 6
#define KILN_QNARROW 1 /* narrow layers: vpmaddubsw on int8 k-quads */
#define KILN_QWIDE_ROWS 1 /* full 8-bit linear layers: a chunk's rows copied as int16 pairs (kiln_qwiden_rows) */
typedef int8_t kiln_qb_t; /* int8 pairs, widened to int16 by vpmovsxbw as they load: half the bytes to stream */
#else
#define KILN_QK 4
#define KILN_QNR 16
#define KILN_QMR 4
typedef int8_t kiln_qb_t;
#endif
#ifndef KILN_QNARROW
#define KILN_QNARROW 0
#endif
#ifndef KILN_QWIDE_ROWS
#define KILN_QWIDE_ROWS 0
#endif

/* AMX (the AVX512_AMX capability): tdpbusd multiplies a tile of 16 rows x 64 uint8 activations by a tile of 16 k-quad
 * rows x 16 columns of int8 weights into 16 x 16 int32 sums, 16 K products per instruction. The VNNI panels are
 * already its B layout (a group's 32 columns are 128 bytes, columns 0-15 in the first 64), stored with K padded to
 * whole 64-byte k-blocks. A step is 32 rows against one panel: four accumulator tiles, two of A, two of B. */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && KILN_QK == 4 && KILN_QNR == 32
#define KILN_QAMX 1
#define KILN_QROWS 32 /* rows per step: two tiles of 16 */
#else
#define KILN_QAMX 0
#define KILN_QROWS KILN_QMR /* rows per step: one register tile */
#endif
/* Whether a convolution's gather flips int8 activations into uint8 (x + 128) as it copies them, instead of the
 * micro-kernel as it reads them: tiles load bytes as they are. */
#define KILN_QCOLS_FLIP KILN_QAMX

/* Output pixels a convolution unit gathers (im2col) and runs against every panel: a few steps of rows. */
#define KILN_QPB (KILN_QAMX ? 2 * KILN_QROWS : 4 * KILN_QMR)

/* k values per packed group, and bytes per packed weight, of a layer's B. */
static inline int64_t kiln_qk(int narrow) { return KILN_QNARROW && narrow ? 4 : KILN_QK; }
static inline size_t kiln_qb_size(int narrow) { return KILN_QNARROW && narrow ? 1 : sizeof(kiln_qb_t); }

/* Groups of k a row of activations spans, and the groups a panel stores (whole 64-byte k-blocks for AMX). */
static inline int64_t kiln_qsteps(int64_t K, int narrow) { return (K + kiln_qk(narrow) - 1) / kiln_qk(narrow); }
static inline int64_t kiln_qgroups(int64_t K, int narrow)
{
    return KILN_QAMX ? (kiln_qsteps(K, narrow) + 15) / 16 * 16 : kiln_qsteps(K, narrow);
}
static inline int64_t kiln_qpanels(int64_t N) { return (N + KILN_QNR - 1) / KILN_QNR; }

/* Bytes of one packed panel (a multiple of 32: QNR * QK * size >= 32; 64 for the narrow k-quads). */
static inline size_t kiln_qpanel_stride(int64_t K, int narrow)
{
    return (size_t)kiln_qgroups(K, narrow) * KILN_QNR * (size_t)kiln_qk(narrow) * kiln_qb_size(narrow);
}

/* Bytes of the packed panels; the int32 column sums follow them. */
static inline size_t kiln_qpanel_bytes(int64_t K, int64_t N, int narrow)
{
    return (size_t)kiln_qpanels(N) * kiln_qpanel_stride(K, narrow);
}

static inline size_t kiln_qpacked_bytes(int64_t K, int64_t N, int narrow)
{
    return kiln_qpanel_bytes(K, N, narrow) + (size_t)kiln_qpanels(N) * KILN_QNR * sizeof(int32_t);
}

/* Bytes of a convolution unit's im2col rows, [KILN_QPB][K rounded up to whole stored groups] uint8, to a cache line. */
static inline size_t kiln_qcols_bytes(int64_t K)
{
    return ((size_t)KILN_QPB * (size_t)(KILN_QAMX ? (K + 63) / 64 * 64 : (K + 3) / 4 * 4) + 63) / 64 * 64;
}

/* Pack columns [j * QNR, (j + 1) * QNR) of W^T (W [N x K], row-major int8) into one zero-padded panel
 * [groups][QNR][QK] (int8, or int16 for AVX-512BW's pairs), and their weight sums into colsum[0..QNR). */
static void kiln_qpack_panel(int64_t K, int64_t N, int64_t j, const int8_t* w, void* restrict panel,
                             int32_t* restrict colsum, int narrow)
{
    const int64_t qk = kiln_qk(narrow), groups = kiln_qgroups(K, narrow);
    const int bytes = kiln_qb_size(narrow) == 1;
    for (int64_t c = 0; c < KILN_QNR; ++c) {
        const int64_t n = j * KILN_QNR + c;
        int32_t sum = 0;
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t t = 0; t < qk; ++t) {
                const int64_t k = g * qk + t, at = (g * KILN_QNR + c) * qk + t;
                const int8_t v = n < N && k < K ? w[n * K + k] : 0;
                if (bytes) ((int8_t*)panel)[at] = v;
                else ((int16_t*)panel)[at] = v;
                sum += v;
            }
        colsum[c] = sum;
    }
}

/* All panels (panel j at dst + j * kiln_qpanel_stride), then all column sums (kiln_qpanel_bytes further on). */
static void kiln_qpack_b(int64_t K, int64_t N, const int8_t* w, void* restrict dst, int narrow)
{
    int32_t* colsum = (int32_t*)((char*)dst + kiln_qpanel_bytes(K, N, narrow));
    for (int64_t j = 0; j < kiln_qpanels(N); ++j)
        kiln_qpack_panel(K, N, j, w, (char*)dst + j * kiln_qpanel_stride(K, narrow), colsum + j * KILN_QNR, narrow);
}

/* Two int16 activations (a k-pair of a widened row) as one 32-bit lane. */
static inline int32_t kiln_load_pair(const int16_t* p)
{
    int32_t lane;
    memcpy(&lane, p, sizeof lane);
    return lane;
}

/* Four activation bytes as one 32-bit lane (an unaligned load). */
static inline int32_t kiln_load_four(const uint8_t* p)
{
    int32_t four;
    memcpy(&four, p, 4);
    return four;
}

/* `qk` (2 or 4) consecutive activations of a row from k on (zeros past K; the packed weights there are zero too) as
 * one 32-bit lane: four bytes, or two 16-bit values. `flip` (0x80 per byte) turns int8 into the uint8 x + 128. */
static inline int32_t kiln_qgroup(const uint8_t* row, int64_t k, int64_t K, uint32_t flip, int qk)
{
    uint8_t bytes[4] = {0, 0, 0, 0};
    for (int64_t t = k; t < K && t < k + qk; ++t) bytes[t - k] = row[t] ^ (uint8_t)flip;
    if (qk == 2) return (int32_t)((uint32_t)bytes[0] | (uint32_t)bytes[1] << 16);
    uint32_t lane;
    memcpy(&lane, bytes, 4);
    return (int32_t)lane;
}

#if defined(__AVX512BW__)
/* tile[r][0..32) = sum_k a[r][k] * B[k][.] for r < MR: 2 * MR zmm accumulators. */
#define KILN_DEFINE_QUKERNEL(MR)                                                                                  \
    static inline void kiln_qukernel_##MR(int64_t K, const uint8_t* a, int64_t lda, uint32_t flip,               \
                                          const kiln_qb_t* restrict panel, int32_t* restrict tile)               \
    {                                                                                                             \
        __m512i lo[MR], hi[MR];                                                                                   \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) { lo[r] = _mm512_setzero_si512(); hi[r] = lo[r]; } \
        const int64_t groups = kiln_qsteps(K, 0), full = K / KILN_QK;                                            \
        const int32_t flips = KILN_QK == 4 ? (int32_t)(flip * 0x01010101u) : (int32_t)(flip * 0x00010001u);    \
        for (int64_t g = 0; g < groups; ++g) {                                                                    \
            const __m512i b0 = _mm512_load_si512((const void*)(panel + g * KILN_QNR * KILN_QK));                 \
            const __m512i b1 = _mm512_load_si512((const void*)(panel + g * KILN_QNR * KILN_QK + 16 * KILN_QK));  \
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                               \
                int32_t lane;                                                                                     \
                if (g < full) {                                                                                   \
                    if (KILN_QK == 4) lane = kiln_load_four(a + r * lda + g * 4) ^ flips;                         \
                    else lane = (int32_t)((uint32_t)(a[r * lda + g * 2] ^ flip)                                   \
                                          | (uint32_t)(a[r * lda + g * 2 + 1] ^ flip) << 16);                     \
                } else lane = kiln_qgroup(a + r * lda, g * KILN_QK, K, flip, KILN_QK);                               \
                const __m512i x = _mm512_set1_epi32(lane);                                                        \
                KILN_QMAC(lo[r], x, b0);                                                                          \
                KILN_QMAC(hi[r], x, b1);                                                                          \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                                   \
            _mm512_store_si512((void*)(tile + r * KILN_QNR), lo[r]);                                              \
            _mm512_store_si512((void*)(tile + r * KILN_QNR + 16), hi[r]);                                         \
        }                                                                                                         \
    }
#if KILN_QK == 4
#define KILN_QMAC(acc, x, b) (acc) = _mm512_dpbusd_epi32((acc), (x), (b))
#else
#define KILN_QMAC(acc, x, b) (acc) = _mm512_add_epi32((acc), _mm512_madd_epi16((x), (b)))
#endif
#elif defined(__AVX2__)
/* 16 int8 weights (8 columns' k-pairs) as int16 lanes. */
#define KILN_QWIDEN(p) _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(p)))
/* Steps of one or two rows stream their weights from memory (a batch-1 layer's panels are read once): prefetching
 * 2 KB ahead took the one-row kernel from 9.5 to 11.9 GB/s on one core, a plain read's speed (AVX2, Xeon). */
#define KILN_QPREFETCH(MR, address)                                                                               \
    if ((MR) <= 2) _mm_prefetch((const char*)(address) + 2048, _MM_HINT_T0)
/* lo/hi[r] += row r's k-pair g (`read_pair`, with r in scope: an int32 holding two int16) x the panel's pair g. */
#define KILN_QPAIR_STEP(MR, g, read_pair)                                                                         \
    {                                                                                                             \
        const __m256i b0 = KILN_QWIDEN(panel + (g) * KILN_QNR * 2);                                               \
        const __m256i b1 = KILN_QWIDEN(panel + (g) * KILN_QNR * 2 + 16);                                          \
        if ((g) % 2 == 0) KILN_QPREFETCH(MR, panel + (g) * KILN_QNR * 2); /* a cache line per two pairs */        \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                    \
            const __m256i x = _mm256_set1_epi32(read_pair);                                                       \
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(x, b0));                                            \
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(x, b1));                                            \
        }                                                                                                         \
    }
/* The MR x 16 int32 accumulators into tile, its rows KILN_QNR apart. */
#define KILN_QSTORE_TILE(MR)                                                                                      \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                        \
        _mm256_store_si256((__m256i*)(tile + r * KILN_QNR), lo[r]);                                               \
        _mm256_store_si256((__m256i*)(tile + r * KILN_QNR + 8), hi[r]);                                           \
    }
/* tile[r][0..16) = sum_k a[r][k] * B[k][.] for r < MR: 2 * MR ymm accumulators (MR <= 6). */
#define KILN_DEFINE_QUKERNEL(MR)                                                                                  \
    static inline void kiln_qukernel_##MR(int64_t K, const uint8_t* a, int64_t lda, uint32_t flip,               \
                                          const kiln_qb_t* restrict panel, int32_t* restrict tile)               \
    {                                                                                                             \
        __m256i lo[MR], hi[MR];                                                                                   \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) { lo[r] = _mm256_setzero_si256(); hi[r] = lo[r]; }  \
        const int64_t groups = kiln_qsteps(K, 0);                                                                 \
        /* Two groups per step from one 4-byte broadcast: vpshufb spreads bytes (0, 1) or (2, 3) into the int16    \
         * pair every lane multiplies, instead of building each pair in scalar registers. */                        \
        const __m256i pick0 = _mm256_setr_epi8(0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1,             \
                                               0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1);            \
        const __m256i pick1 = _mm256_setr_epi8(2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1,             \
                                               2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1, 2, -1, 3, -1);            \
        const __m256i flips = _mm256_set1_epi8((char)flip);                                                       \
        int64_t g = 0;                                                                                            \
        for (; 2 * g + 4 <= K; g += 2) {                                                                          \
            const kiln_qb_t* p = panel + g * KILN_QNR * 2;                                                        \
            const __m256i b00 = KILN_QWIDEN(p);                                                                   \
            const __m256i b01 = KILN_QWIDEN(p + 16);                                                              \
            const __m256i b10 = KILN_QWIDEN(p + KILN_QNR * 2);                                                    \
            const __m256i b11 = KILN_QWIDEN(p + KILN_QNR * 2 + 16);                                               \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                \
                const __m256i v = _mm256_xor_si256(_mm256_set1_epi32(kiln_load_four(a + r * lda + 2 * g)),        \
                                                   flips);                                                      \
                const __m256i x0 = _mm256_shuffle_epi8(v, pick0), x1 = _mm256_shuffle_epi8(v, pick1);             \
                lo[r] = _mm256_add_epi32(lo[r], _mm256_add_epi32(_mm256_madd_epi16(x0, b00),                      \
                                                                 _mm256_madd_epi16(x1, b10)));                    \
                hi[r] = _mm256_add_epi32(hi[r], _mm256_add_epi32(_mm256_madd_epi16(x0, b01),                      \
                                                                 _mm256_madd_epi16(x1, b11)));                    \
            }                                                                                                     \
        }                                                                                                         \
        for (; g < groups; ++g) /* the last one or two groups */                                                  \
            KILN_QPAIR_STEP(MR, g, kiln_qgroup(a + r * lda, g * 2, K, flip, 2))                                   \
        KILN_QSTORE_TILE(MR)                                                                                      \
    }
/* Narrow rows (uint8 <= 127) against int8 k-quads: vpmaddubsw sums two u8 x s8 products per int16 lane without
 * saturating, vpmaddwd against ones adds each lane pair into int32. 2 x MR ymm accumulators (MR <= 6), the weights
 * read from memory by the multiplies, which leaves registers for the ones and the products. */
#define KILN_QNSTEP(MR, g, read_four)                                                                             \
    {                                                                                                             \
        const __m256i b0 = _mm256_load_si256((const __m256i*)(panel + (g) * KILN_QNR * 4));                       \
        const __m256i b1 = _mm256_load_si256((const __m256i*)(panel + (g) * KILN_QNR * 4 + 32));                  \
        KILN_QPREFETCH(MR, panel + (g) * KILN_QNR * 4);                                                           \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                    \
            const __m256i x = _mm256_set1_epi32(read_four);                                                       \
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones));                \
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones));                \
        }                                                                                                         \
    }
#define KILN_DEFINE_QNUKERNEL(MR)                                                                                 \
    static inline void kiln_qnukernel_##MR(int64_t K, const uint8_t* a, int64_t lda, const int8_t* restrict panel, \
                                           int32_t* restrict tile)                                                \
    {                                                                                                             \
        __m256i lo[MR], hi[MR];                                                                                   \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) { lo[r] = _mm256_setzero_si256(); hi[r] = lo[r]; }  \
        const __m256i ones = _mm256_set1_epi16(1);                                                                \
        const int64_t full = K / 4;                                                                               \
        for (int64_t g = 0; g < full; ++g) KILN_QNSTEP(MR, g, kiln_load_four(a + r * lda + 4 * g))                \
        /* The last quad (zeros past K) as a loop: as an `if`, GCC kept accumulators on the stack through the     \
         * main loop, and the MLP's layers at batch 32 ran 1.23x slower. */                                       \
        for (int64_t g = full; g < kiln_qsteps(K, 1); ++g)                                                        \
            KILN_QNSTEP(MR, g, kiln_qgroup(a + r * lda, 4 * g, K, 0, 4))                                          \
        KILN_QSTORE_TILE(MR)                                                                                      \
    }
KILN_DEFINE_QNUKERNEL(1)
KILN_DEFINE_QNUKERNEL(2)
KILN_DEFINE_QNUKERNEL(3)
KILN_DEFINE_QNUKERNEL(4)
KILN_DEFINE_QNUKERNEL(5)
KILN_DEFINE_QNUKERNEL(6)
/* A linear layer's full 8-bit rows, copied once per chunk as int16 (kiln_qwiden_rows): each k-pair of a row is one
 * 32-bit broadcast load, the pair vpmaddwd multiplies, where the uint8 kernel above spends an XOR and two vpshufb
 * per two pairs building it. The MLP's layers at batch 32 ran 1.25x faster (AVX2, 2 x 6 rows + 2 weights + the
 * broadcast + a product: 16 ymm). `lda`: int16 values between rows; the rows hold zeros from K to `pairs` x 2. */
#define KILN_DEFINE_QWUKERNEL(MR)                                                                                 \
    static inline void kiln_qwukernel_##MR(int64_t pairs, const int16_t* a, int64_t lda,                          \
                                           const int8_t* restrict panel, int32_t* restrict tile)                  \
    {                                                                                                             \
        __m256i lo[MR], hi[MR];                                                                                   \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) { lo[r] = _mm256_setzero_si256(); hi[r] = lo[r]; }   \
        for (int64_t g = 0; g < pairs; ++g) KILN_QPAIR_STEP(MR, g, kiln_load_pair(a + r * lda + 2 * g))           \
        KILN_QSTORE_TILE(MR)                                                                                      \
    }
KILN_DEFINE_QWUKERNEL(1)
KILN_DEFINE_QWUKERNEL(2)
KILN_DEFINE_QWUKERNEL(3)
KILN_DEFINE_QWUKERNEL(4)
KILN_DEFINE_QWUKERNEL(5)
KILN_DEFINE_QWUKERNEL(6)

/* One register tile of `rows` (1..6) widened rows against one packed panel of a full 8-bit layer. */
__attribute__((noinline)) static void kiln_qwukernel(int rows, int64_t K, const int16_t* a, int64_t lda,
                                                     const void* panel, int32_t* tile)
{
    const int8_t* pairs_panel = (const int8_t*)panel;
    const int64_t pairs = kiln_qsteps(K, 0);
    switch (rows) {
    case 1: kiln_qwukernel_1(pairs, a, lda, pairs_panel, tile); break;
    case 2: kiln_qwukernel_2(pairs, a, lda, pairs_panel, tile); break;
    case 3: kiln_qwukernel_3(pairs, a, lda, pairs_panel, tile); break;
    case 4: kiln_qwukernel_4(pairs, a, lda, pairs_panel, tile); break;
    case 5: kiln_qwukernel_5(pairs, a, lda, pairs_panel, tile); break;
    default: kiln_qwukernel_6(pairs, a, lda, pairs_panel, tile); break;
    }
}
#else
#define KILN_DEFINE_QUKERNEL(MR)                                                                                  \
    static inline void kiln_qukernel_##MR(int64_t K, const uint8_t* a, int64_t lda, uint32_t flip,               \
                                          const kiln_qb_t* restrict panel, int32_t* restrict tile)               \
    {                                                                                                             \
        int32_t acc[MR][KILN_QNR];                                                                                \
        memset(acc, 0, sizeof acc);                                                                               \
        for (int64_t g = 0; g < kiln_qsteps(K, 0); ++g)                                                           \
            for (int r = 0; r < MR; ++r) {                                                                        \
                int32_t x[KILN_QK];                                                                               \
                for (int t = 0; t < KILN_QK; ++t)                                                                 \
                    x[t] = g * KILN_QK + t < K ? (int32_t)(uint8_t)(a[r * lda + g * KILN_QK + t] ^ flip) : 0;     \
                for (int c = 0; c < KILN_QNR; ++c) {                                                              \
                    int32_t sum = 0;                                                                              \
                    for (int t = 0; t < KILN_QK; ++t) sum += x[t] * panel[(g * KILN_QNR + c) * KILN_QK + t];      \
                    acc[r][c] += sum;                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        memcpy(tile, acc, sizeof acc);                                                                            \
    }
#endif

KILN_DEFINE_QUKERNEL(1)
KILN_DEFINE_QUKERNEL(2)
KILN_DEFINE_QUKERNEL(3)
KILN_DEFINE_QUKERNEL(4)
#if KILN_QMR > 4
KILN_DEFINE_QUKERNEL(5)
KILN_DEFINE_QUKERNEL(6)
#endif
#if KILN_QMR > 6
KILN_DEFINE_QUKERNEL(7)
KILN_DEFINE_QUKERNEL(8)
KILN_DEFINE_QUKERNEL(9)
KILN_DEFINE_QUKERNEL(10)
KILN_DEFINE_QUKERNEL(11)
KILN_DEFINE_QUKERNEL(12)
#endif

/* One register tile of `rows` (1..KILN_QMR) rows of A (row stride lda) against one packed panel (see `narrow`). */
__attribute__((noinline)) static void kiln_qukernel(int rows, int64_t K, const uint8_t* a, int64_t lda, uint32_t flip,
                                                    const void* packed_panel, int32_t* tile, int narrow)
{
    const kiln_qb_t* panel = (const kiln_qb_t*)packed_panel;
#if KILN_QNARROW
    if (narrow) {
        const int8_t* quads = (const int8_t*)packed_panel;
        switch (rows) {
        case 1: kiln_qnukernel_1(K, a, lda, quads, tile); break;
        case 2: kiln_qnukernel_2(K, a, lda, quads, tile); break;
        case 3: kiln_qnukernel_3(K, a, lda, quads, tile); break;
        case 4: kiln_qnukernel_4(K, a, lda, quads, tile); break;
        case 5: kiln_qnukernel_5(K, a, lda, quads, tile); break;
        default: kiln_qnukernel_6(K, a, lda, quads, tile); break;
        }
        return;
    }
#else
    (void)narrow;
#endif
    switch (rows) {
    case 1: kiln_qukernel_1(K, a, lda, flip, panel, tile); break;
    case 2: kiln_qukernel_2(K, a, lda, flip, panel, tile); break;
    case 3: kiln_qukernel_3(K, a, lda, flip, panel, tile); break;
#if KILN_QMR == 4
    default: kiln_qukernel_4(K, a, lda, flip, panel, tile); break;
#else
    case 4: kiln_qukernel_4(K, a, lda, flip, panel, tile); break;
    case 5: kiln_qukernel_5(K, a, lda, flip, panel, tile); break;
#if KILN_QMR == 6
    default: kiln_qukernel_6(K, a, lda, flip, panel, tile); break;
#else
    case 6: kiln_qukernel_6(K, a, lda, flip, panel, tile); break;
    case 7: kiln_qukernel_7(K, a, lda, flip, panel, tile); break;
    case 8: kiln_qukernel_8(K, a, lda, flip, panel, tile); break;
    case 9: kiln_qukernel_9(K, a, lda, flip, panel, tile); break;
    case 10: kiln_qukernel_10(K, a, lda, flip, panel, tile); break;
    case 11: kiln_qukernel_11(K, a, lda, flip, panel, tile); break;
    default: kiln_qukernel_12(K, a, lda, flip, panel, tile); break;
#endif
#endif
    }
}


#if KILN_QAMX
/* Steps of fewer rows take the VNNI register tiles: a tile instruction costs as much for one row as for 16. */
#define KILN_QAMX_MIN_ROWS 9

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} kiln_amx_config;

long syscall(long number, ...); /* <unistd.h> declares it only for _GNU_SOURCE; model.c is ISO C */

/* Linux gives a process the tiles' state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a
 * tile instruction before that raises SIGILL. kiln_create asks, for every thread of the process. 0 on success. */
static int kiln_amx_request(void) { return (int)syscall(158 /* SYS_arch_prctl */, 0x1023, 18); }

/* Per thread, around an integer kernel: every tile 16 rows x 64 bytes. Releasing the tiles after it spares the OS
 * saving 8 KB of tile state whenever it switches the thread out. */
static inline void kiln_qbegin(void)
{
    kiln_amx_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = 16;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
}
static inline void kiln_qend(void) { _tile_release(); }

/* tile[32][KILN_QNR] (rows >= 16 of it only for rows > 16) = A x one packed panel over KB 64-byte k-blocks. A's
 * 16-row tiles: the one of k-block kb at a + kb * a_block, its rows `lda` bytes apart, the second 16 rows after
 * those; every row of a tile is read, so rows past `rows` must be readable (their sums are not stored). The panel's
 * k-quads past K are zero. Tiles 0-3 accumulate, 4-5 hold A, 6-7 the panel's two halves. */
static inline void kiln_amx_step(int rows, int64_t KB, const uint8_t* a, int64_t lda, int64_t a_block,
                                 const int8_t* panel, int32_t* tile)
{
    const int64_t pitch = KILN_QNR * 4; /* bytes between a panel's k-quad rows */
    _tile_zero(0);
    _tile_zero(1);
    if (rows > 16) {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kb = 0; kb < KB; ++kb) {
            const int8_t* b = panel + kb * 16 * pitch;
            _tile_loadd(6, b, pitch);
            _tile_loadd(7, b + 64, pitch);
            _tile_loadd(4, a + kb * a_block, lda);
            _tile_loadd(5, a + kb * a_block + 16 * lda, lda);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
        _tile_stored(2, tile + 16 * KILN_QNR, pitch);
        _tile_stored(3, tile + 16 * KILN_QNR + 16, pitch);
    } else {
        for (int64_t kb = 0; kb < KB; ++kb) {
            const int8_t* b = panel + kb * 16 * pitch;
            _tile_loadd(6, b, pitch);
            _tile_loadd(7, b + 64, pitch);
            _tile_loadd(4, a + kb * a_block, lda);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
        }
    }
    _tile_stored(0, tile, pitch);
    _tile_stored(1, tile + 16, pitch);
}

/* Rows [first, end) of a linear layer's activations x [. x K], flipped, in AMX tile order: step s (32 rows), k-block
 * kb at dst + (s * KB + kb) * 2048, its rows 64 bytes apart, zero past K and past `end`. Tile loads then read 1 KB
 * in a row (x's own rows, K bytes apart, were 16 lines in as many pages: 4 KB apart, all in one L1 set). */
static void kiln_amx_pack_rows(const uint8_t* x, int64_t first, int64_t end, int64_t K, uint32_t flip, uint8_t* dst)
{
    const int64_t KB = (K + 63) / 64, steps = (end - first + 31) / 32;
    for (int64_t s = 0; s < steps; ++s)
        for (int r = 0; r < 32; ++r) {
            const int64_t row = first + s * 32 + r;
            for (int64_t kb = 0; kb < KB; ++kb) {
                uint8_t* to = dst + ((s * KB + kb) * 32 + r) * 64;
                const int64_t copied = row >= end ? 0 : K - kb * 64 < 64 ? K - kb * 64 : 64;
                const uint8_t* from = x + row * K + kb * 64;
                for (int64_t t = 0; t < copied; ++t) to[t] = from[t] ^ (uint8_t)flip;
                if (copied < 64) memset(to + copied, 0, (size_t)(64 - copied));
            }
        }
}
#else
static inline void kiln_qbegin(void) {}
static inline void kiln_qend(void) {}
#endif

/* A thread's copy of one chunk of a linear layer's rows, kept while the thread's run of units over panels shares the
 * chunk: for AMX steps in tile order (kiln_amx_pack_rows), for AVX2's full 8-bit layers as int16 (kiln_qwiden_rows).
 * `first`: the chunk's first row, -1 for none yet. */
typedef struct {
    uint8_t* rows;
    int64_t first;
} kiln_qrow_block;

/* int16 values between the rows of an AVX2 copy (kiln_qwiden_rows): K rounded up to 16, a whole 32 bytes. */
static inline int64_t kiln_qwide_lda(int64_t K) { return (K + 15) / 16 * 16; }

/* The most rows of a K-wide linear layer a chunk takes, and the bytes of the chunk's copy: AMX's copy stays within
 * 256 KB, one 32-row step at least, in L2 beside the panels streaming through; AVX2's int16 copy of a full 8-bit
 * layer within 512 KB, one step at least (the MLP's 32 rows of 4096 in one chunk, whose panels then stream once);
 * otherwise (narrow layers too) the rows are read in place, and a chunk takes any number. */
static inline int64_t kiln_qchunk_rows(int64_t K, int narrow)
{
    (void)narrow;
#if KILN_QAMX
    const int64_t rows = (int64_t)(256 * 1024) / ((K + 63) / 64 * 64) / 32 * 32;
    return rows > 32 ? rows : 32;
#elif KILN_QWIDE_ROWS
    const int64_t rows = (int64_t)(512 * 1024) / (2 * kiln_qwide_lda(K)) / KILN_QROWS * KILN_QROWS;
    return narrow ? INT64_MAX : rows > KILN_QROWS ? rows : KILN_QROWS;
#else
    return INT64_MAX;
#endif
}
static inline size_t kiln_qrow_block_bytes(int64_t K, int64_t M, int narrow)
{
    const int64_t most = kiln_qchunk_rows(K, narrow);
#if KILN_QAMX
    const int64_t rows = (M + 31) / 32 * 32;
    return (size_t)(rows < most ? rows : most) * (size_t)((K + 63) / 64 * 64);
#elif KILN_QWIDE_ROWS
    const size_t bytes = (size_t)(M < most ? M : most) * (size_t)kiln_qwide_lda(K) * sizeof(int16_t);
    return narrow ? 0 : (bytes + 63) / 64 * 64; /* the panel a unit packs follows, 64-byte aligned */
#else
    (void)M;
    return 0;
#endif
}

#if KILN_QWIDE_ROWS
/* Rows [first, end) of a linear layer's activations x [. x K] (flipped: int8 read as uint8) as int16 at dst, rows
 * kiln_qwide_lda(K) apart, zero past K. */
static void kiln_qwiden_rows(const uint8_t* x, int64_t first, int64_t end, int64_t K, uint32_t flip, int16_t* dst)
{
    const int64_t lda = kiln_qwide_lda(K);
    const __m128i flips = _mm_set1_epi8((char)flip);
    for (int64_t row = first; row < end; ++row) {
        const uint8_t* from = x + row * K;
        int16_t* to = dst + (row - first) * lda;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16)
            _mm256_store_si256((__m256i*)(to + k), _mm256_cvtepu8_epi16(
                _mm_xor_si128(_mm_loadu_si128((const __m128i*)(from + k)), flips)));
        for (; k < K; ++k) to[k] = (int16_t)(uint8_t)(from[k] ^ (uint8_t)flip);
        for (; k < lda; ++k) to[k] = 0;
    }
}
#endif

/* One step of a linear layer: tile[rows][KILN_QNR] = rows [row, row + rows) of x [. x K] (uint8, or int8 read with
 * `flip`), in the chunk [first, end), against one packed panel. AMX steps, and AVX2's on full 8-bit rows, read the
 * chunk's rows from `block`, copied there by the first step that needs them. */
static inline void kiln_qlinear_step(int rows, int64_t row, int64_t first, int64_t end, int64_t K, const uint8_t* x,
                                     uint32_t flip, const void* panel, int32_t* tile, int narrow,
                                     kiln_qrow_block* block)
{
#if KILN_QAMX
    if (rows >= KILN_QAMX_MIN_ROWS) {
        const int64_t KB = (K + 63) / 64;
        if (block->first != first) {
            kiln_amx_pack_rows(x, first, end, K, flip, block->rows);
            block->first = first;
        }
        kiln_amx_step(rows, KB, block->rows + (row - first) / 32 * KB * 2048, 64, 2048, (const int8_t*)panel, tile);
        return;
    }
#endif
#if KILN_QWIDE_ROWS
    if (!narrow) {
        const int64_t lda = kiln_qwide_lda(K);
        if (block->first != first) {
            kiln_qwiden_rows(x, first, end, K, flip, (int16_t*)block->rows);
            block->first = first;
        }
        kiln_qwukernel(rows, K, (const int16_t*)block->rows + (row - first) * lda, lda, panel, tile);
        return;
    }
#endif
    (void)first;
    (void)end;
    (void)block;
    for (int r = 0; r < rows; r += KILN_QMR)
        kiln_qukernel(rows - r < KILN_QMR ? rows - r : KILN_QMR, K, x + (row + r) * K, K, flip, panel,
                      tile + r * KILN_QNR, narrow);
}

/* One step of a convolution: tile[rows][KILN_QNR] = `rows` im2col rows (KP bytes apart, a whole KILN_QPB-row buffer
 * behind them) against one packed panel. */
static inline void kiln_qcols_step(int rows, int64_t KP, const uint8_t* cols, uint32_t flip, const void* panel,
                                   int32_t* tile, int narrow)
{
#if KILN_QAMX
    if (rows >= KILN_QAMX_MIN_ROWS && !flip) { /* tiles cannot flip: AMX builds flip int8 as they gather */
        kiln_amx_step(rows, KP / 64, cols, KP, 64, (const int8_t*)panel, tile);
        return;
    }
#endif
    for (int r = 0; r < rows; r += KILN_QMR)
        kiln_qukernel(rows - r < KILN_QMR ? rows - r : KILN_QMR, KP, cols + r * KP, KP, flip, panel,
                      tile + r * KILN_QNR, narrow);
}

/* The fused epilogue of one tile row, KILN_QNR int32 sums of a panel's columns: the activations' zero point out
 * (zcol[c] = zero point x column sum), times the column's scale (x_scale x weight scale), plus its bias (NULL: none),
 * plus a residual (float, `residual_stride` apart per column; NULL: none), the post-op (relu, or gelu as kiln_math.h's
 * kiln_geluf / kiln_gelu_tanhf compute it for float32 pointwise kernels), then stored as float32 (kind 0) or
 * requantized as quantize_per_tensor does: round half to even, the zero point, the clamp [low, high], uint8 (kind 1)
 * or int8 (kind 2). Only columns below `width` are stored. Each path does the same float operations in the same
 * order (multiply, then add: model.c is ISO C, which contracts nothing into FMAs), so they give the same bits. */
enum { KILN_QOUT_F32 = 0, KILN_QOUT_U8 = 1, KILN_QOUT_S8 = 2 };
enum { KILN_QPOST_NONE = 0, KILN_QPOST_RELU = 1, KILN_QPOST_GELU = 2, KILN_QPOST_GELU_TANH = 3 };

/* One value requantized as quantize_per_tensor does: round half to even (the current rounding mode), the zero
 * point, the clamp [low, high]; the result is a whole number in the output type's range. */
static inline float kiln_requantize(float v, float inverse_scale, float zero_point, float low, float high)
{
    const float q = nearbyintf(v * inverse_scale) + zero_point;
    return q < low ? low : q > high ? high : q;
}

static inline void kiln_qgelu(float* y, int post_op)
{
    if (post_op == KILN_QPOST_GELU) {
        _Pragma("omp simd") for (int c = 0; c < KILN_QNR; ++c) y[c] = kiln_geluf(y[c]);
    } else if (post_op == KILN_QPOST_GELU_TANH) {
        _Pragma("omp simd") for (int c = 0; c < KILN_QNR; ++c) y[c] = kiln_gelu_tanhf(y[c]);
    }
}

static inline void kiln_qepilogue(const int32_t* tile, const int32_t* zcol, const float* scale, const float* bias,
                                  int per_column, const float* residual, int64_t residual_stride, int post_op,
                                  int kind, float inverse_scale, float zero_point, float low, float high,
                                  int64_t width, void* out)
{
    float y[KILN_QNR] __attribute__((aligned(64)));
    uint8_t bytes[KILN_QNR] __attribute__((aligned(64)));
    float extra[KILN_QNR] __attribute__((aligned(64)));
    if (residual)
        for (int64_t c = 0; c < KILN_QNR; ++c) extra[c] = c < width ? residual[c * residual_stride] : 0.0f;
#if defined(__AVX512BW__) && defined(__AVX512VL__) && KILN_QNR % 16 == 0
    for (int h = 0; h < KILN_QNR; h += 16) {
        const __m512i sums = _mm512_sub_epi32(_mm512_load_si512((const void*)(tile + h)),
                                              per_column ? _mm512_loadu_si512((const void*)(zcol + h))
                                                         : _mm512_set1_epi32(zcol[0]));
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sums),
                                 per_column ? _mm512_loadu_ps(scale + h) : _mm512_set1_ps(scale[0]));
        if (bias) v = _mm512_add_ps(v, per_column ? _mm512_loadu_ps(bias + h) : _mm512_set1_ps(bias[0]));
        if (residual) v = _mm512_add_ps(v, _mm512_load_ps(extra + h));
        if (post_op == KILN_QPOST_RELU) v = _mm512_max_ps(v, _mm512_setzero_ps()); /* NaN and -0.0 as y > 0 ? y : 0 */
        _mm512_store_ps(y + h, v);
    }
    kiln_qgelu(y, post_op);
    /* Masked stores straight to `out` (bytes stored in halves, then copied as one 32-byte block, stalled on store
     * forwarding: 15% of the uint8 stem convolution). */
    for (int h = 0; h < KILN_QNR; h += 16) {
        const int64_t left = width - h;
        const __mmask16 lanes = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        if (kind == KILN_QOUT_F32) {
            _mm512_mask_storeu_ps((float*)out + h, lanes, _mm512_load_ps(y + h));
            continue;
        }
        __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_load_ps(y + h), _mm512_set1_ps(inverse_scale)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_add_ps(q, _mm512_set1_ps(zero_point));
        q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(low)), _mm512_set1_ps(high));
        const __m512i ints = _mm512_cvtps_epi32(q); /* whole numbers in [low, high]: exact */
        _mm_mask_storeu_epi8((uint8_t*)out + h, lanes, kind == KILN_QOUT_U8 ? _mm512_cvtusepi32_epi8(ints)
                                                                              : _mm512_cvtsepi32_epi8(ints));
    }
    (void)bytes;
    return;
#elif defined(__AVX2__)
    for (int h = 0; h < KILN_QNR; h += 8) {
        const __m256i sums = _mm256_sub_epi32(_mm256_load_si256((const __m256i*)(tile + h)),
                                              per_column ? _mm256_loadu_si256((const __m256i*)(zcol + h))
                                                         : _mm256_set1_epi32(zcol[0]));
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(sums),
                                 per_column ? _mm256_loadu_ps(scale + h) : _mm256_set1_ps(scale[0]));
        if (bias) v = _mm256_add_ps(v, per_column ? _mm256_loadu_ps(bias + h) : _mm256_set1_ps(bias[0]));
        if (residual) v = _mm256_add_ps(v, _mm256_load_ps(extra + h));
        if (post_op == KILN_QPOST_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps()); /* NaN and -0.0 as y > 0 ? y : 0 */
        _mm256_store_ps(y + h, v);
    }
    kiln_qgelu(y, post_op);
    if (kind != KILN_QOUT_F32)
        for (int h = 0; h < KILN_QNR; h += 8) {
            __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_load_ps(y + h), _mm256_set1_ps(inverse_scale)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm256_add_ps(q, _mm256_set1_ps(zero_point));
            q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(low)), _mm256_set1_ps(high));
            const __m256i ints = _mm256_cvtps_epi32(q); /* whole numbers in [low, high]: exact */
            const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(ints), _mm256_extracti128_si256(ints, 1));
            /* whole rows straight to `out` (a copy of bytes stored in halves would stall on store forwarding) */
            _mm_storel_epi64((__m128i*)(width == KILN_QNR ? (uint8_t*)out + h : bytes + h),
                             kind == KILN_QOUT_U8 ? _mm_packus_epi16(words, words) : _mm_packs_epi16(words, words));
        }
    if (kind != KILN_QOUT_F32 && width == KILN_QNR) return;
#else
    for (int64_t c = 0; c < KILN_QNR; ++c) {
        const int64_t k = per_column ? c : 0;
        float v = (float)(tile[c] - zcol[k]) * scale[k];
        if (bias) v += bias[k];
        if (residual) v += extra[c];
        if (post_op == KILN_QPOST_RELU) v = v > 0.0f ? v : 0.0f;
        y[c] = v;
    }
    kiln_qgelu(y, post_op);
    if (kind != KILN_QOUT_F32)
        for (int64_t c = 0; c < KILN_QNR; ++c) {
            const float clamped = kiln_requantize(y[c], inverse_scale, zero_point, low, high);
            bytes[c] = kind == KILN_QOUT_U8 ? (uint8_t)clamped : (uint8_t)(int8_t)clamped;
        }
#endif
    const size_t size = kind == KILN_QOUT_F32 ? sizeof(float) : 1;
    if (width == KILN_QNR) memcpy(out, kind == KILN_QOUT_F32 ? (void*)y : (void*)bytes, KILN_QNR * size); /* moves */
    else memcpy(out, kind == KILN_QOUT_F32 ? (void*)y : (void*)bytes, (size_t)width * size);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Direct convolutions (AMX, AVX-512 VNNI and AVX2): no im2col. Output channels are the rows of a step and output
 * pixels its columns, C[couts][pixels] += W_tap[couts][channels] x X_tap[channels][pixels] for every tap (ki, kj).
 * The activations' layout is channel quads: 4 bytes per pixel (4 channels), 16 pixels in 64 bytes, as AMX's B tiles
 * and vpdpbusd's lanes take them. A unit first copies its band of input rows once into that layout
 * (kiln_qdirect_input: padded with the zero point, split by column phase for strides), and every tap then reads its
 * pixels with plain loads from it. Channels per k-step: all of them (rounded to 4) up to 64, else 64 at a time.
 * A step is 32 output channels (a packed panel) by KILN_QNR pixels:
 *   - AMX: tdpbsud, the int8 weights (A tiles) times the uint8 activations (B tiles);
 *   - AVX-512 VNNI: vpdpbusd, 16 pixels' quads per zmm times one output channel's 4 weights broadcast, 8 channels x
 *     32 pixels of accumulators;
 *   - AVX2, narrow (7-bit) activations only: vpmaddubsw then vpmaddwd against ones, 4 channels x 16 pixels.
 * Channel quads at their natural stride make the packing the same for every ISA.
 */
#if KILN_QAMX || (defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define KILN_QDIRECT 1
#define kiln_qdirect_takes(narrow) 1
#elif defined(__AVX2__) && !defined(__AVX512BW__)
#define KILN_QDIRECT 1
/* Full 8-bit activations, widened to int16 for vpmaddwd (two sums per pixel, added at the end), ran the CNN's
 * convolutions in 1.15x the im2col path's time: only narrow layers convolve directly on AVX2. */
#define kiln_qdirect_takes(narrow) (narrow)
#else
#define KILN_QDIRECT 0
#endif
#if KILN_QDIRECT

/* A layer with few channels per group (an RGB stem) folds its kernel's columns into the channels: channel
 * ci * KW + kj of the copied input is channel ci shifted by tap column kj (and its stride), so each step runs KH
 * taps of CG x KW channels instead of KH x KW taps of CG (3 channels would pad every tap's k-step to 4 at least). */

/* Bytes of a k-step of channels: a group's channels rounded up to 4 (at most 64), or 64. */
static inline int64_t kiln_qdirect_kbytes(int64_t CG) { return CG <= 64 ? (CG + 3) / 4 * 4 : 64; }
static inline int64_t kiln_qdirect_ksteps(int64_t CG) { return CG <= 64 ? 1 : (CG + 63) / 64; }
/* Panels of 32 output channels. */
static inline int64_t kiln_qdirect_panels(int64_t COG) { return (COG + 31) / 32; }

/* AMX: tiles 0-3 accumulate 16 x 16 int32; 4-5 (A) are 16 rows of `kbytes`, 6-7 (B) kbytes / 4 rows of 64 bytes. */
static inline void kiln_qbegin_direct(int64_t kbytes)
{
#if !KILN_QAMX
    (void)kbytes;
#else
    kiln_amx_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = t >= 6 ? (uint8_t)(kbytes / 4) : 16;
        config.bytes_per_row[t] = t == 4 || t == 5 ? (uint16_t)kbytes : 64;
    }
    _tile_loadconfig(&config);
#endif
}

/* Bytes of a group's packed weights for CG (folded: CG x KW) channels and `taps` taps: per 32-channel panel, per
 * tap, per k-step, 32 rows of 64 bytes (two A tiles); then each output channel's weight sum (int32). */
static inline size_t kiln_qdirect_weight_bytes(int64_t COG, int64_t CG, int64_t taps)
{
    return (size_t)kiln_qdirect_panels(COG) * (size_t)(taps * kiln_qdirect_ksteps(CG)) * 2048 + (size_t)kiln_qdirect_panels(COG) * 128;
}

/* Pack one group's weights W [COG][CG][KH][KW] (int8) for direct steps, zero past COG and the channels; `fold`:
 * channel ci * KW + kj of tap ki (else channel ci of tap ki * KW + kj). */
static void kiln_qpack_direct(int64_t COG, int64_t CG, int64_t KH, int64_t KW, int fold, const int8_t* w,
                              void* restrict dst)
{
    const int64_t channels = fold ? CG * KW : CG, taps = fold ? KH : KH * KW;
    const int64_t steps = kiln_qdirect_ksteps(channels), panels = kiln_qdirect_panels(COG);
    int8_t* packed = (int8_t*)dst;
    int32_t* sums = (int32_t*)(packed + (size_t)panels * (size_t)(taps * steps) * 2048);
    memset(packed, 0, (size_t)panels * (size_t)(taps * steps) * 2048);
    for (int64_t co = 0; co < panels * 32; ++co) {
        int32_t sum = 0;
        for (int64_t ci = 0; ci < CG && co < COG; ++ci)
            for (int64_t ki = 0; ki < KH; ++ki)
                for (int64_t kj = 0; kj < KW; ++kj) {
                    const int8_t v = w[((co * CG + ci) * KH + ki) * KW + kj];
                    const int64_t channel = fold ? ci * KW + kj : ci, tap = fold ? ki : ki * KW + kj;
                    packed[(((co / 32) * taps + tap) * steps + channel / 64) * 2048 + (co % 32) * 64 + channel % 64] =
                        v;
                    sum += v;
                }
        sums[co] = sum;
    }
}

/* Rows [row0, row0 + rows) of one image's group of CG channels (x: [CG][H][W]), as B tiles read them: for channel
 * quad q, row r, column phase f, column c: 4 bytes (channels 4q..4q+3) at dst + (((q * rows + r) * phases + f) *
 * cols + c) * 4. Unfolded (fold_kw 1), channel ci reads input column iw = f + c * sw - pw, in `sw` phases (a stride's
 * output columns then read consecutive columns of one phase); folded, channel ci * fold_kw + kj reads
 * iw = c * sw + kj * dw - pw, in one phase. Positions outside the image (or past the channels) hold `pad`, the zero
 * point. Bytes flip (x + 128 for int8) as they copy. */
static void kiln_qdirect_input(const uint8_t* x, int64_t CG, int64_t H, int64_t W, int64_t row0, int64_t rows,
                               int64_t sw, int64_t dw, int64_t pw, int64_t fold_kw, int64_t cols, uint8_t pad,
                               uint8_t flip, uint8_t* restrict dst)
{
    const int64_t channels = CG * fold_kw, phases = fold_kw > 1 ? 1 : sw;
    const int64_t quads = kiln_qdirect_ksteps(channels) * kiln_qdirect_kbytes(channels) / 4;
    for (int64_t q = 0; q < quads; ++q)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t ih = row0 + r;
            for (int64_t f = 0; f < phases; ++f) {
                uint8_t* to = dst + (((q * rows + r) * phases + f) * cols) * 4;
                for (int t = 0; t < 4; ++t) {
                    const int64_t channel = q * 4 + t, ci = channel / fold_kw;
                    if (channel >= channels || ih < 0 || ih >= H) {
                        for (int64_t c = 0; c < cols; ++c) to[c * 4 + t] = pad;
                        continue;
                    }
                    const uint8_t* line = x + (ci * H + ih) * W;
                    const int64_t first = fold_kw > 1 ? (channel % fold_kw) * dw - pw : f - pw;
                    for (int64_t c = 0; c < cols; ++c) {
                        const int64_t iw = first + c * sw;
                        to[c * 4 + t] = iw >= 0 && iw < W ? (uint8_t)(line[iw] ^ flip) : pad;
                    }
                }
            }
        }
}

/* The epilogue of one output channel's row of a direct step: kiln_qepilogue with the channel's constants (zero
 * point x weight sum, scale, bias) for all its pixels, the residual's and output's pixels consecutive. */
static inline void kiln_qdirect_epilogue(const int32_t* tile_row, int32_t zsum, float scale, const float* bias,
                                         const float* residual, int post_op, int kind, float inverse_scale,
                                         float zero_point, float low, float high, int64_t width, void* out)
{
    kiln_qepilogue(tile_row, &zsum, &scale, bias, 0, residual, 1, post_op, kind, inverse_scale, zero_point, low, high,
                   width, out);
}

#if !KILN_QAMX && defined(__AVX512VNNI__)
#define KILN_QDIRECT_ROWS 8
/* tile[r][0..32) for the 8 output channels whose packed weights start at `weights`: each tap's and k-step's quads,
 * two zmm of 16 pixels' activations each, times each channel's 4 weights broadcast (vpdpbusd). */
static inline void kiln_qdirect_regs(const int8_t* weights, int64_t taps, int64_t KW, int64_t steps, int64_t quads,
                                     int narrow, const uint8_t* input, int64_t plane, int64_t cols, int64_t sw,
                                     int64_t dh, int64_t dw, int64_t row, int64_t column, int32_t* tile)
{
    __m512i lo[8], hi[8];
    (void)narrow; /* vpdpbusd is exact on every uint8 */
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; ++r) { lo[r] = _mm512_setzero_si512(); hi[r] = lo[r]; }
    for (int64_t t = 0; t < taps; ++t) {
        const int64_t ki = t / KW, kj = t % KW;
        const uint8_t* b = input + (((row + ki * dh) * sw + (kj * dw) % sw) * cols + column + (kj * dw) / sw) * 4;
        for (int64_t s = 0; s < steps; ++s) {
            const uint8_t* a = (const uint8_t*)weights + (t * steps + s) * 2048;
            const uint8_t* x = b + s * 16 * plane;
            for (int64_t q = 0; q < quads; ++q) {
                const __m512i x0 = _mm512_loadu_si512((const void*)(x + q * plane));
                const __m512i x1 = _mm512_loadu_si512((const void*)(x + q * plane + 64));
                _Pragma("GCC unroll 8") for (int r = 0; r < 8; ++r) {
                    const __m512i w = _mm512_set1_epi32(kiln_load_four(a + r * 64 + q * 4));
                    lo[r] = _mm512_dpbusd_epi32(lo[r], x0, w);
                    hi[r] = _mm512_dpbusd_epi32(hi[r], x1, w);
                }
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; ++r) {
        _mm512_storeu_si512((void*)(tile + r * KILN_QNR), lo[r]);
        _mm512_storeu_si512((void*)(tile + r * KILN_QNR + 16), hi[r]);
    }
}
#elif !KILN_QAMX
#define KILN_QDIRECT_ROWS 4
/* tile[r][0..16) for the 4 output channels whose packed weights start at `weights`, of a narrow layer (7-bit
 * activations): vpmaddubsw of 8 pixels' quads (32 bytes) by a channel's 4 weights broadcast, then vpmaddwd against
 * ones: exact, as 2 x 127 x 128 fits int16. */
static inline void kiln_qdirect_regs(const int8_t* weights, int64_t taps, int64_t KW, int64_t steps, int64_t quads,
                                     int narrow, const uint8_t* input, int64_t plane, int64_t cols, int64_t sw,
                                     int64_t dh, int64_t dw, int64_t row, int64_t column, int32_t* tile)
{
    (void)narrow; /* (only narrow layers convolve directly on AVX2) */
    {
        __m256i lo[4], hi[4];
        const __m256i ones = _mm256_set1_epi16(1);
        for (int r = 0; r < 4; ++r) { lo[r] = _mm256_setzero_si256(); hi[r] = lo[r]; }
        for (int64_t t = 0; t < taps; ++t) {
            const int64_t ki = t / KW, kj = t % KW;
            const uint8_t* b = input + (((row + ki * dh) * sw + (kj * dw) % sw) * cols + column + (kj * dw) / sw) * 4;
            for (int64_t s = 0; s < steps; ++s) {
                const uint8_t* a = (const uint8_t*)weights + (t * steps + s) * 2048;
                const uint8_t* x = b + s * 16 * plane;
                for (int64_t q = 0; q < quads; ++q) {
                    const __m256i x0 = _mm256_loadu_si256((const __m256i*)(x + q * plane));
                    const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x + q * plane + 32));
                    for (int r = 0; r < 4; ++r) {
                        const __m256i w = _mm256_set1_epi32(kiln_load_four(a + r * 64 + q * 4));
                        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x0, w), ones));
                        hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(x1, w), ones));
                    }
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            _mm256_storeu_si256((__m256i*)(tile + r * KILN_QNR), lo[r]);
            _mm256_storeu_si256((__m256i*)(tile + r * KILN_QNR + 8), hi[r]);
        }
    }
}
#endif

/* tile[32 output channels][KILN_QNR pixels] (rows KILN_QNR apart) = one panel's weights x the unit's input over every
 * tap: pixels from column `column` of output row `row` (band-relative input row row * sh), `pixels` of them,
 * `couts` output channels, k-steps of `quads` channel quads. Folded layers have KW, sw and dw of 1. */
static inline void kiln_qdirect_step(int couts, int pixels, const int8_t* panel, int64_t taps, int64_t KW,
                                     int64_t steps, int64_t quads, int narrow, const uint8_t* input, int64_t rows,
                                     int64_t cols, int64_t sw, int64_t dh, int64_t dw, int64_t row, int64_t column,
                                     int32_t* tile)
{
    const int64_t plane = rows * sw * cols * 4;
#if KILN_QAMX  /* 16 x 16 tiles: channels 0-15 and 16-31 by pixels 0-15 and 16-31 */
    const int64_t pitch = KILN_QNR * 4;
    (void)quads;
    (void)narrow;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < taps; ++t) {
        const int64_t ki = t / KW, kj = t % KW, r = row + ki * dh;
        const int64_t phase = (kj * dw) % sw, c = column + (kj * dw) / sw;
        for (int64_t s = 0; s < steps; ++s) {
            const int8_t* a = panel + (t * steps + s) * 2048;
            const uint8_t* b = input + s * 16 * plane + ((r * sw + phase) * cols + c) * 4;
            _tile_loadd(4, a, 64);
            _tile_loadd(6, b, plane);
            _tile_dpbsud(0, 4, 6);
            if (pixels > 16) {
                _tile_loadd(7, b + 64, plane);
                _tile_dpbsud(1, 4, 7);
            }
            if (couts > 16) {
                _tile_loadd(5, a + 1024, 64);
                _tile_dpbsud(2, 5, 6);
                if (pixels > 16) _tile_dpbsud(3, 5, 7);
            }
        }
    }
    _tile_stored(0, tile, pitch);
    _tile_stored(1, tile + 16, pitch);
    _tile_stored(2, tile + 16 * KILN_QNR, pitch);
    _tile_stored(3, tile + 16 * KILN_QNR + 16, pitch);
#else /* register steps of KILN_QDIRECT_ROWS output channels */
    (void)pixels;
    for (int r = 0; r < couts; r += KILN_QDIRECT_ROWS)
        kiln_qdirect_regs(panel + r * 64, taps, KW, steps, quads, narrow, input, plane, cols, sw, dh, dw, row, column,
                          tile + r * KILN_QNR);
#endif
}
#endif
/* ---------------------------------------------------------------------------------------------------------------
 * Weight-only linear layers: C[M x N] (float) = A[M x K] (float activations, rows in place) * W^T, W int8 or int4
 * values with a scale and a zero point per group of `gs` consecutive k of each column (per channel: gs = K).
 * Panels of KILN_WNR columns are packed at create: weights [K][WNR] int8, or int4 two per byte ([K/2][WNR], k even
 * in the low nibble), then per group the columns' scales and zero points. For a few rows (decoding), the micro-kernel
 * converts weights to float in registers and sums each group's products before scaling them:
 * sum_g s_g * sum_{k in g} a_k w_k - zp_g s_g * sum_{k in g} a_k. For many rows, a unit dequantizes its panel to
 * float once, (w - zp) x s as the reference does, and runs the float32 micro-kernel (kiln_gemm.h) on it.
 */
#if defined(__AVX512F__)
#define KILN_WNR 32
#define KILN_WMR 6
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_WNR 16
#define KILN_WMR 3
#else
#define KILN_WNR 32 /* KILN_NR: a dequantized panel feeds kiln_ukernel */
#define KILN_WMR 4
#endif

static inline int64_t kiln_wpanels(int64_t N) { return (N + KILN_WNR - 1) / KILN_WNR; }

static inline size_t kiln_wpanel_bytes(int64_t K, int64_t gs, int bits)
{
    const size_t weights = (size_t)(bits == 4 ? (K + 1) / 2 : K) * KILN_WNR;
    return (weights + 63) / 64 * 64 + (size_t)(K / gs) * 2 * KILN_WNR * sizeof(float);
}

/* Element i of a weight stored one value per byte, or (nibbles: int4 weights in a package's weights file) two per
 * byte, element 2m in the low nibble of byte m. */
static inline int8_t kiln_wvalue(const int8_t* w, int64_t i, int nibbles)
{
    if (!nibbles) return w[i];
    const int8_t byte = w[i >> 1];
    return (int8_t)(i & 1 ? byte >> 4 : (int8_t)(byte << 4) >> 4);
}

/* Pack panel j of W [N x K] with scales / zero points [N][K / gs] (zero_points: NULL, or int32 or int64 as
 * zero_point_bytes says). */
static void kiln_wpack_panel(int64_t K, int64_t N, int64_t gs, int bits, int64_t j, const int8_t* w, int nibbles,
                             const float* scales, const void* zero_points, int zero_point_bytes,
                             unsigned char* restrict panel)
{
    const int64_t groups = K / gs;
    float* params = (float*)(panel + ((size_t)(bits == 4 ? (K + 1) / 2 : K) * KILN_WNR + 63) / 64 * 64);
    for (int64_t c = 0; c < KILN_WNR; ++c) {
        const int64_t n = j * KILN_WNR + c;
        for (int64_t k = 0; k < K; ++k) {
            const int8_t v = n < N ? kiln_wvalue(w, n * K + k, nibbles) : 0;
            if (bits == 4) {
                unsigned char* byte = panel + (k / 2) * KILN_WNR + c;
                *byte = k % 2 ? (unsigned char)((*byte & 0x0F) | ((v & 0x0F) << 4)) : (unsigned char)(v & 0x0F);
            } else {
                panel[k * KILN_WNR + c] = (unsigned char)v;
            }
        }
        for (int64_t g = 0; g < groups; ++g) {
            const float scale = n < N ? scales[n * groups + g] : 0.0f;
            const int64_t at = n * groups + g;
            const float zero = n >= N || !zero_points ? 0.0f : zero_point_bytes == 8
                ? (float)((const int64_t*)zero_points)[at] : (float)((const int32_t*)zero_points)[at];
            params[(g * 2) * KILN_WNR + c] = scale;
            params[(g * 2 + 1) * KILN_WNR + c] = zero;
        }
    }
}

static void kiln_wpack(int64_t K, int64_t N, int64_t gs, int bits, const int8_t* w, int nibbles, const float* scales,
                       const void* zero_points, int zero_point_bytes, unsigned char* restrict dst)
{
    for (int64_t j = 0; j < kiln_wpanels(N); ++j)
        kiln_wpack_panel(K, N, gs, bits, j, w, nibbles, scales, zero_points, zero_point_bytes,
                         dst + (size_t)j * kiln_wpanel_bytes(K, gs, bits));
}

#if defined(__AVX512F__)
/* 16 weights of one k from 16 bytes (int8), or from the low / high nibbles of 16 bytes (int4), as floats. */
static inline __m512 kiln_w16(const unsigned char* p, int bits, int high)
{
    __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
    if (bits == 4) v = high ? _mm512_srai_epi32(v, 4) : _mm512_srai_epi32(_mm512_slli_epi32(v, 28), 28);
    return _mm512_cvtepi32_ps(v);
}
/* 16 columns' int4 weights of a k pair (k even in each byte's low nibble, k odd in its high one) as floats, looked up
 * from a table of the 16 values by the nibble (vpermps reads an index's low 4 bits): one load and widen, a shift and
 * two lookups for 32 weights, where converting each k took a load, a widen, shifts and a conversion. */
static inline void kiln_w16_nibbles(const unsigned char* p, __m512* even, __m512* odd)
{
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    *even = _mm512_permutexvar_ps(bytes, values);
    *odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values);
}
#define KILN_DEFINE_WUKERNEL(MR)                                                                                  \
    static inline void kiln_wukernel_##MR(int64_t K, int64_t gs, int bits, int zeros, const float* a, int64_t lda,\
                                          const unsigned char* restrict panel, const float* restrict params,     \
                                          float* restrict tile)                                                   \
    {                                                                                                             \
        __m512 lo[MR], hi[MR];                                                                                    \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) { lo[r] = _mm512_setzero_ps(); hi[r] = lo[r]; }     \
        for (int64_t g = 0; g < K / gs; ++g) {                                                                    \
            __m512 plo[MR], phi[MR];                                                                              \
            float asum[MR];                                                                                       \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                \
                plo[r] = _mm512_setzero_ps(); phi[r] = plo[r]; asum[r] = 0.0f;                                    \
            }                                                                                                     \
            int64_t k = g * gs;                                                                                   \
            if (bits == 4) /* k pairs from each byte (groups of an even size start on a pair) */                \
                for (; k + 1 < (g + 1) * gs && k % 2 == 0; k += 2) {                                              \
                    __m512 e0, e1, d0, d1;                                                                        \
                    kiln_w16_nibbles(panel + (k / 2) * KILN_WNR, &e0, &d0);                                       \
                    kiln_w16_nibbles(panel + (k / 2) * KILN_WNR + 16, &e1, &d1);                                  \
                    _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                        \
                        const float v = a[r * lda + k], u = a[r * lda + k + 1];                                   \
                        const __m512 x = _mm512_set1_ps(v), y = _mm512_set1_ps(u);                                \
                        plo[r] = _mm512_fmadd_ps(y, d0, _mm512_fmadd_ps(x, e0, plo[r]));                          \
                        phi[r] = _mm512_fmadd_ps(y, d1, _mm512_fmadd_ps(x, e1, phi[r]));                          \
                        if (zeros) { asum[r] += v; asum[r] += u; }                                                \
                    }                                                                                             \
                }                                                                                                 \
            for (; k < (g + 1) * gs; ++k) {                                                                       \
                const unsigned char* row = panel + (bits == 4 ? k / 2 : k) * KILN_WNR;                           \
                const __m512 w0 = kiln_w16(row, bits, (int)(k & 1)), w1 = kiln_w16(row + 16, bits, (int)(k & 1));\
                _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                            \
                    const float v = a[r * lda + k];                                                               \
                    const __m512 x = _mm512_set1_ps(v);                                                           \
                    plo[r] = _mm512_fmadd_ps(x, w0, plo[r]);                                                      \
                    phi[r] = _mm512_fmadd_ps(x, w1, phi[r]);                                                      \
                    if (zeros) asum[r] += v; /* only zero points need each group's activation sum */        \
                }                                                                                                 \
            }                                                                                                     \
            const float* p = params + g * 2 * KILN_WNR;                                                           \
            const __m512 s0 = _mm512_loadu_ps(p), s1 = _mm512_loadu_ps(p + 16);                                   \
            const __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(p + KILN_WNR), _mm512_sub_ps(_mm512_setzero_ps(), s0));\
            const __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(p + KILN_WNR + 16), _mm512_sub_ps(_mm512_setzero_ps(), s1));\
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                \
                const __m512 sum = _mm512_set1_ps(asum[r]);                                                       \
                lo[r] = _mm512_fmadd_ps(sum, o0, _mm512_fmadd_ps(plo[r], s0, lo[r]));                             \
                hi[r] = _mm512_fmadd_ps(sum, o1, _mm512_fmadd_ps(phi[r], s1, hi[r]));                             \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; ++r) {                                                    \
            _mm512_storeu_ps(tile + r * KILN_WNR, lo[r]);                                                         \
            _mm512_storeu_ps(tile + r * KILN_WNR + 16, hi[r]);                                                    \
        }                                                                                                         \
    }
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 kiln_w8(const unsigned char* p, int bits, int high)
{
    __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
    if (bits == 4) v = high ? _mm256_srai_epi32(v, 4) : _mm256_srai_epi32(_mm256_slli_epi32(v, 28), 28);
    return _mm256_cvtepi32_ps(v);
}
#define KILN_DEFINE_WUKERNEL(MR)                                                                                  \
    static inline void kiln_wukernel_##MR(int64_t K, int64_t gs, int bits, int zeros, const float* a, int64_t lda,\
                                          const unsigned char* restrict panel, const float* restrict params,     \
                                          float* restrict tile)                                                   \
    {                                                                                                             \
        __m256 lo[MR], hi[MR];                                                                                    \
        _Pragma("GCC unroll 3") for (int r = 0; r < MR; ++r) { lo[r] = _mm256_setzero_ps(); hi[r] = lo[r]; }     \
        for (int64_t g = 0; g < K / gs; ++g) {                                                                    \
            __m256 plo[MR], phi[MR];                                                                              \
            float asum[MR];                                                                                       \
            _Pragma("GCC unroll 3") for (int r = 0; r < MR; ++r) {                                                \
                plo[r] = _mm256_setzero_ps(); phi[r] = plo[r]; asum[r] = 0.0f;                                    \
            }                                                                                                     \
            for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {                                                     \
                const unsigned char* row = panel + (bits == 4 ? k / 2 : k) * KILN_WNR;                           \
                const __m256 w0 = kiln_w8(row, bits, (int)(k & 1)), w1 = kiln_w8(row + 8, bits, (int)(k & 1));  \
                _Pragma("GCC unroll 3") for (int r = 0; r < MR; ++r) {                                            \
                    const float v = a[r * lda + k];                                                               \
                    const __m256 x = _mm256_set1_ps(v);                                                           \
                    plo[r] = _mm256_fmadd_ps(x, w0, plo[r]);                                                      \
                    phi[r] = _mm256_fmadd_ps(x, w1, phi[r]);                                                      \
                    if (zeros) asum[r] += v; /* only zero points need each group's activation sum */        \
                }                                                                                                 \
            }                                                                                                     \
            const float* p = params + g * 2 * KILN_WNR;                                                           \
            const __m256 s0 = _mm256_loadu_ps(p), s1 = _mm256_loadu_ps(p + 8);                                    \
            const __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(p + KILN_WNR), _mm256_sub_ps(_mm256_setzero_ps(), s0));\
            const __m256 o1 = _mm256_mul_ps(_mm256_loadu_ps(p + KILN_WNR + 8), _mm256_sub_ps(_mm256_setzero_ps(), s1));\
            _Pragma("GCC unroll 3") for (int r = 0; r < MR; ++r) {                                                \
                const __m256 sum = _mm256_set1_ps(asum[r]);                                                       \
                lo[r] = _mm256_fmadd_ps(sum, o0, _mm256_fmadd_ps(plo[r], s0, lo[r]));                             \
                hi[r] = _mm256_fmadd_ps(sum, o1, _mm256_fmadd_ps(phi[r], s1, hi[r]));                             \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 3") for (int r = 0; r < MR; ++r) {                                                    \
            _mm256_storeu_ps(tile + r * KILN_WNR, lo[r]);                                                         \
            _mm256_storeu_ps(tile + r * KILN_WNR + 8, hi[r]);                                                     \
        }                                                                                                         \
    }
#else
#define KILN_DEFINE_WUKERNEL(MR)                                                                                  \
    static inline void kiln_wukernel_##MR(int64_t K, int64_t gs, int bits, int zeros, const float* a, int64_t lda,\
                                          const unsigned char* restrict panel, const float* restrict params,     \
                                          float* restrict tile)                                                   \
    {                                                                                                             \
        float acc[MR][KILN_WNR];                                                                                  \
        memset(acc, 0, sizeof acc);                                                                               \
        for (int64_t g = 0; g < K / gs; ++g) {                                                                    \
            float part[MR][KILN_WNR], asum[MR];                                                                   \
            memset(part, 0, sizeof part);                                                                         \
            memset(asum, 0, sizeof asum);                                                                         \
            for (int64_t k = g * gs; k < (g + 1) * gs; ++k)                                                       \
                for (int r = 0; r < MR; ++r) {                                                                    \
                    const float v = a[r * lda + k];                                                               \
                    if (zeros) asum[r] += v; /* only zero points need each group's activation sum */        \
                    for (int c = 0; c < KILN_WNR; ++c) {                                                          \
                        const int8_t byte = (int8_t)panel[(bits == 4 ? k / 2 : k) * KILN_WNR + c];               \
                        const int32_t q = bits == 4 ? (k & 1 ? byte >> 4 : (int8_t)(byte << 4) >> 4) : byte;      \
                        part[r][c] += v * (float)q;                                                               \
                    }                                                                                             \
                }                                                                                                 \
            const float* p = params + g * 2 * KILN_WNR;                                                           \
            for (int r = 0; r < MR; ++r)                                                                          \
                for (int c = 0; c < KILN_WNR; ++c) acc[r][c] += part[r][c] * p[c] - asum[r] * p[KILN_WNR + c] * p[c];\
        }                                                                                                         \
        memcpy(tile, acc, sizeof acc);                                                                            \
    }
#endif

KILN_DEFINE_WUKERNEL(1)
KILN_DEFINE_WUKERNEL(2)
KILN_DEFINE_WUKERNEL(3)
#if KILN_WMR > 3
KILN_DEFINE_WUKERNEL(4)
#endif
#if KILN_WMR > 4
KILN_DEFINE_WUKERNEL(5)
KILN_DEFINE_WUKERNEL(6)
#endif

/* The panel's weights as float, dst[K][KILN_WNR] = (w - zero point) x scale: the reference's dequantized values. */
static void kiln_wpanel_to_float(int64_t K, int64_t gs, int bits, const unsigned char* panel, float* restrict dst)
{
    const float* params = (const float*)(panel + ((size_t)(bits == 4 ? (K + 1) / 2 : K) * KILN_WNR + 63) / 64 * 64);
    for (int64_t k = 0; k < K; ++k) {
        const float* scale = params + (k / gs) * 2 * KILN_WNR;
        const unsigned char* row = panel + (bits == 4 ? k / 2 : k) * KILN_WNR;
        _Pragma("omp simd") for (int c = 0; c < KILN_WNR; ++c) {
            const int8_t byte = (int8_t)row[c];
            const int32_t q = bits == 4 ? (k & 1 ? byte >> 4 : (int8_t)(byte << 4) >> 4) : byte;
            dst[k * KILN_WNR + c] = ((float)q - scale[KILN_WNR + c]) * scale[c];
        }
    }
}

/* One tile of `rows` (1..KILN_WMR) activation rows against one packed weight panel. */
__attribute__((noinline)) static void kiln_wukernel(int rows, int64_t K, int64_t gs, int bits, int zeros,
                                                    const float* a, int64_t lda, const unsigned char* panel, float* tile)
{
    const float* params = (const float*)(panel + ((size_t)(bits == 4 ? (K + 1) / 2 : K) * KILN_WNR + 63) / 64 * 64);
    switch (rows) {
    case 1: kiln_wukernel_1(K, gs, bits, zeros, a, lda, panel, params, tile); break;
    case 2: kiln_wukernel_2(K, gs, bits, zeros, a, lda, panel, params, tile); break;
#if KILN_WMR == 3
    default: kiln_wukernel_3(K, gs, bits, zeros, a, lda, panel, params, tile); break;
#elif KILN_WMR == 4
    case 3: kiln_wukernel_3(K, gs, bits, zeros, a, lda, panel, params, tile); break;
    default: kiln_wukernel_4(K, gs, bits, zeros, a, lda, panel, params, tile); break;
#else
    case 3: kiln_wukernel_3(K, gs, bits, zeros, a, lda, panel, params, tile); break;
    case 4: kiln_wukernel_4(K, gs, bits, zeros, a, lda, panel, params, tile); break;
    case 5: kiln_wukernel_5(K, gs, bits, zeros, a, lda, panel, params, tile); break;
    default: kiln_wukernel_6(K, gs, bits, zeros, a, lda, panel, params, tile); break;
#endif
    }
}

#endif /* KILN_QGEMM_H */
