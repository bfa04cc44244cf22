/* The SwiGLU product for the exact linear layers: y = bf16(silu(gate) * up) from w13's float32 output
 * (T, 2I): gate, then up, in each row. Every element by one fixed sequence of float32 operations, 16 to
 * a vector (a row's last partial vector padded, never computed another way), so every pass gives a row
 * the same bits. Part of one layer's call (exact_layer.c).
 *
 * silu(g) = g / (1 + exp(-g)), exp by range reduction (n = round(x / ln 2), r = x - n ln 2 in two parts)
 * and a degree-6 Taylor polynomial times 2^n, x clamped to [-87, 88]; ~2 ulp. Not torch's bits: its own.
 */
#include <stdint.h>
#include <string.h>

#define VL 16
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

static inline vf splat(float x) { return (vf){0} + x; }
static inline vf pick(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

static inline vf exp_of(vf x) {
  x = pick(x < splat(-87.0f), splat(-87.0f), x);
  x = pick(x > splat(88.0f), splat(88.0f), x);
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

/* float32 lanes -> bf16, to nearest even (NaN stays NaN), in the low 16 bits of each lane */
static inline vu to_bf16(vf f) {
  vu u = (vu)f;
  vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vu nan = (u >> 16) | 0x40u;
  vi is_nan = (vi)((u & 0x7fffffffu) > 0x7f800000u);
  return (vu)(((vi)nan & is_nan) | ((vi)rounded & ~is_nan));
}

static void row(const float *gu, long inter, uint16_t *y) {
  const float *gate = gu, *up = gu + inter;
  for (long i = 0; i < inter; i += VL) {
    long w = inter - i < VL ? inter - i : VL;
    vf g = {0}, u = {0};
    memcpy(&g, gate + i, (size_t)w * 4);
    memcpy(&u, up + i, (size_t)w * 4);
    vu h = to_bf16(g / (splat(1.0f) + exp_of(-g)) * u);
    for (long j = 0; j < w; j++) y[i + j] = (uint16_t)h[j];
  }
}

/* gu (T, 2I) float32 -> y (T, I) bf16 */
void exact_silu_mul(const float *gu, long t, long inter, uint16_t *y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (t >= 64)
  for (long r = 0; r < t; r++) row(gu + r * 2 * inter, inter, y + r * inter);
}
