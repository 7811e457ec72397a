/* kiln_sparse.h: float32 sparse x dense products for linear layers with a sparse weight W [N x K], pasted into
 * models that have one.
 *
 * Each function computes one output feature n (CSR, 2:4) or one block row of features (BSR) for a chunk of up to
 * KILN_SMB activation rows, into a small tile the generated caller runs its fused epilogue from (as the dense
 * micro-kernels do). Activations are read transposed, xT [K x M] (row k at xT + k * ldx, ldx a multiple of 16 and
 * the rows zero past M), so every stored weight multiplies a contiguous run of rows: one broadcast and up to
 * KILN_SMB / KILN_SVW vector FMAs. With one row (batch 1, ldx 1) the products are dot products instead. The vectors
 * are GCC's generic ones, so every capability's build (SSE2, AVX2, AVX-512) vectorizes them at its width.
 */
#ifndef KILN_SPARSE_H
#define KILN_SPARSE_H

#include <stdint.h>
#include <string.h>

#define KILN_SMB 32  /* activation rows per tile */

/* Fused multiply-adds: -std=c11 turns contraction off, and these products are summed in float either way. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

typedef float kiln_v8 __attribute__((vector_size(32)));
typedef float kiln_v8u __attribute__((vector_size(32), aligned(4)));  /* an unaligned load or store */

static inline kiln_v8 kiln_v8_load(const float* p) { return *(const kiln_v8u*)p; }
static inline void kiln_v8_store(float* p, kiln_v8 v) { *(kiln_v8u*)p = v; }
/* the lanes' sum, pairwise (a fixed order, so every capability gives the same bits) */
static inline float kiln_v8_sum(kiln_v8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

typedef float kiln_v4 __attribute__((vector_size(16)));
typedef float kiln_v4u __attribute__((vector_size(16), aligned(4)));
/* four floats in the low lanes, zeros in the high ones (one 128-bit load) */
static inline kiln_v8 kiln_v4_widen(const float* p)
{
    const kiln_v4 zero = {0, 0, 0, 0};
    return __builtin_shufflevector(*(const kiln_v4u*)p, zero, 0, 1, 2, 3, 4, 5, 6, 7);
}

/* kiln_sv: a vector of activation rows, KILN_LANES (kiln_gemm.h, pasted before this) floats with AVX-512, else 8:
 * on AVX-512 eight-float vectors did half the work per instruction, and 2:4 at batch 32 ran at 0.7x dense. */
#if KILN_LANES == 16
#define KILN_SVW 16
#else
#define KILN_SVW 8
#endif
typedef float kiln_sv __attribute__((vector_size(4 * KILN_SVW)));
typedef float kiln_svu __attribute__((vector_size(4 * KILN_SVW), aligned(4)));
static inline kiln_sv kiln_sv_load(const float* p) { return *(const kiln_svu*)p; }
static inline void kiln_sv_store(float* p, kiln_sv v) { *(kiln_svu*)p = v; }

/* Accumulators a0..a3 += v * (the KILN_SVW * N activation rows at x), N a constant 1..KILN_SMB / KILN_SVW: the
 * partial tiles of a chunk take ceil(mb / KILN_SVW) vectors, which the transposed activations' zero-padded rows
 * (ldx a multiple of KILN_SVW) always hold. */
#define KILN_AXPY(N, v, x) do { \
        a0 += (v) * kiln_sv_load(x); \
        if ((N) > 1) a1 += (v) * kiln_sv_load((x) + KILN_SVW); \
        if ((N) > 2) a2 += (v) * kiln_sv_load((x) + 2 * KILN_SVW); \
        if ((N) > 3) a3 += (v) * kiln_sv_load((x) + 3 * KILN_SVW); \
    } while (0)
#define KILN_STORE(N, t) do { \
        kiln_sv_store(t, a0); \
        if ((N) > 1) kiln_sv_store((t) + KILN_SVW, a1); \
        if ((N) > 2) kiln_sv_store((t) + 2 * KILN_SVW, a2); \
        if ((N) > 3) kiln_sv_store((t) + 3 * KILN_SVW, a3); \
    } while (0)
#define KILN_VECTORS(mb) (((mb) + KILN_SVW - 1) / KILN_SVW)
/* one statement per vector count, so each case keeps its accumulators in registers */
#define KILN_BY_VECTORS(nv, BODY) switch (nv) { \
        case 4: BODY(4); break; case 3: BODY(3); break; case 2: BODY(2); break; default: BODY(1); break; }

/* tile[m] = sum over stored (k, value) of value * xT[k * ldx + m], m < mb; one CSR row, entries [begin, end). */
static void kiln_csr_row(int64_t begin, int64_t end, const int32_t* restrict col, const float* restrict val,
                         const float* restrict xT, int64_t ldx, int mb, float* restrict tile)
{
    if (mb == 1 && ldx == 1) {  /* a sparse dot product: vectorized, the activations gathered */
        float sum = 0.0f;
        _Pragma("omp simd reduction(+:sum)")
        for (int64_t j = begin; j < end; ++j) sum += val[j] * xT[col[j]];
        tile[0] = sum;
        return;
    }
    kiln_sv a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
#define KILN_CSR(N) do { \
        for (int64_t j = begin; j < end; ++j) KILN_AXPY(N, val[j], xT + (int64_t)col[j] * ldx); \
        KILN_STORE(N, tile); \
    } while (0)
    KILN_BY_VECTORS(KILN_VECTORS(mb), KILN_CSR)
#undef KILN_CSR
}

/* SELL-8 (sliced ELLPACK), the CSR weight's form for one activation row: rows in slices of 8 whose entries are
 * interleaved, entry j of the slice's 8 rows side by side, each row padded with zeros to the slice's longest. A
 * slice's 8 dot products then share one accumulator vector, lane per row: no horizontal sums, no per-row loop
 * overhead (a CSR row of the 768 -> 3072 FFN at 90% holds 77 entries, and those cost as much as the products).
 * Layout: int64 slice starts [slices + 1] (in entries), float values [entries][8], int32 columns [entries][8]. */
static int64_t kiln_sell_entries(int64_t N, const int32_t* crow)
{
    int64_t entries = 0;
    for (int64_t s = 0; s < (N + 7) / 8; ++s) {
        int64_t longest = 0;
        for (int64_t r = 8 * s; r < 8 * s + 8 && r < N; ++r)
            longest = crow[r + 1] - crow[r] > longest ? crow[r + 1] - crow[r] : longest;
        entries += longest;
    }
    return entries;
}

static size_t kiln_sell_bytes(int64_t N, const int32_t* crow)
{
    const size_t starts = ((size_t)((N + 7) / 8 + 1) * 8 + 63) / 64 * 64;
    return starts + (size_t)kiln_sell_entries(N, crow) * 8 * (sizeof(float) + sizeof(int32_t)) + 64;
}

static void kiln_sell_pack(int64_t N, const int32_t* crow, const int32_t* col, const float* val, char* dst)
{
    const int64_t slices = (N + 7) / 8;
    int64_t* starts = (int64_t*)dst;
    starts[0] = 0;
    for (int64_t s = 0; s < slices; ++s) {
        int64_t longest = 0;
        for (int64_t r = 8 * s; r < 8 * s + 8 && r < N; ++r)
            longest = crow[r + 1] - crow[r] > longest ? crow[r + 1] - crow[r] : longest;
        starts[s + 1] = starts[s] + longest;
    }
    float* values = (float*)(dst + ((size_t)(slices + 1) * 8 + 63) / 64 * 64);
    int32_t* columns = (int32_t*)(values + starts[slices] * 8);
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t j = 0; j < starts[s + 1] - starts[s]; ++j)
            for (int lane = 0; lane < 8; ++lane) {
                const int64_t r = 8 * s + lane, at = (starts[s] + j) * 8 + lane;
                const int stored = r < N && j < crow[r + 1] - crow[r];
                values[at] = stored ? val[crow[r] + j] : 0.0f;
                columns[at] = stored ? col[crow[r] + j] : 0;
            }
}

/* tile[lane * KILN_SMB] = the dot product of row 8 * slice + lane with x, for the 8 rows of one SELL slice */
static void kiln_sell_slice(const char* sell, int64_t N, int64_t slice, const float* restrict x, float* restrict tile)
{
    const int64_t slices = (N + 7) / 8;
    const int64_t* starts = (const int64_t*)sell;
    const float* values = (const float*)(sell + ((size_t)(slices + 1) * 8 + 63) / 64 * 64);
    const int32_t* columns = (const int32_t*)(values + starts[slices] * 8);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = starts[slice]; j < starts[slice + 1]; ++j) {
        const float* v = values + j * 8;
        const int32_t* c = columns + j * 8;
        _Pragma("omp simd")
        for (int lane = 0; lane < 8; ++lane) acc[lane] += v[lane] * x[c[lane]];
    }
    for (int lane = 0; lane < 8; ++lane) tile[lane * KILN_SMB] = acc[lane];
}

/* tile[r * KILN_SMB + m] for the R rows of one BSR block row: blocks [begin, end) of R x C values (row-major). */
static void kiln_bsr_row(int64_t begin, int64_t end, const int32_t* restrict bcol, const float* restrict val,
                         int R, int C, const float* restrict xT, int64_t ldx, int mb, float* restrict tile)
{
    if (mb == 1 && ldx == 1 && C % 8 == 0) {  /* per row: vector partial dot products along the block's columns */
        for (int r = 0; r < R; ++r) {
            kiln_v8 acc = {0};
            for (int64_t j = begin; j < end; ++j) {
                const float* w = val + (j * R + r) * C;
                const float* x = xT + (int64_t)bcol[j] * C;
                for (int c = 0; c < C; c += 8) acc += kiln_v8_load(w + c) * kiln_v8_load(x + c);
            }
            tile[r * KILN_SMB] = kiln_v8_sum(acc);
        }
        return;
    }
    const int nv = KILN_VECTORS(mb);
    int r0 = 0;
    /* four rows x two vectors of activation rows in 8 accumulators (room for the activations and a broadcast on
     * AVX2) */
    for (; r0 + 4 <= R; r0 += 4)
        for (int v0 = 0; v0 < nv; v0 += 2) {
            const int two = nv - v0 >= 2;
            kiln_sv a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
            for (int64_t j = begin; j < end; ++j) {
                const float* w = val + (j * R + r0) * C;
                const float* x = xT + (int64_t)bcol[j] * C * ldx + KILN_SVW * v0;
                if (two)
                    for (int c = 0; c < C; ++c) {
                        const kiln_sv x0 = kiln_sv_load(x + c * ldx), x1 = kiln_sv_load(x + c * ldx + KILN_SVW);
                        const float w0 = w[c], w1 = w[C + c], w2 = w[2 * C + c], w3 = w[3 * C + c];
                        a00 += w0 * x0; a01 += w0 * x1;
                        a10 += w1 * x0; a11 += w1 * x1;
                        a20 += w2 * x0; a21 += w2 * x1;
                        a30 += w3 * x0; a31 += w3 * x1;
                    }
                else
                    for (int c = 0; c < C; ++c) {
                        const kiln_sv x0 = kiln_sv_load(x + c * ldx);
                        a00 += w[c] * x0; a10 += w[C + c] * x0; a20 += w[2 * C + c] * x0; a30 += w[3 * C + c] * x0;
                    }
            }
            float* t = tile + r0 * KILN_SMB + KILN_SVW * v0;
            kiln_sv_store(t, a00); kiln_sv_store(t + KILN_SMB, a10);
            kiln_sv_store(t + 2 * KILN_SMB, a20); kiln_sv_store(t + 3 * KILN_SMB, a30);
            if (two) {
                kiln_sv_store(t + KILN_SVW, a01); kiln_sv_store(t + KILN_SMB + KILN_SVW, a11);
                kiln_sv_store(t + 2 * KILN_SMB + KILN_SVW, a21); kiln_sv_store(t + 3 * KILN_SMB + KILN_SVW, a31);
            }
        }
    for (; r0 < R; ++r0) {  /* block heights that are not a multiple of 4: one row at a time */
        kiln_sv a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
#define KILN_BSR(N) do { \
            for (int64_t j = begin; j < end; ++j) \
                for (int c = 0; c < C; ++c) \
                    KILN_AXPY(N, val[(j * R + r0) * C + c], xT + ((int64_t)bcol[j] * C + c) * ldx); \
            KILN_STORE(N, tile + r0 * KILN_SMB); \
        } while (0)
        KILN_BY_VECTORS(nv, KILN_BSR)
#undef KILN_BSR
    }
}

/* KILN_24_EXPAND[byte]: the lanes of eight dense weights (two groups of four) taken from the four values a
 * metadata byte describes, {v0, v1, v2, v3, 0, 0, 0, 0}: lane 4 (zero) where the group stores nothing. */
typedef int32_t kiln_i8 __attribute__((vector_size(32)));
#define KILN_24_LANE(b, i) ((i) < 4 ? (((b) & 3) == (i) ? 0 : (((b) >> 2) & 3) == (i) ? 1 : 4) \
                                    : ((((b) >> 4) & 3) == (i) - 4 ? 2 : ((b) >> 6) == (i) - 4 ? 3 : 4))
#define KILN_24_ENTRY(b) {KILN_24_LANE(b, 0), KILN_24_LANE(b, 1), KILN_24_LANE(b, 2), KILN_24_LANE(b, 3), \
                          KILN_24_LANE(b, 4), KILN_24_LANE(b, 5), KILN_24_LANE(b, 6), KILN_24_LANE(b, 7)}
#define KILN_24_4(b) KILN_24_ENTRY(b), KILN_24_ENTRY((b) + 1), KILN_24_ENTRY((b) + 2), KILN_24_ENTRY((b) + 3)
#define KILN_24_16(b) KILN_24_4(b), KILN_24_4((b) + 4), KILN_24_4((b) + 8), KILN_24_4((b) + 12)
#define KILN_24_64(b) KILN_24_16(b), KILN_24_16((b) + 16), KILN_24_16((b) + 32), KILN_24_16((b) + 48)
static const kiln_i8 KILN_24_EXPAND[256] __attribute__((aligned(32))) = {
    KILN_24_64(0), KILN_24_64(64), KILN_24_64(128), KILN_24_64(192)};

/* The dot product of one 2:4 row of K columns with x (one activation row, where reading the weights bounds the
 * layer): K / 2 kept values and K / 8 metadata bytes (per group of four, positions p0 | p1 << 2 in a nibble, the
 * even group's in the low nibble). Each byte's four values expand to eight dense lanes with one permute, so the
 * row reads half the dense row's bytes. */
static float kiln_24_dot(int64_t K, const float* restrict val, const uint8_t* restrict meta, const float* restrict x)
{
    /* four independent sums: with two, the FMA latency bounded the loop (0.5 vector FMA per cycle) */
    kiln_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t b = 0;
#define KILN_24_STEP(acc, i) \
    acc += __builtin_shuffle(kiln_v4_widen(val + 4 * (i)), KILN_24_EXPAND[meta[i]]) * kiln_v8_load(x + 8 * (i))
    for (; b + 4 <= K / 8; b += 4) {
        __builtin_prefetch(val + 4 * b + 256);  /* 1 KB ahead in the row's values (the stream bounds the loop) */
        KILN_24_STEP(a0, b); KILN_24_STEP(a1, b + 1); KILN_24_STEP(a2, b + 2); KILN_24_STEP(a3, b + 3);
    }
    for (; b < K / 8; ++b) KILN_24_STEP(a0, b);
#undef KILN_24_STEP
    a0 = (a0 + a1) + (a2 + a3);
    return kiln_v8_sum(a0);
}

/* tile rows 0..ROWS-1 += groups [g0, g1) (both even) of ROWS consecutive 2:4 rows of K columns, for nv vectors of
 * activation rows (KILN_DEFINE_24_GROUPS). Each row's sums are one chain of multiply-adds per vector, the stored
 * values in order, whatever ROWS is (the same results, bit for bit), but KILN_24_ROWS rows' chains interleave: one
 * row at a time left the loop waiting on the FMA latency (its nv accumulators were the only ones in flight; 2:4 ran
 * at 0.86x dense at batch 32 on AVX-512), where KILN_24_ROWS x nv accumulators keep both FMA ports busy and the
 * loads bound it. The rows left over after the last group of KILN_24_ROWS take one at a time. */
#if KILN_SVW == 16
#define KILN_24_ROWS 4  /* 4 rows x 2 vectors: eight zmm accumulators */
#else
#define KILN_24_ROWS 2  /* 2 rows x 4 vectors: eight of the sixteen ymm registers */
#endif
#define KILN_24_GROUPS_BY(N, ROWS) do { \
        kiln_sv acc[ROWS][N]; \
        _Pragma("GCC unroll 4") for (int r = 0; r < (ROWS); ++r) \
            _Pragma("GCC unroll 4") for (int v = 0; v < (N); ++v) \
                acc[r][v] = kiln_sv_load(tile + r * KILN_SMB + v * KILN_SVW); \
        for (int64_t b = g0 / 2; b < g1 / 2; ++b) {  /* a byte: two groups, four values, per row */ \
            const float* x = xT + 8 * b * ldx; \
            _Pragma("GCC unroll 4") for (int r = 0; r < (ROWS); ++r) { \
                const int byte = meta[r * (K / 8) + b]; \
                const float* w = val + r * (K / 2) + 4 * b; \
                const float* x0 = x + (byte & 3) * ldx, * x1 = x + ((byte >> 2) & 3) * ldx; \
                const float* x2 = x + (4 + ((byte >> 4) & 3)) * ldx, * x3 = x + (4 + (byte >> 6)) * ldx; \
                _Pragma("GCC unroll 4") for (int v = 0; v < (N); ++v) { \
                    acc[r][v] += w[0] * kiln_sv_load(x0 + v * KILN_SVW); \
                    acc[r][v] += w[1] * kiln_sv_load(x1 + v * KILN_SVW); \
                    acc[r][v] += w[2] * kiln_sv_load(x2 + v * KILN_SVW); \
                    acc[r][v] += w[3] * kiln_sv_load(x3 + v * KILN_SVW); \
                } \
            } \
        } \
        _Pragma("GCC unroll 4") for (int r = 0; r < (ROWS); ++r) \
            _Pragma("GCC unroll 4") for (int v = 0; v < (N); ++v) \
                kiln_sv_store(tile + r * KILN_SMB + v * KILN_SVW, acc[r][v]); \
    } while (0)
#define KILN_DEFINE_24_GROUPS(NAME, ROWS) \
    static inline void NAME(int64_t K, int64_t g0, int64_t g1, const float* restrict val, \
                            const uint8_t* restrict meta, const float* restrict xT, int64_t ldx, int nv, \
                            float* restrict tile) \
    { \
        /* the rows' next blocks: the unit's rows stream from as many places, more than the prefetchers follow \
         * (the value loads stalled half the loop at batch 32) */ \
        for (int r = 0; r < (ROWS); ++r) { \
            for (int64_t line = 0; line < 2 * (g1 - g0); line += 16) \
                __builtin_prefetch(val + r * (K / 2) + 2 * g1 + line); \
            __builtin_prefetch(meta + r * (K / 8) + g1 / 2); \
        } \
        switch (nv) { \
        case 4: KILN_24_GROUPS_BY(4, ROWS); break; \
        case 3: KILN_24_GROUPS_BY(3, ROWS); break; \
        case 2: KILN_24_GROUPS_BY(2, ROWS); break; \
        default: KILN_24_GROUPS_BY(1, ROWS); break; \
        } \
    }
KILN_DEFINE_24_GROUPS(kiln_24_groups_rows, KILN_24_ROWS)
KILN_DEFINE_24_GROUPS(kiln_24_groups, 1)
#undef KILN_DEFINE_24_GROUPS
#undef KILN_24_GROUPS_BY

/* tile[r * KILN_SMB + m] = 2:4 row r . activation row m (x + m * K, row-major), for 1 < mb <= KILN_24_FEW: the
 * weights are read compressed, half the bytes of dense ones, which bound a layer at a few activation rows; each
 * metadata byte's four values are expanded to the eight dense lanes they fill, and every expanded vector multiplies
 * four activation rows, for four feature rows at a time (sixteen sums in flight). Each sum runs along k in vector
 * lanes, then adds them up. With AVX-512, two bytes are the 16-bit mask of the lanes their eight values fill
 * (vexpandps); else one byte's lanes come from KILN_24_EXPAND (a permute). At more activation rows the expansions
 * (port 5, with the FMAs) and the rows' loads from L2 made it slower than dense (MLP at 8 rows: 0.75x), where
 * kiln_24_groups_rows takes over. */
#define KILN_24_FEW 4
#if defined(__AVX512F__)
#include <immintrin.h>
/* KILN_24_MASK[byte]: the dense lanes (bits 0-7) a metadata byte's four values fill, in their order. */
#define KILN_24_BITS(b) ((1u << ((b) & 3)) | (1u << (((b) >> 2) & 3)) | (16u << (((b) >> 4) & 3)) | (16u << ((b) >> 6)))
#define KILN_24_BITS4(b) KILN_24_BITS(b), KILN_24_BITS((b) + 1), KILN_24_BITS((b) + 2), KILN_24_BITS((b) + 3)
#define KILN_24_BITS16(b) KILN_24_BITS4(b), KILN_24_BITS4((b) + 4), KILN_24_BITS4((b) + 8), KILN_24_BITS4((b) + 12)
#define KILN_24_BITS64(b) KILN_24_BITS16(b), KILN_24_BITS16((b) + 16), KILN_24_BITS16((b) + 32), KILN_24_BITS16((b) + 48)
static const uint8_t KILN_24_MASK[256] = {KILN_24_BITS64(0), KILN_24_BITS64(64), KILN_24_BITS64(128),
                                          KILN_24_BITS64(192)};
typedef __m512 kiln_24w;
#define KILN_24_STEP 16  /* k per expanded vector */
#define KILN_24_ZERO() _mm512_setzero_ps()
#define KILN_24_WEIGHTS(v, m, c) _mm512_maskz_expandloadu_ps( \
        (__mmask16)(KILN_24_MASK[(m)[(c) / 8]] | KILN_24_MASK[(m)[(c) / 8 + 1]] << 8), (v) + (c) / 2)
#define KILN_24_FMA(w, x, acc) _mm512_fmadd_ps(w, _mm512_loadu_ps(x), acc)
#define KILN_24_SUM(acc) _mm512_reduce_add_ps(acc)
#define KILN_24_LAST_WEIGHTS(v, m, c) _mm512_maskz_expandloadu_ps(KILN_24_MASK[(m)[(c) / 8]], (v) + (c) / 2)
#define KILN_24_LAST_FMA(w, x, acc) _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(0xFF, x), acc)
#else
typedef kiln_v8 kiln_24w;
#define KILN_24_STEP 8
#define KILN_24_ZERO() ((kiln_v8){0})
#define KILN_24_WEIGHTS(v, m, c) __builtin_shuffle(kiln_v4_widen((v) + (c) / 2), KILN_24_EXPAND[(m)[(c) / 8]])
#define KILN_24_FMA(w, x, acc) ((acc) + (w) * kiln_v8_load(x))
#define KILN_24_SUM(acc) kiln_v8_sum(acc)
#endif
static void kiln_24_expanded(int64_t K, int rows, const float* restrict val, const uint8_t* restrict meta,
                             const float* restrict x, int mb, float* restrict tile)
{
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const float* xs[4], * vs[4];
        const uint8_t* ms[4];
        for (int j = 0; j < 4; ++j) {  /* past the last row: the last row again, its sums dropped */
            xs[j] = x + (j < mb ? j : mb - 1) * K;
            const int r = r0 + j < rows ? r0 + j : rows - 1;
            vs[j] = val + r * (K / 2);
            ms[j] = meta + r * (K / 8);
        }
        kiln_24w acc[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] = KILN_24_ZERO();
        int64_t c = 0;
        for (; c + KILN_24_STEP <= K; c += KILN_24_STEP)
            for (int i = 0; i < 4; ++i) {
                __builtin_prefetch(vs[i] + c / 2 + 256);  /* 1 KB ahead in the row's values */
                const kiln_24w w = KILN_24_WEIGHTS(vs[i], ms[i], c);
                for (int j = 0; j < 4; ++j) acc[i][j] = KILN_24_FMA(w, xs[j] + c, acc[i][j]);
            }
#if defined(__AVX512F__)
        if (c < K)  /* K is a multiple of 8: one byte left */
            for (int i = 0; i < 4; ++i) {
                const kiln_24w w = KILN_24_LAST_WEIGHTS(vs[i], ms[i], c);
                for (int j = 0; j < 4; ++j) acc[i][j] = KILN_24_LAST_FMA(w, xs[j] + c, acc[i][j]);
            }
#endif
        for (int i = 0; i < 4 && r0 + i < rows; ++i)
            for (int j = 0; j < mb; ++j) tile[(r0 + i) * KILN_SMB + j] = KILN_24_SUM(acc[i][j]);
    }
}

/* `rows` consecutive 2:4 rows into tile[r * KILN_SMB + m], with half the multiply-adds of the dense rows. With several
 * activation rows, K is taken in blocks
 * of KILN_24_GROUPS groups whose activations (16 KB) stay in L1 while every row of the unit reads them: unblocked,
 * each multiply-add loaded its activations from L2 (the 4096 x 1024 layer at batch 32 ran 2x slower). */
#define KILN_24_GROUPS 32
static void kiln_24_rows(int64_t K, int rows, const float* restrict val, const uint8_t* restrict meta,
                         const float* restrict xT, int64_t ldx, int mb, float* restrict tile, const float* restrict x)
{
    if (mb > 1 && mb <= KILN_24_FEW) {
        kiln_24_expanded(K, rows, val, meta, x, mb, tile);
        return;
    }
    if (mb == 1 && ldx == 1) {
        for (int r = 0; r < rows; ++r)
            tile[r * KILN_SMB] = kiln_24_dot(K, val + r * (K / 2), meta + r * (K / 8), xT);
        return;
    }
    for (int i = 0; i < rows * KILN_SMB; ++i) tile[i] = 0.0f;
    for (int64_t g0 = 0; g0 < K / 4; g0 += KILN_24_GROUPS) {
        const int64_t g1 = g0 + KILN_24_GROUPS < K / 4 ? g0 + KILN_24_GROUPS : K / 4;
        int r = 0;
        for (; r + KILN_24_ROWS <= rows; r += KILN_24_ROWS)
            kiln_24_groups_rows(K, g0, g1, val + r * (K / 2), meta + r * (K / 8), xT, ldx, KILN_VECTORS(mb),
                                tile + r * KILN_SMB);
        for (; r < rows; ++r)
            kiln_24_groups(K, g0, g1, val + r * (K / 2), meta + r * (K / 8), xT, ldx, KILN_VECTORS(mb),
                           tile + r * KILN_SMB);
    }
}

#pragma GCC pop_options

#endif /* KILN_SPARSE_H */
