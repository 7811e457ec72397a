/* kiln_math.h: branch-free float32 exp, tanh and erf, pasted into every generated model.c.
 *
 * libm's expf/tanhf/erff are scalar calls, so a loop over them never vectorizes. These are straight-line code
 * (selects instead of branches, integer exponent arithmetic through memcpy) that the compiler turns into SIMD
 * for whatever ISA the package targets, as Sleef and MLAS do. Accuracy: exp and tanh within ~2 ulp (Cephes
 * coefficients); erf within 1.5e-7 absolute (Cephes' polynomial below 1, Abramowitz & Stegun 7.1.26 above,
 * the same formula ATen's vectorized erf uses). NaN propagates; overflow gives inf; exp flushes results below
 * 1.65e-38 to 0 (see kiln_expf).
 */
#ifndef KILN_MATH_H
#define KILN_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float kiln_bits_to_float(int32_t bits) { float f; memcpy(&f, &bits, sizeof f); return f; }
static inline uint32_t kiln_float_bits(float f) { uint32_t bits; memcpy(&bits, &f, sizeof bits); return bits; }

/* float16 and bfloat16 elements: their bits in a one-member struct, so that arithmetic on a stored element fails to
 * compile instead of reading the bits as an integer. Kernels compute on floats, converting at loads and rounding at
 * stores to nearest even, as ATen's conversions do (a NaN stays a NaN: float16's of its sign; bfloat16's is 0xFFFF, as
 * ATen's vectorized conversion writes every NaN, where c10::BFloat16's scalar one writes 0x7FC0).
 * Integer arithmetic and selects, so loops over them vectorize; no float subnormal is ever an operand. */
typedef struct { uint16_t bits; } kiln_f16;
typedef struct { uint16_t bits; } kiln_bf16;

static inline float kiln_f16_to_float(kiln_f16 h)
{
    const uint32_t shifted = (uint32_t)(h.bits & 0x7FFFu) << 13;  /* exponent and mantissa in float's places */
    const uint32_t exponent = shifted & 0x0F800000u;
    const uint32_t rebiased = shifted + ((127u - 15u) << 23);
    /* subnormals (and zero): the mantissa as a normal float of exponent 2^-14, less that power of two, exactly */
    const float small = kiln_bits_to_float((int32_t)(rebiased + (1u << 23))) - kiln_bits_to_float(113 << 23);
    /* inf, and NaN made quiet (as ATen's conversion, a float multiplication, makes it) */
    const uint32_t special = rebiased + ((128u - 16u) << 23) | ((shifted & 0x007FFFFFu) != 0 ? 0x00400000u : 0);
    const uint32_t magnitude = exponent == 0x0F800000u ? special : exponent == 0 ? kiln_float_bits(small) : rebiased;
    return kiln_bits_to_float((int32_t)(magnitude | (uint32_t)(h.bits & 0x8000u) << 16));
}

static inline kiln_f16 kiln_f16_from_float(float value)
{
    const uint32_t bits = kiln_float_bits(value), magnitude = bits & 0x7FFFFFFFu;
    /* below 2^-14: a subnormal, rounded to a multiple of 2^-24 by adding 0.5 (whose ulp that is) */
    const uint32_t small = kiln_float_bits(kiln_bits_to_float((int32_t)magnitude) + 0.5f) - 0x3F000000u;
    /* normal: rebiased, then the 13 dropped bits rounded half to even (a carry may reach the exponent, up to inf) */
    const uint32_t normal = (magnitude + 0xC8000FFFu + ((magnitude >> 13) & 1u)) >> 13;
    const uint32_t half = magnitude >= 0x47800000u ? (magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u)  /* NaN, inf */
                        : magnitude < 0x38800000u ? small : normal;
    return (kiln_f16){(uint16_t)(half | (bits >> 16 & 0x8000u))};
}

static inline float kiln_bf16_to_float(kiln_bf16 h) { return kiln_bits_to_float((int32_t)((uint32_t)h.bits << 16)); }

static inline kiln_bf16 kiln_bf16_from_float(float value)
{
    const uint32_t bits = kiln_float_bits(value);
    return (kiln_bf16){(uint16_t)(value != value ? 0xFFFFu : (bits + 0x7FFFu + (bits >> 16 & 1u)) >> 16)};
}

/* One polynomial step, p * x + c. ISO C mode (-std=c11) keeps GCC from contracting a * b + c into an FMA, so the
 * polynomials below ask for it: one instruction instead of two, and one rounding. Without FMA hardware (the
 * DEFAULT capability) fmaf would be a library call per element, so there it stays a multiply and an add. */
#if defined(__FMA__)
#define KILN_FMAF(p, x, c) fmaf(p, x, c)
#else
#define KILN_FMAF(p, x, c) ((p) * (x) + (c))
#endif

static inline float kiln_expf(float x)
{
    /* Results below 1.65e-38 (x < -87) flush to 0: computing subnormal results costs a microcode assist per
     * element, and masked attention scores (-inf) would hit it on every masked element. The absolute error
     * is below 1.2e-38. */
    const float high = 88.72283935546875f, low = -87.0f;
    float clamped = x > high ? high : x;
    clamped = clamped < low ? low : clamped;
    /* exp(x) = 2^n exp(r), r = x - n ln2 in [-ln2/2, ln2/2]; ln2 split so n*ln2 is exact. */
    const float n = floorf(KILN_FMAF(clamped, 1.44269504088896341f, 0.5f));
    float r = KILN_FMAF(n, -0.693359375f, clamped);
    r = KILN_FMAF(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = KILN_FMAF(p, r, 1.3981999507e-3f);
    p = KILN_FMAF(p, r, 8.3334519073e-3f);
    p = KILN_FMAF(p, r, 4.1665795894e-2f);
    p = KILN_FMAF(p, r, 1.6666665459e-1f);
    p = KILN_FMAF(p, r, 5.0000001201e-1f);
    p = KILN_FMAF(p, r * r, r) + 1.0f;
    /* 2^n as two normal factors, so results near overflow stay exact. */
    const int32_t e = (int32_t)n, half = e >> 1;
    const float value = p * kiln_bits_to_float((half + 127) << 23) * kiln_bits_to_float((e - half + 127) << 23);
    return x > high ? INFINITY : x < low ? 0.0f : value;
}

static inline float kiln_tanhf(float x)
{
    const float a = fabsf(x);
    /* |x| < 0.625: odd polynomial (no cancellation near 0); else 1 - 2 / (exp(2|x|) + 1) with x's sign. */
    const float z = x * x;
    float p = -5.70498872745e-3f;
    p = KILN_FMAF(p, z, 2.06390887954e-2f);
    p = KILN_FMAF(p, z, -5.37397155531e-2f);
    p = KILN_FMAF(p, z, 1.33314422036e-1f);
    p = KILN_FMAF(p, z, -3.33332819422e-1f);
    const float small = KILN_FMAF(x * z, p, x);
    const float large = copysignf(1.0f - 2.0f / (kiln_expf(2.0f * a) + 1.0f), x);
    return a < 0.625f ? small : large;
}

static inline float kiln_erff(float x)
{
    const float a = fabsf(x);
    const float z = x * x;
    float p = 7.853861353153693e-5f;
    p = KILN_FMAF(p, z, -8.010193625184903e-4f);
    p = KILN_FMAF(p, z, 5.188327685732524e-3f);
    p = KILN_FMAF(p, z, -2.685381193529856e-2f);
    p = KILN_FMAF(p, z, 1.128358514861418e-1f);
    p = KILN_FMAF(p, z, -3.761262582423300e-1f);
    p = KILN_FMAF(p, z, 1.128379165726710e+0f);
    const float small = x * p;
    const float t = 1.0f / KILN_FMAF(0.3275911f, a, 1.0f);
    float q = 1.061405429f;
    q = KILN_FMAF(q, t, -1.453152027f);
    q = KILN_FMAF(q, t, 1.421413741f);
    q = KILN_FMAF(q, t, -0.284496736f);
    q = KILN_FMAF(q, t, 0.254829592f);
    const float large = copysignf(1.0f - q * t * kiln_expf(-z), x);
    return a < 1.0f ? small : large;
}

static inline float kiln_sigmoidf(float x) { return 1.0f / (1.0f + kiln_expf(-x)); }
static inline float kiln_geluf(float x) { return 0.5f * x * (1.0f + kiln_erff(x * 0.70710678118654752440f)); }
static inline float kiln_gelu_tanhf(float x)
{
    return 0.5f * x * (1.0f + kiln_tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}

/* Helpers for the pointwise rules (kiln/codegen/c/pointwise.py). A rule gets its operands cast to the result's
 * compute type, so the kiln_* macros below pick the floating or integer form with _Generic on that type.
 * Integer division, fmod and remainder by zero give 0 (the reference interpreter raises; C would trap), and
 * INT64_MIN / -1 wraps instead of trapping. */
static inline int64_t kiln_negate_i64(int64_t a) { return (int64_t)(0 - (uint64_t)a); }
static inline int64_t kiln_identity_i64(int64_t a) { return a; }
static inline int64_t kiln_div_trunc_i64(int64_t a, int64_t b)
{
    return b == 0 ? 0 : b == -1 ? kiln_negate_i64(a) : a / b;
}
static inline int64_t kiln_div_floor_i64(int64_t a, int64_t b)
{
    if (b == 0 || b == -1)
        return kiln_div_trunc_i64(a, b);
    const int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t kiln_fmod_i64(int64_t a, int64_t b) { return b == 0 || b == -1 ? 0 : a % b; }
/* Python's %: the result takes the divisor's sign. */
static inline int64_t kiln_remainder_i64(int64_t a, int64_t b)
{
    const int64_t r = kiln_fmod_i64(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double kiln_remainder_f64(double a, double b)
{
    const double r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double kiln_div_trunc_f64(double a, double b) { return trunc(a / b); }
/* c10::div_floor_floating: floor of the exact quotient (fmod-based, so 7.0 // 0.7 is 9 like Python), IEEE
 * results for division by zero, and a signed zero. The float version rounds each step like float32 ATen. */
static inline double kiln_div_floor_f64(double a, double b)
{
    if (b == 0)
        return a / b;
    const double mod = fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0)))
        div -= 1.0;
    if (div == 0)
        return copysign(0.0, a / b);
    double floored = floor(div);
    return div - floored > 0.5 ? floored + 1.0 : floored;
}
static inline float kiln_div_floorf(float a, float b)
{
    if (b == 0)
        return a / b;
    const float mod = fmodf(a, b);
    float div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0)))
        div -= 1.0f;
    if (div == 0)
        return copysignf(0.0f, a / b);
    float floored = floorf(div);
    return div - floored > 0.5f ? floored + 1.0f : floored;
}
/* ATen's powi: squaring with wrap-around; a negative exponent gives 1, -1 or 0 (1 / base truncated). */
static inline int64_t kiln_pow_i64(int64_t base, int64_t exponent)
{
    if (exponent < 0)
        return base == 1 ? 1 : base == -1 ? ((exponent & 1) ? -1 : 1) : 0;
    uint64_t result = 1, square = (uint64_t)base;
    for (; exponent; exponent >>= 1) {
        if (exponent & 1)
            result *= square;
        square *= square;
    }
    return (int64_t)result;
}

#define kiln_div_trunc(a, b) _Generic((a), double: kiln_div_trunc_f64, default: kiln_div_trunc_i64)(a, b)
#define kiln_div_floor(a, b) _Generic((a), double: kiln_div_floor_f64, default: kiln_div_floor_i64)(a, b)
#define kiln_fmod(a, b) _Generic((a), double: fmod, default: kiln_fmod_i64)(a, b)
#define kiln_remainder(a, b) _Generic((a), double: kiln_remainder_f64, default: kiln_remainder_i64)(a, b)
#define kiln_pow(a, b) _Generic((a), double: pow, default: kiln_pow_i64)(a, b)
/* pow(tensor, scalar): ATen computes exponents 0.5 and -0.5 as sqrt and 1/sqrt, so (-inf)^0.5 is NaN and
 * (-0.0)^-0.5 is -inf where pow() says inf. The exponent is a literal, so the compiler folds the tests. */
static inline double kiln_pow_scalar_f64(double x, double e) { return e == 0.5 ? sqrt(x) : e == -0.5 ? 1.0 / sqrt(x) : pow(x, e); }
#define kiln_pow_scalar(a, b) _Generic((a), double: kiln_pow_scalar_f64, default: kiln_pow_i64)(a, b)
/* ceil/floor/round/trunc are the identity on integers (and must not round-trip them through double). */
#define kiln_ceil(x) _Generic((x), double: ceil, default: kiln_identity_i64)(x)
#define kiln_floor(x) _Generic((x), double: floor, default: kiln_identity_i64)(x)
#define kiln_round(x) _Generic((x), double: nearbyint, default: kiln_identity_i64)(x)
#define kiln_trunc(x) _Generic((x), double: trunc, default: kiln_identity_i64)(x)
#define kiln_bitwise_not(x) _Generic((x), _Bool: !(x), default: ~(x))

#endif /* KILN_MATH_H */
