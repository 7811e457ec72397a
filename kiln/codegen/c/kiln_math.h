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

static inline float kiln_expf(float x)
{
    /* Results below 1.65e-38 (x < -87) flush to 0: computing subnormal results costs a microcode assist per
     * element, and masked attention scores (-inf) would hit it on every masked element. The absolute error
     * is below 1.2e-38. */
    const float high = 88.72283935546875f, low = -87.0f;
    float clamped = x > high ? high : x;
    clamped = clamped < low ? low : clamped;
    /* exp(x) = 2^n exp(r), r = x - n ln2 in [-ln2/2, ln2/2]; ln2 split so n*ln2 is exact. */
    const float n = floorf(clamped * 1.44269504088896341f + 0.5f);
    float r = clamped - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
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
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = x + x * z * p;
    const float large = copysignf(1.0f - 2.0f / (kiln_expf(2.0f * a) + 1.0f), x);
    return a < 0.625f ? small : large;
}

static inline float kiln_erff(float x)
{
    const float a = fabsf(x);
    const float z = x * x;
    float p = 7.853861353153693e-5f;
    p = p * z - 8.010193625184903e-4f;
    p = p * z + 5.188327685732524e-3f;
    p = p * z - 2.685381193529856e-2f;
    p = p * z + 1.128358514861418e-1f;
    p = p * z - 3.761262582423300e-1f;
    p = p * z + 1.128379165726710e+0f;
    const float small = x * p;
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    float q = 1.061405429f;
    q = q * t - 1.453152027f;
    q = q * t + 1.421413741f;
    q = q * t - 0.284496736f;
    q = q * t + 0.254829592f;
    const float large = copysignf(1.0f - q * t * kiln_expf(-z), x);
    return a < 1.0f ? small : large;
}

static inline float kiln_sigmoidf(float x) { return 1.0f / (1.0f + kiln_expf(-x)); }
static inline float kiln_geluf(float x) { return 0.5f * x * (1.0f + kiln_erff(x * 0.70710678118654752440f)); }
static inline float kiln_gelu_tanhf(float x)
{
    return 0.5f * x * (1.0f + kiln_tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}

#endif /* KILN_MATH_H */
