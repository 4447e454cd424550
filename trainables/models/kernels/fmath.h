/* Float math shared by the kernels: exp as a Cephes-style polynomial (about 1 ulp) in plain
 * arithmetic, so that with contraction off a vectorised loop body and its scalar remainder
 * compute the same IEEE operations (see lstm_cell.c). */
#ifndef FINELINE_FMATH_H
#define FINELINE_FMATH_H
#include <stdint.h>
#include <string.h>

static inline float exp_f(float x) {
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* 16 floats as one value (GCC/Clang vector extensions; lowered to this CPU's vectors). The
 * vector functions below do the scalar ones' IEEE operations lane by lane, so a lane's
 * result equals the scalar function's bit for bit. */
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
#define VLANES 16

static inline vf16 vload(const float *p) {
    vf16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, vf16 v) { memcpy(p, &v, sizeof v); }

/* m ? a : b lane by lane (m: all bits set or clear, as a comparison gives). */
static inline vf16 vselect(vi16 m, vf16 a, vf16 b) { return (vf16)((m & (vi16)a) | (~m & (vi16)b)); }

static inline vf16 vsplat(float x) { return (vf16){0} + x; }

static inline vf16 exp_v(vf16 x) {
    x = vselect(x > 88.0f, vsplat(88.0f), x);
    x = vselect(x < -87.0f, vsplat(-87.0f), x);
    vf16 t = x * 1.44269504088896341f;
    vf16 n = (t + 12582912.0f) - 12582912.0f;
    vf16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf16 p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf16 y = p * (r * r) + r + 1.0f;
    vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
    return y * (vf16)bits;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

static inline float tanh_f(float x) { return 2.0f / (1.0f + exp_f(-2.0f * x)) - 1.0f; }

#endif
