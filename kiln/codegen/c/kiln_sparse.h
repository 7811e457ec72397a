/* kiln_sparse.h: float32 sparse x dense products for linear layers with a sparse weight W [N x K], pasted into
 * models that have one.
 *
 * Each function computes one output feature n (CSR, 2:4) or one block row of features (BSR) for a chunk of up to
 * KILN_SMB activation rows, into a small tile the generated caller runs its fused epilogue from (as the dense
 * micro-kernels do). Activations are read transposed, xT [K x M] (row k at xT + k * ldx, ldx a multiple of 16 and
 * the rows zero past M), so every stored weight multiplies a contiguous run of rows: one broadcast and up to
 * KILN_SMB / KILN_SVW vector FMAs. With one row (batch 1, ldx 1) the products are dot products instead. 2:4 reads the
 * rows as they are: a few at a time (kiln_24_rows), or more through pair planes (kiln_24p_unit, below). The vectors are GCC's generic ones, so
 * every capability's build (SSE2, AVX2, AVX-512) vectorizes them at its width.
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

/* tile[r * KILN_SMB + m] = 2:4 row r . activation row m (x + m * K, row-major), for 1 < mb <= KILN_24_FEW: the
 * weights are read compressed, half the bytes of dense ones, which bound a layer at a few activation rows; each
 * metadata byte's four values are expanded to the eight dense lanes they fill, and every expanded vector multiplies
 * four activation rows, for four feature rows at a time (sixteen sums in flight). Each sum runs along k in vector
 * lanes, then adds them up. With AVX-512, two bytes are the 16-bit mask of the lanes their eight values fill
 * (vexpandps); else one byte's lanes come from KILN_24_EXPAND (a permute). At more activation rows the expansions
 * (port 5, with the FMAs) and the rows' loads from L2 made it slower than dense (MLP at 8 rows: 0.75x), where
 * kiln_24p_unit takes over. */
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

/* `rows` consecutive 2:4 rows into tile[r * KILN_SMB + m] for one or a few activation rows at x (mb <= KILN_24_FEW;
 * more take kiln_24p_unit). */
static void kiln_24_rows(int64_t K, int rows, const float* restrict val, const uint8_t* restrict meta, int mb,
                         float* restrict tile, const float* restrict x)
{
    if (mb > 1) {
        kiln_24_expanded(K, rows, val, meta, x, mb, tile);
        return;
    }
    for (int r = 0; r < rows; ++r)
        tile[r * KILN_SMB] = kiln_24_dot(K, val + r * (K / 2), meta + r * (K / 8), x);
}

/* 2:4 at several activation rows, in pairs. Each kept weight would otherwise cost a broadcast and a load of its
 * column's activations per vector of rows: 1.5 loads per multiply-add at 32 rows with AVX-512, which bounded the
 * loop at about dense speed. Instead, a group's two kept columns (p0 < p1: one of 6 pairs) are read together:
 *  - the activations of each 32-row chunk are laid out as pair planes, per group of four columns and per pair
 *    (p0, p1), 64 floats x[m, 4g + p0], x[m, 4g + p1] interleaved (kiln_24p_planes, 1.5 KB per group), by each
 *    thread for the units it runs;
 *  - a row's two values in the group are one 64-bit broadcast (w0, w1, w0, w1, ...), so each multiply-add
 *    takes a whole vector of (row m, slot) lanes from its plane: 1.25 loads per multiply-add, no decoding;
 *  - the sums of the two slots are added at the end (each output: two chains over the groups in order, then
 *    their sum, whatever the capability or team size).
 * The weights are repacked when the model is created (kiln_24p_pack) into the order the loop reads them, one
 * stream: per unit of KILN_24P_ROWS rows, per block of KILN_24P_GROUPS groups, per row, the block's value pairs
 * and then each group's plane offset (a byte, in 8-byte steps). Read from the rows' own arrays instead, the
 * unit's 64 rows were 64 streams that no prefetcher followed (4096 x 1024 at batch 32, one thread: 1.54 ms
 * against 1.30 ms). A block's planes (12 KB) stay in L1 while the unit's rows read them. */
#define KILN_24P_GROUPS 8
#define KILN_24P_ROWS 64
#define KILN_24P_RECORD (KILN_24P_GROUPS * 9)  /* bytes per row per block: 8 value pairs, 8 plane offsets */
#define KILN_24P_PLANE 64  /* floats per plane: 32 rows x 2 slots */
#define KILN_24P_GROUP (6 * KILN_24P_PLANE)
/* blocks whose planes a thread lays out at a time: 256 groups, 384 KB, which stay in L2 while each of its units reads
 * them (a 4096-column layer's 1.5 MB of planes came from L3 for each unit: 1.77 -> 1.55 ms at one thread; spans of
 * 128 groups cost the 1024-column layer 10% in sums carried between spans) */
#define KILN_24P_SPAN 32
/* units whose sums a thread keeps between spans (256 KB, beside a span's planes in L2); a thread with more lays out
 * the planes again for each batch of them */
#define KILN_24P_KEPT 16
#if KILN_SVW == 16
#define KILN_24P_INTERLEAVED 2  /* rows whose sums are in flight: 2 x 4 zmm */
#else
#define KILN_24P_INTERLEAVED 1  /* 8 ymm: half the sixteen registers */
#endif

/* blocks of KILN_24P_GROUPS groups in K columns (the last one padded with zero weights) */
static inline int64_t kiln_24p_blocks(int64_t K) { return (K / 4 + KILN_24P_GROUPS - 1) / KILN_24P_GROUPS; }
static inline int64_t kiln_24p_unit_bytes(int64_t K) { return kiln_24p_blocks(K) * KILN_24P_ROWS * KILN_24P_RECORD; }
/* the stream's bytes for N rows, a multiple of 64 */
static inline size_t kiln_24p_bytes(int64_t N, int64_t K)
{
    return (size_t)(((N + KILN_24P_ROWS - 1) / KILN_24P_ROWS * kiln_24p_unit_bytes(K) + 63) / 64 * 64);
}
/* floats of the planes of one span of blocks */
static inline int64_t kiln_24p_plane_floats(int64_t K)
{
    const int64_t blocks = kiln_24p_blocks(K);
    return (blocks < KILN_24P_SPAN ? blocks : KILN_24P_SPAN) * KILN_24P_GROUPS * KILN_24P_GROUP;
}

static void kiln_24p_pack(int64_t N, int64_t K, const float* val, const uint8_t* meta, char* dst)
{
    /* the pair's plane by its metadata nibble p0 | p1 << 2 (the invariants make p0 < p1; others read plane 0) */
    static const uint8_t plane_of[16] = {[4] = 0, [8] = 1, [12] = 2, [9] = 3, [13] = 4, [14] = 5};
    const int64_t groups = K / 4, blocks = kiln_24p_blocks(K);
    for (int64_t n0 = 0; n0 < N; n0 += KILN_24P_ROWS)
        for (int64_t b = 0; b < blocks; ++b)
            for (int64_t n = n0; n < n0 + KILN_24P_ROWS; ++n, dst += KILN_24P_RECORD) {
                memset(dst, 0, KILN_24P_RECORD);
                for (int g = 0; g < KILN_24P_GROUPS; ++g) {
                    const int64_t group = b * KILN_24P_GROUPS + g;
                    if (n >= N || group >= groups) continue;
                    memcpy(dst + 8 * g, val + n * (K / 2) + 2 * group, 8);
                    const int nibble = (meta[n * (K / 8) + group / 2] >> (4 * (group & 1))) & 15;
                    dst[8 * KILN_24P_GROUPS + g] = (char)(plane_of[nibble] * (KILN_24P_PLANE * 4 / 8));
                }
            }
}

/* The six pair planes of groups g .. g + 3 (g a multiple of 4) into dst, for `halves` x 16 activation rows of a
 * chunk (row m at x + m * K, mb rows of them; zeros past those and past K). Each thread lays out the planes it reads,
 * from the rows as they are: first the four groups' 16 columns of every row into a tile (rows K floats apart share
 * L1 sets: read group by group, 32 rows of 4096 columns thrashed L1), then per group and KILN_SVW / 2 rows, one
 * vector of the even rows' four columns, one of the odd rows', and one in-lane shuffle per plane (vshufps): a plane's
 * vector takes (first, second) of an even row and of the odd row after it from each 128-bit lane. (Two-source
 * shuffles across lanes ran at a third of the kernel's time on a 3072-column layer with AVX2.) */
#if KILN_SVW == 16
#define KILN_24P_LANES(f, s) f, s, 16 + f, 16 + s, 4 + f, 4 + s, 20 + f, 20 + s, 8 + f, 8 + s, 24 + f, 24 + s, \
    12 + f, 12 + s, 28 + f, 28 + s
#else
#define KILN_24P_LANES(f, s) f, s, 8 + f, 8 + s, 4 + f, 4 + s, 12 + f, 12 + s
#endif
typedef float kiln_v16 __attribute__((vector_size(64)));
typedef float kiln_v16u __attribute__((vector_size(64), aligned(4)));
static void kiln_24p_planes(int64_t K, int64_t g, const float* restrict x, int mb, int halves, float* restrict dst)
{
    float tile[KILN_SMB * 16] __attribute__((aligned(64)));
    const int64_t columns = K - 4 * g < 16 ? (K - 4 * g > 0 ? K - 4 * g : 0) : 16;
    for (int m = 0; m < 16 * halves; ++m) {
        float* row = tile + 16 * m;
        if (m < mb && columns == 16) {
            *(kiln_v16u*)row = *(const kiln_v16u*)(x + m * K + 4 * g);
            continue;
        }
        *(kiln_v16u*)row = (kiln_v16){0};
        if (m < mb) memcpy(row, x + m * K + 4 * g, sizeof(float) * (size_t)columns);
    }
    for (int j = 0; j < 4; ++j, dst += KILN_24P_GROUP)
        for (int m0 = 0; m0 < 16 * halves; m0 += KILN_SVW / 2) {
            const float* quad = tile + 16 * m0 + 4 * j;  /* row m0 + i's four columns at quad + 16 * i */
#define KILN_24P_QUAD(i) (*(const kiln_v4*)(quad + 16 * (i)))
#if KILN_SVW == 16
            const kiln_sv even = __builtin_shufflevector(
                __builtin_shufflevector(KILN_24P_QUAD(0), KILN_24P_QUAD(2), 0, 1, 2, 3, 4, 5, 6, 7),
                __builtin_shufflevector(KILN_24P_QUAD(4), KILN_24P_QUAD(6), 0, 1, 2, 3, 4, 5, 6, 7),
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const kiln_sv odd = __builtin_shufflevector(
                __builtin_shufflevector(KILN_24P_QUAD(1), KILN_24P_QUAD(3), 0, 1, 2, 3, 4, 5, 6, 7),
                __builtin_shufflevector(KILN_24P_QUAD(5), KILN_24P_QUAD(7), 0, 1, 2, 3, 4, 5, 6, 7),
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
            const kiln_sv even = __builtin_shufflevector(KILN_24P_QUAD(0), KILN_24P_QUAD(2), 0, 1, 2, 3, 4, 5, 6, 7);
            const kiln_sv odd = __builtin_shufflevector(KILN_24P_QUAD(1), KILN_24P_QUAD(3), 0, 1, 2, 3, 4, 5, 6, 7);
#endif
#undef KILN_24P_QUAD
            float* out = dst + 2 * m0;
            kiln_sv_store(out, __builtin_shufflevector(even, odd, KILN_24P_LANES(0, 1)));
            kiln_sv_store(out + KILN_24P_PLANE, __builtin_shufflevector(even, odd, KILN_24P_LANES(0, 2)));
            kiln_sv_store(out + 2 * KILN_24P_PLANE, __builtin_shufflevector(even, odd, KILN_24P_LANES(0, 3)));
            kiln_sv_store(out + 3 * KILN_24P_PLANE, __builtin_shufflevector(even, odd, KILN_24P_LANES(1, 2)));
            kiln_sv_store(out + 4 * KILN_24P_PLANE, __builtin_shufflevector(even, odd, KILN_24P_LANES(1, 3)));
            kiln_sv_store(out + 5 * KILN_24P_PLANE, __builtin_shufflevector(even, odd, KILN_24P_LANES(2, 3)));
        }
}
#undef KILN_24P_LANES

/* a row's two values in a group, (w0, w1) repeated across a vector: one 64-bit broadcast from memory (a load; GCC
 * made the generic vectors' shuffle a permute from the stack, on the FMAs' port) */
static inline kiln_sv kiln_24p_pair(const char* p)
{
    double both;
    memcpy(&both, p, 8);
#if KILN_SVW == 16
    return (kiln_sv)_mm512_castpd_ps(_mm512_set1_pd(both));
#elif defined(__AVX2__) && defined(__FMA__)  /* immintrin.h: kiln_gemm.h */
    return (kiln_sv)_mm256_castpd_ps(_mm256_set1_pd(both));
#else
    kiln_sv w;
    for (int i = 0; i < KILN_SVW; i += 2) memcpy((char*)&w + 4 * i, p, 8);
    return w;
#endif
}
/* NV vectors of (row, slot) lanes per row: 16 rows take 32 floats */
#define KILN_24P_UNIT_BY(NV) do { \
        for (int64_t b = b0; b < b1; ++b) { \
            const float* block = planes + (b - b0) * KILN_24P_GROUPS * KILN_24P_GROUP; \
            for (int r0 = 0; r0 < KILN_24P_ROWS; r0 += KILN_24P_INTERLEAVED, \
                 stream += KILN_24P_INTERLEAVED * KILN_24P_RECORD) { \
                __builtin_prefetch(stream + 8 * KILN_24P_RECORD); \
                __builtin_prefetch(stream + 8 * KILN_24P_RECORD + 64); \
                kiln_sv acc[KILN_24P_INTERLEAVED][NV]; \
                _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r) \
                    _Pragma("GCC unroll 8") for (int v = 0; v < (NV); ++v) \
                        acc[r][v] = kiln_sv_load(sums + (r0 + r) * KILN_24P_PLANE + v * KILN_SVW); \
                _Pragma("GCC unroll 8") for (int g = 0; g < KILN_24P_GROUPS; ++g) \
                    _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r) { \
                        const char* record = stream + r * KILN_24P_RECORD; \
                        const float* x = (const float*)((const char*)(block + g * KILN_24P_GROUP) \
                                                        + (size_t)(uint8_t)record[8 * KILN_24P_GROUPS + g] * 8); \
                        const kiln_sv w = kiln_24p_pair(record + 8 * g); \
                        _Pragma("GCC unroll 8") for (int v = 0; v < (NV); ++v) \
                            acc[r][v] += w * kiln_sv_load(x + v * KILN_SVW); \
                    } \
                _Pragma("GCC unroll 2") for (int r = 0; r < KILN_24P_INTERLEAVED; ++r) \
                    _Pragma("GCC unroll 8") for (int v = 0; v < (NV); ++v) \
                        kiln_sv_store(sums + (r0 + r) * KILN_24P_PLANE + v * KILN_SVW, acc[r][v]); \
            } \
        } \
    } while (0)

/* The activation rows a unit computes for a chunk of mb rows: mb rounded up to 8, 16, 24 or 32 (with 5 to 8 rows,
 * 16 had cost the MLP at batch 8 as much as batch 16: 0.63x dense). */
static inline int kiln_24p_rows(int mb) { return (mb + 7) / 8 * 8; }

/* sums[r * KILN_24P_PLANE + 2m + slot] += the unit's 2:4 row r . activation row m, m < rows (kiln_24p_rows), over the
 * groups of blocks [b0, b1), whose pair planes are at `planes`; the unit's stream at `stream`. The first span
 * (b0 = 0) starts the sums. */
static void kiln_24p_unit(int64_t b0, int64_t b1, const char* restrict stream, const float* restrict planes,
                          int rows, float* restrict sums)
{
    if (b0 == 0) memset(sums, 0, sizeof(float) * KILN_24P_ROWS * KILN_24P_PLANE);
    stream += b0 * KILN_24P_ROWS * KILN_24P_RECORD;
    if (rows == 32) KILN_24P_UNIT_BY(64 / KILN_SVW);
    else if (rows == 24) KILN_24P_UNIT_BY(48 / KILN_SVW);
    else if (rows == 16) KILN_24P_UNIT_BY(32 / KILN_SVW);
    else KILN_24P_UNIT_BY(16 / KILN_SVW);
}

/* by_row[m * KILN_24P_ROWS + r] = the two slots' sums of row r and activation row m < rows (features contiguous, as
 * the epilogue reads them), by 8 x 8 transposes (element by element, this took as long as 5% of the unit's
 * multiply-adds) */
static void kiln_24p_finish(const float* restrict sums, int rows, float* restrict by_row)
{
    for (int m0 = 0; m0 < rows; m0 += 8)
        for (int r0 = 0; r0 < KILN_24P_ROWS; r0 += 8) {
            kiln_v8 a[8];  /* a[i][m]: row r0 + i, activation row m0 + m */
            for (int i = 0; i < 8; ++i) {
                const kiln_v16 both = *(const kiln_v16u*)(sums + (r0 + i) * KILN_24P_PLANE + 2 * m0);
                a[i] = __builtin_shufflevector(both, both, 0, 2, 4, 6, 8, 10, 12, 14)
                     + __builtin_shufflevector(both, both, 1, 3, 5, 7, 9, 11, 13, 15);
            }
            kiln_v8 t[8], u[8];
            for (int i = 0; i < 8; i += 2) {
                t[i] = __builtin_shufflevector(a[i], a[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
                t[i + 1] = __builtin_shufflevector(a[i], a[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
            }
            for (int i = 0; i < 8; i += 4)
                for (int k = 0; k < 2; ++k) {
                    u[i + 2 * k] = __builtin_shufflevector(t[i + k], t[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
                    u[i + 2 * k + 1] = __builtin_shufflevector(t[i + k], t[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
                }
            /* u[i] (i < 4): rows r0 .. r0 + 3 at activation rows m0 + i and m0 + i + 4; u[i + 4]: rows r0 + 4 .. */
            for (int i = 0; i < 4; ++i) {
                kiln_v8_store(by_row + (m0 + i) * KILN_24P_ROWS + r0,
                              __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11));
                kiln_v8_store(by_row + (m0 + i + 4) * KILN_24P_ROWS + r0,
                              __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15));
            }
        }
}
#undef KILN_24P_UNIT_BY

#pragma GCC pop_options

#endif /* KILN_SPARSE_H */
