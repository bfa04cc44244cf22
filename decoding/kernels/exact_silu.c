/* The SwiGLU product for the exact linear layers: y = bf16(silu(gate) * up) from w13's float32 output
 * (T, 2I): gate, then up, in each row. Every element by one fixed sequence of float32 operations, 16 to
 * a vector (a row's last partial vector padded, never computed another way), so every pass gives a row
 * the same bits. Part of one layer's call (exact_layer.c).
 *
 * silu(g) = g / (1 + exp(-g)), exp as the attention's (exact_vec.h), its input clamped to [-87, 88].
 * Not torch's bits: its own.
 */
#include <stdint.h>
#include <string.h>

#include "exact_vec.h"

static inline vf exp_of(vf x) { /* x clamped to [-87, 88] */
  x = pick(x < splat(-87.0f), splat(-87.0f), x);
  return exp_reduced(pick(x > splat(88.0f), splat(88.0f), x));
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
