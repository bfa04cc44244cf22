/* A whole decoder layer of a bf16 model in one call, from the exact kernels: RMSNorm, the q/k/v
 * projection, attention (rotation and cache write included), the output projection and the residual;
 * RMSNorm, w13, the SwiGLU product, w2 and the residual. The same operations the model's Python
 * runs one call at a time, in the same order, so the same guarantee: every row the same bits in any
 * pass. Why: between those ~12 calls a layer, Python and small torch ops took ~2.5 ms of a ~7.7 ms
 * decode step of the embedded model (decoding/drafts/README.md, "Exact linear layers").
 */
#include <stddef.h>
#include <stdint.h>

int attend_qkv(const void *qkv, int bf16, int T, int nh, int nkv, int hd, float scale, const float *cos,
               const float *sin, float *kt, long khs, long kds, float *v, long vhs, int start, const uint8_t *mask,
               int causal, uint16_t *out, float *scratch, int threads);
int exact_linear(const void *x, int x_f32, long t, const uint16_t *packed, long n, long k, const float *bias,
                 float *y, int threads);
void exact_rms_norm(const float *x, long t, long d, const float *w, float eps, uint16_t *y, int threads);
void exact_silu_mul(const float *gu, long t, long inter, uint16_t *y, int threads);

static size_t up64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static void scratch_sizes(int t, long d, long nqkv, long nd, long inter, size_t sizes[6]) {
  sizes[0] = up64((size_t)t * d * 2);         /* h: a norm's bf16 output */
  sizes[1] = up64((size_t)t * nqkv * 4);      /* q, k, v, float32 */
  sizes[2] = up64((size_t)t * nd * 2);        /* attention output, bf16 */
  sizes[3] = up64((size_t)2 * nd * t * 4);    /* attention's scratch */
  sizes[4] = up64((size_t)t * (2 * inter > d ? 2 * inter : d) * 4); /* wo's, w13's, then w2's output */
  sizes[5] = up64((size_t)t * inter * 2);     /* the SwiGLU product, bf16 */
}

/* bytes of scratch exact_layer needs for t rows (the caller keeps one buffer: a long prompt's ~70 MB,
 * allocated anew each layer, would cost its page faults every time) */
long exact_layer_scratch(int t, long d, long nqkv, long nd, long inter) {
  size_t sizes[6], total = 0;
  scratch_sizes(t, d, nqkv, nd, inter, sizes);
  for (int i = 0; i < 6; i++) total += sizes[i];
  return (long)total;
}

static void add_rows(float *x, const float *f, long t, long d, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (t >= 64)
  for (long r = 0; r < t; r++)
    for (long i = 0; i < d; i++) x[r * d + i] = x[r * d + i] + f[r * d + i];
}

/* x (T, D) float32, the residual stream: updated in place; scratch: exact_layer_scratch bytes, 64-byte
 * aligned. Returns 0, or a kernel's status (-1: a head too wide, 1: out of memory). */
int exact_layer(float *x, int t, long d, float eps, const float *n1, const float *n2, const uint16_t *wqkv,
                long nqkv, const float *bqkv, const uint16_t *wo, const uint16_t *w13, long inter, const uint16_t *w2,
                int nh, int nkv, int hd, float scale, const float *cos, const float *sin, float *kt, long khs,
                long kds, float *v, long vhs, int start, const uint8_t *mask, int causal, void *scratch,
                int threads) {
  if (t <= 0) return 0;
  long nd = (long)nh * hd;
  size_t sizes[6];
  scratch_sizes(t, d, nqkv, nd, inter, sizes);
  char *at = scratch;
  uint16_t *h = (uint16_t *)at;
  float *qkv = (float *)(at += sizes[0]);
  uint16_t *att = (uint16_t *)(at += sizes[1]);
  float *ascratch = (float *)(at += sizes[2]);
  float *f = (float *)(at += sizes[3]);
  uint16_t *act = (uint16_t *)(at += sizes[4]);
  int status = 0;
  exact_rms_norm(x, t, d, n1, eps, h, threads);
  if ((status = exact_linear(h, 0, t, wqkv, nqkv, d, bqkv, qkv, threads))) return status;
  if ((status = attend_qkv(qkv, 0, t, nh, nkv, hd, scale, cos, sin, kt, khs, kds, v, vhs, start, mask, causal, att,
                           ascratch, threads)))
    return status;
  if ((status = exact_linear(att, 0, t, wo, d, nd, NULL, f, threads))) return status;
  add_rows(x, f, t, d, threads);
  exact_rms_norm(x, t, d, n2, eps, h, threads);
  if ((status = exact_linear(h, 0, t, w13, 2 * inter, d, NULL, f, threads))) return status;
  exact_silu_mul(f, t, inter, act, threads);
  if ((status = exact_linear(act, 0, t, w2, d, inter, NULL, f, threads))) return status;
  add_rows(x, f, t, d, threads);
  return 0;
}

/* One layer's own weights and cache, as exact_layers reads them (kernels.LayerTable builds them). */
typedef struct {
  const float *n1, *n2;
  const uint16_t *wqkv;
  const float *bqkv;
  const uint16_t *wo, *w13, *w2;
  float *kt;
  long khs, kds;
  float *v;
  long vhs;
} layer_table;

/* Layers [0, n) one after another, each exact_layer with its own weights and cache and everything else
 * shared (the same shapes, rotation, positions and mask): a pass's ~30 calls from Python, ~12 us each
 * of argument conversion and checks, become one. The same calls, so the same bits. */
int exact_layers(float *x, int t, long d, float eps, int n, const layer_table *layers, long nqkv, long inter,
                 int nh, int nkv, int hd, float scale, const float *cos, const float *sin, int start,
                 const uint8_t *mask, int causal, void *scratch, int threads) {
  for (int i = 0; i < n; i++) {
    const layer_table *l = &layers[i];
    int status = exact_layer(x, t, d, eps, l->n1, l->n2, l->wqkv, nqkv, l->bqkv, l->wo, l->w13, inter, l->w2, nh, nkv,
                             hd, scale, cos, sin, l->kt, l->khs, l->kds, l->v, l->vhs, start, mask, causal, scratch,
                             threads);
    if (status) return status;
  }
  return 0;
}
