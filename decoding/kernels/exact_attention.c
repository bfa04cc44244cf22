/* Exact float32 attention for every pass: every query row's output is computed by the same sequence
 * of float operations whatever the pass around it (how many rows, how many keys, which keys are masked),
 * so a verify pass of k rows gives each row the bits of the single decode step it stands for.
 *
 * How: vector lanes are query rows, never keys or head dimensions. A row's score for key j is a dot
 * product accumulated in head-dimension order; its softmax sum and its weighted sum of values are
 * accumulated in key order, one key after another. A masked key adds an exact zero to both, which
 * leaves a float sum unchanged, so a row that sees keys 0..p (a single step) and the same row in a pass
 * over more keys with the rest masked (a verify pass, a draft tree's siblings) round identically. No
 * operation mixes lanes, so neither the lane a row lands in nor the rows beside it matter.
 *
 * exp is our own (Cody-Waite reduction and a degree-6 polynomial, ~2 ulp), so that every lane and every
 * build on one machine computes it the same way. Built once per machine by decoding/kernels/__init__.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define RB 16     /* query rows per vector */
#define KU 8      /* keys scored at once (independent accumulators) */
#define DB 64     /* head dimensions accumulated at once in the value sum: a whole head of 64, so the values
                     stream once a pass (8 at a time streamed them 8 times: a step at 2,400 tokens took
                     21.2 ms against 18.3) */
#define MAX_HD 256

typedef float vf __attribute__((vector_size(RB * 4)));
typedef int32_t vi __attribute__((vector_size(RB * 4)));

static inline vf splat(float x) { return (vf){0} + x; }
static inline vf pick(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

static inline vf exp_clamped(vf x) {
    /* exp(max(x, -87)) for x <= 0 */
    x = pick(x < splat(-87.0f), splat(-87.0f), x);
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

/* One kv head, query rows [r0, r0 + n) of its R = g T (n <= RB), head dimension hd: row r is query head
 * r / T of the group at the pass's token r % T, at q + (r / T) * qh + (r % T) * qt_ (scaled by `scale`
 * here); key and value j at k + j * hd and v + j * hd; row r sees key j where mask[(r % T) * L + j]
 * (mask NULL: every key), or with `causal` where j <= L - T + r % T (a pass over the positions after the
 * cache's first L - T). out: the rows' outputs, RB-row chunk first, (n, hd). s: L vectors of scratch. */
static void attend_rows(const float* q, long qh, long qr, int r0, int n, int T, int hd, float scale,
                        const float* k, const float* v, const uint8_t* mask, int causal, int L, float* out,
                        vf* s) {
    const long ks = hd;
    int tok[RB];
    int first = T, last = 0; /* the rows' tokens */
    for (int r = 0; r < RB; r++) {
        tok[r] = (r0 + (r < n ? r : 0)) % T;
        if (tok[r] < first) first = tok[r];
        if (tok[r] > last) last = tok[r];
    }
    const long stride = L; /* a mask row's length */
    if (causal) L = L - T + last + 1; /* no row of these reads further */
    vf qt[MAX_HD];
    for (int d = 0; d < hd; d++)
        for (int r = 0; r < RB; r++)
            qt[d][r] = r < n ? q[(long)((r0 + r) / T) * qh + (long)((r0 + r) % T) * qr + d] * scale : 0.0f;
    /* scores, each a dot product in head-dimension order */
    int j = 0;
    for (; j + KU <= L; j += KU) {
        vf acc[KU];
        for (int u = 0; u < KU; u++) acc[u] = splat(0.0f);
        for (int d = 0; d < hd; d++)
            for (int u = 0; u < KU; u++) acc[u] = acc[u] + qt[d] * k[(long)(j + u) * ks + d];
        for (int u = 0; u < KU; u++) s[j + u] = acc[u];
    }
    for (; j < L; j++) {
        vf acc = splat(0.0f);
        for (int d = 0; d < hd; d++) acc = acc + qt[d] * k[(long)j * ks + d];
        s[j] = acc;
    }
    /* masked keys (and padding lanes) score -inf; the maximum is exact in any order */
    const vf ninf = splat(-INFINITY);
    if (mask) {
        for (j = 0; j < L; j++) {
            vi seen;
            for (int r = 0; r < RB; r++) seen[r] = r < n && mask[(long)tok[r] * stride + j] ? -1 : 0;
            s[j] = pick(seen, s[j], ninf);
        }
    } else if (causal) {
        int start = L - 1 - last; /* row token t reads keys [0, start + t] */
        for (j = start + first + 1; j < L; j++) {
            vi seen;
            for (int r = 0; r < RB; r++) seen[r] = r < n && j <= start + tok[r] ? -1 : 0;
            s[j] = pick(seen, s[j], ninf);
        }
    }
    vf m = ninf;
    for (j = 0; j < L; j++) m = pick(s[j] > m, s[j], m);
    /* weights and their sum, in key order; a masked key weighs exactly 0 */
    vf sum = splat(0.0f);
    for (j = 0; j < L; j++) {
        vi dead = s[j] == ninf;
        vf e = pick(dead, splat(0.0f), exp_clamped(s[j] - m));
        s[j] = e;
        sum = sum + e;
    }
    /* the weighted sum of values, in key order for every head dimension */
    for (int d0 = 0; d0 < hd; d0 += DB) {
        int w = hd - d0 < DB ? hd - d0 : DB;
        vf o[DB];
        for (int i = 0; i < DB; i++) o[i] = splat(0.0f);
        if (w == DB) {
            for (j = 0; j < L; j++) {
                const float* vj = v + (long)j * ks + d0;
                for (int i = 0; i < DB; i++) o[i] = o[i] + s[j] * vj[i];
            }
        } else {
            for (j = 0; j < L; j++) {
                const float* vj = v + (long)j * ks + d0;
                for (int i = 0; i < w; i++) o[i] = o[i] + s[j] * vj[i];
            }
        }
        for (int r = 0; r < n; r++)
            for (int i = 0; i < w; i++) out[(long)r * hd + d0 + i] = o[i][r] / sum[r];
    }
}

/* q: query heads nh = nkv g, each (T, hd) float32, head h at q + h * qh, its row t at + t * qr; k, v:
 * float32 caches, kv head h's key j at k + h * hs + j * hd; mask: (T, L) bytes 0/1, or NULL: every key,
 * or with `causal` the keys up to each row's own position (L - T + its token).
 * out: (nh, T, hd). Tasks (a kv head's g T rows, RB at a time) run on up to `threads` threads; a row's
 * result does not depend on which. Returns 0, or -1 when hd is too large or memory runs out. */
int attend(const float* q, long qh, long qr, int nkv, int g, int T, int hd, float scale, const float* k,
           const float* v, long hs, const uint8_t* mask, int causal, int L, float* out, int threads) {
    if (hd > MAX_HD) return -1;
    int R = g * T;
    int chunks = (R + RB - 1) / RB;
    int tasks = nkv * chunks;
    int failed = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : failed) num_threads(threads > 0 ? threads : 1)
    for (int t = 0; t < tasks; t++) {
        int h = t / chunks, r0 = (t % chunks) * RB;
        int n = R - r0 < RB ? R - r0 : RB;
        vf* s = aligned_alloc(sizeof(vf), sizeof(vf) * (size_t)(L > 0 ? L : 1));
        if (!s) { failed = 1; continue; }
        attend_rows(q + (long)h * g * qh, qh, qr, r0, n, T, hd, scale, k + h * hs, v + h * hs, mask, causal, L,
                    out + ((long)h * R + r0) * hd, s);
        free(s);
    }
    return failed ? -1 : 0;
}
