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

/* The target's widest float vector (GCC/Clang vector extensions): 16 lanes with AVX-512,
 * 8 with AVX, else 4 (SSE2, NEON). A wider type than the target has would live in memory,
 * not registers (measured: an AVX2 build of 16-lane code trained 10x slower than the
 * AVX-512 one). The vector functions below do the scalar ones' IEEE operations lane by lane,
 * so a lane's result equals the scalar function's bit for bit, at every width; where lanes
 * are summed (lse.h) the sum runs over LANES = 16 fixed lanes, whatever the width. */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(4 * VW)));
typedef int32_t vi __attribute__((vector_size(4 * VW)));

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* m ? a : b lane by lane (m: all bits set or clear, as a comparison gives). */
static inline vf vselect(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

static inline vf vsplat(float x) { return (vf){0} + x; }

static inline vf exp_v(vf x) {
    x = vselect(x > 88.0f, vsplat(88.0f), x);
    x = vselect(x < -87.0f, vsplat(-87.0f), x);
    vf t = x * 1.44269504088896341f;
    vf n = (t + 12582912.0f) - 12582912.0f;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf y = p * (r * r) + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return y * (vf)bits;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

static inline float tanh_f(float x) { return 2.0f / (1.0f + exp_f(-2.0f * x)) - 1.0f; }

static inline vf sigmoid_v(vf x) { return 1.0f / (1.0f + exp_v(-x)); }

static inline vf tanh_v(vf x) { return 2.0f / (1.0f + exp_v(-2.0f * x)) - 1.0f; }

/* a[j] = sigmoid(a[j]) for j < n, VW lanes at a time and then the scalar remainder (the same
 * operations). Written with the vector type because GCC vectorises exp_f's clamps itself
 * only with AVX-512's masks: below it, it left these loops scalar ("control flow in loop"). */
static inline void sigmoid_all(int n, float *a) {
    int j = 0;
    for (; j + VW <= n; j += VW) vstore(a + j, sigmoid_v(vload(a + j)));
    for (; j < n; j++) a[j] = sigmoid_f(a[j]);
}

/* a[j] = tanh(a[j]) for j < n (as sigmoid_all). */
static inline void tanh_all(int n, float *a) {
    int j = 0;
    for (; j + VW <= n; j += VW) vstore(a + j, tanh_v(vload(a + j)));
    for (; j < n; j++) a[j] = tanh_f(a[j]);
}

#endif
