/* What the exact kernels' vector code shares: 16 float32 lanes (GCC vector extensions), exp, and the
 * rounding to bf16.
 *
 * exp_reduced is exp(x) for x in [-87, 88] (callers clamp): n = round(x / ln 2), r = x - n ln 2 in two
 * parts, a degree-6 Taylor polynomial in r, times 2^n; ~2 ulp, and the same operations in every lane and
 * every kernel, so it gives the same bits wherever it runs. */
#ifndef EXACT_VEC_H
#define EXACT_VEC_H
#include <stdint.h>

#define VL 16 /* lanes */

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

static inline vf splat(float x) { return (vf){0} + x; }
static inline vf pick(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

static inline vf exp_reduced(vf x) {
    vf n = (x * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f); /* round(x / ln 2) */
    vf r = x - n * splat(0.693145751953125f);
    r = r - n * splat(1.428606765330187045e-06f);
    vf p = splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    vi e = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n */
    return p * (vf)e;
}

typedef uint32_t vu __attribute__((vector_size(VL * 4)));

/* float32 lanes -> bf16, to nearest even (NaN stays NaN), in the low 16 bits of each lane */
static inline vu to_bf16(vf f) {
    vu u = (vu)f;
    vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vu nan = (u >> 16) | 0x40u;
    vi is_nan = (vi)((u & 0x7fffffffu) > 0x7f800000u);
    return (vu)(((vi)nan & is_nan) | ((vi)rounded & ~is_nan));
}
#endif
