/* RMSNorm for the exact linear layers' input: y = bf16((x * rsqrt(mean(x^2) + eps)) * w), each row by
 * one fixed sequence of float32 operations whatever the pass (how many rows, which thread), so the rows
 * of a verify pass and of a prompt read in pieces keep the bits of single steps, as the layers after
 * them do (exact_linear.c).
 *
 * Why our own: torch runs RMSNorm on the CPU as ~8 small ops, ~25 us a call on the 2-core development
 * CPU, 60 calls a decode step of the embedded model: ~1.5 ms of a ~9 ms step (decoding/drafts/README.md).
 *
 * The sum of squares runs with 16 lanes over the row (lane l takes elements l, l + 16, ... in order),
 * then the lanes are added pairwise in a fixed tree; mean, eps and the reciprocal square root as the
 * formula reads (1 / sqrtf, each correctly rounded); then x * r, times w, rounded to bf16 to nearest
 * even. Not torch's reduction order, so not torch's bits: its own, in every pass.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exact_vec.h"

static void norm_row(const float *x, long d, const float *w, float eps, uint16_t *y) {
  float lane[VL] = {0};
  long j = 0;
  for (; j + VL <= d; j += VL)
    for (int l = 0; l < VL; l++) lane[l] += x[j + l] * x[j + l];
  for (int l = 0; j + l < d; l++) lane[l] += x[j + l] * x[j + l];
  for (int width = VL / 2; width > 0; width /= 2)
    for (int l = 0; l < width; l++) lane[l] += lane[l + width];
  float r = 1.0f / sqrtf(lane[0] / (float)d + eps);
  for (long i = 0; i < d; i += VL) { /* (x * r) * w, rounded; a row's last partial vector padded */
    long n = d - i < VL ? d - i : VL;
    vf xv = {0}, wv = {0};
    memcpy(&xv, x + i, (size_t)n * 4);
    memcpy(&wv, w + i, (size_t)n * 4);
    vu h = to_bf16((xv * splat(r)) * wv);
    for (long k = 0; k < n; k++) y[i + k] = (uint16_t)h[k];
  }
}

/* x (T, D) float32 rows, w (D,) float32 -> y (T, D) bf16 */
void exact_rms_norm(const float *x, long t, long d, const float *w, float eps, uint16_t *y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (t >= 64)
  for (long r = 0; r < t; r++) norm_row(x + r * d, d, w, eps, y + r * d);
}
