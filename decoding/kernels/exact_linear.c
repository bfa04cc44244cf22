/* Exact bf16 linear layers: y = x W^T (+ b) for a bf16 model, every output computed by one fixed
 * sequence of float operations whatever the pass around it (how many rows, which rows beside it, which
 * thread), so a verify pass of k rows gives each row the bits of the single decode step it stands for,
 * and a prompt read in one pass or in several gives the same bits.
 *
 * How: vector lanes run over outputs, 16 to a vector. Each lane accumulates its output over the
 * reduction in order, one pair of inputs at a time (vdpbf16ps: two bf16 products added into a float32
 * accumulator), from zero at input 0 to the end; no lane ever meets another, and nothing is summed
 * across lanes. Tiles (which rows and outputs share registers) only choose which accumulators run
 * together, so any tiling, any row count and any thread split give every output the same bits.
 *
 * Why our own: oneDNN's bf16 kernel blocks reductions longer than 768 differently for different row
 * counts (the model split them, decoding/packing.py), and a one-row step streamed the weights at ~30
 * GB/s on the 2-core development CPU. Here the weights are packed so that each group of 32 outputs reads
 * one contiguous stream (for each input pair, its 32 outputs' two weights: 128 bytes), and a one-row
 * step streams them at ~55 GB/s: the embedded model's 151 linears a step ~8.5 -> ~4.7 ms
 * (decoding/drafts/README.md). Up to 12 rows run against a group at once (24 accumulators: 2 weight
 * loads and 12 broadcasts for 24 multiply-adds), so a verify pass reads the weights once; longer
 * passes split into tiles as even as they come, and prompts run at oneDNN's speed.
 *
 * A tile prefetches its weights 4 KB ahead of what it reads. Without it, a pass of several rows stalled on
 * memory between its bursts of multiply-adds, memory and arithmetic taking turns: a 9-row pass of the
 * embedded model took 8.53 ms against a step's 6.05; with it, 7.83 (steps alike; side by side in one
 * process, decoding/drafts/README.md). A prefetch changes no arithmetic, and one past the end is ignored.
 *
 * Inputs are bf16, or float32 rounded to bf16 (to nearest even, as torch's cast) once per pass.
 * Outputs are float32: the accumulators, plus the bias. Needs AVX512-BF16; built without it, only
 * `exact_linear_available` (0) does anything.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GV 2         /* output vectors per group */
#define GW (GV * 16) /* outputs per group: the packed layout's unit */
#define TB 12        /* rows per tile, at most */
#define AHEAD 2048   /* bf16 weights a tile prefetches ahead of what it reads: 4 KB, 32 input pairs */

int exact_linear_available(void) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

long exact_linear_packed_size(long n, long k) { return (n + GW - 1) / GW * GW * k; }

/* w (N, K) bf16 row-major -> packed: groups of GW outputs; within a group, for each input pair p, the
 * GW outputs' weights (w[n, 2p], w[n, 2p + 1]) one after another. Outputs past N weigh zero. */
void exact_linear_pack(const uint16_t *w, long n, long k, uint16_t *packed) {
  long groups = (n + GW - 1) / GW;
  for (long g = 0; g < groups; g++)
    for (long p = 0; p < k / 2; p++) {
      uint16_t *o = packed + (g * (k / 2) + p) * GW * 2;
      for (long j = 0; j < GW; j++) {
        long row = g * GW + j;
        o[2 * j] = row < n ? w[row * k + 2 * p] : 0;
        o[2 * j + 1] = row < n ? w[row * k + 2 * p + 1] : 0;
      }
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#include "exact_vec.h"

static inline __mmask16 lanes_left(long left) {
  return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* rows [t0, t0 + tb) of x (bf16, row stride xs) against one group: outputs [n0, n0 + GW) of N */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, long xs, const uint16_t *wg, long k,
                                                       long n0, long n, const float *bias, float *y, long ys,
                                                       long t0, const int tb) {
  __m512 acc[TB][GV];
  for (int i = 0; i < tb; i++)
    for (int v = 0; v < GV; v++) acc[i][v] = _mm512_setzero_ps();
  const uint16_t *xr = x + t0 * xs;
  const uint16_t *wp = wg;
  for (long p = 0; p < k / 2; p++, wp += GW * 2) {
    _mm_prefetch((const char *)(wp + AHEAD), _MM_HINT_T0); /* the stream 4 KB on: its two lines */
    _mm_prefetch((const char *)(wp + AHEAD + 32), _MM_HINT_T0);
    __m512bh w[GV];
    for (int v = 0; v < GV; v++) w[v] = (__m512bh)_mm512_loadu_si512(wp + 32 * v);
    for (int i = 0; i < tb; i++) {
      int32_t pair;
      memcpy(&pair, xr + i * xs + 2 * p, sizeof pair);
      __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < GV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], w[v], b);
    }
  }
  for (int v = 0; v < GV; v++) {
    long at = n0 + v * 16;
    if (at >= n) break;
    __mmask16 m = lanes_left(n - at);
    __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + at) : _mm512_setzero_ps();
    for (int i = 0; i < tb; i++) {
      __m512 out = bias ? _mm512_add_ps(acc[i][v], b) : acc[i][v];
      _mm512_mask_storeu_ps(y + (t0 + i) * ys + at, m, out);
    }
  }
}

#define ROWS(tb) \
  case tb: tile(x, xs, wg, k, n0, n, bias, y, ys, t0, tb); break;

static void rows_of_group(const uint16_t *x, long xs, const uint16_t *wg, long k, long n0, long n,
                          const float *bias, float *y, long ys, long t0, long tb) {
  switch (tb) { /* a constant row count per tile keeps its accumulators in registers */
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11)
    default: tile(x, xs, wg, k, n0, n, bias, y, ys, t0, TB); break;
  }
}

/* float32 (T, K) -> bf16, rounded to nearest even (NaN stays NaN) as a cast rounds: in integers, since
 * the CPU's own conversion (vcvtneps2bf16) takes a subnormal input for zero */
static void round_rows(const float *xf, long t, long k, uint16_t *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (t >= 64)
  for (long r = 0; r < t; r++)
    for (long j = 0; j < k; j += 16) {
      __mmask16 m = lanes_left(k - j);
      vu h = to_bf16((vf)_mm512_maskz_loadu_ps(m, xf + r * k + j));
      _mm256_mask_storeu_epi16(out + r * k + j, m, _mm512_cvtepi32_epi16((__m512i)h));
    }
}

/* y (T, N) float32 = x (T, K) W^T + bias; x bf16 (x_f32 0) or float32 (1), rows contiguous; packed from
 * exact_linear_pack; bias (N,) float32 or NULL. Returns 0, or 1 when out of memory (float32 input). */
int exact_linear(const void *x, int x_f32, long t, const uint16_t *packed, long n, long k, const float *bias,
                 float *y, int threads) {
  const uint16_t *xb = (const uint16_t *)x;
  uint16_t *rounded = NULL;
  if (t <= 0) return 0;
  if (x_f32) {
    rounded = malloc((size_t)(t * k) * sizeof *rounded);
    if (!rounded) return 1;
    round_rows((const float *)x, t, k, rounded, threads);
    xb = rounded;
  }
  long groups = (n + GW - 1) / GW;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
  for (long g = 0; g < groups; g++) {
    const uint16_t *wg = packed + g * (k / 2) * GW * 2;
    long tiles = (t + TB - 1) / TB, rows = (t + tiles - 1) / tiles; /* as even as they come: 16 = 8 + 8 */
    for (long t0 = 0; t0 < t; t0 += rows)
      rows_of_group(xb, k, wg, k, g * GW, n, bias, y, n, t0, t - t0 < rows ? t - t0 : rows);
  }
  free(rounded);
  return 0;
}
#else
int exact_linear(const void *x, int x_f32, long t, const uint16_t *packed, long n, long k, const float *bias,
                 float *y, int threads) {
  (void)x, (void)x_f32, (void)t, (void)packed, (void)n, (void)k, (void)bias, (void)y, (void)threads;
  return 2;
}
#endif
