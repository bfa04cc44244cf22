/* Exact float32 attention for every pass: every query row's output is computed by the same sequence
 * of float operations whatever the pass around it (how many rows, how many keys, which keys are masked),
 * so a verify pass of k rows gives each row the bits of the single decode step it stands for.
 *
 * How: a row's score for key j is a dot product accumulated in head-dimension order, one multiply-add
 * per dimension; its softmax sum and its weighted sum of values are accumulated in key order, one key
 * after another. A masked key weighs an exact zero and adds nothing to either sum, so a row that sees
 * keys 0..p (a single step) and the same row in a pass over more keys with the rest masked (a verify
 * pass, a draft tree's siblings between a node's ancestors) round identically. Vector lanes never meet:
 * scores run with lanes over keys (keys stored transposed, head dimension by head dimension), the exp
 * lane by lane, value sums with lanes over head dimensions; a row's result does not depend on which
 * rows are computed beside it, nor which lane holds an element.
 *
 * Lanes over keys and head dimensions keep every lane busy whatever the pass's rows: a decode step has
 * only as many rows as query heads share a kv head (3 for the embedded model), and the first version,
 * lanes over rows, left 13 of 16 idle (a step at 2,400 tokens spent ~6 of 18 ms in attention).
 *
 * exp is our own (Cody-Waite reduction and a degree-6 polynomial, ~2 ulp), so that every lane and every
 * build on one machine computes it the same way. Built once per machine by decoding/kernels/__init__.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exact_vec.h" /* VL lanes: 16 keys when scoring, 16 head dimensions when summing values */

#define RB 16     /* query rows per task */
#define RS 6      /* rows scored and summed together: one key load feeds RS multiply-adds */
#define KT 4      /* key vectors per scoring tile: 64 keys by the head dimension, in L1 across row groups */
#define DV 4      /* value vectors (64 head dimensions) accumulated at once, per row */
#define MAX_HD 256

static inline vf load(const float* p) { vf x; memcpy(&x, p, sizeof x); return x; }
/* x in every lane, as it is: splat(x) is 0 + x (a -0 turns +0), one scalar add more in an inner loop;
 * callers broadcast values that already are what splat would make of them */
static inline vf bcast(float x) {
    vf v = {x};
    return __builtin_shuffle(v, (vi){0});
}
static inline void store(float* p, vf x) { memcpy(p, &x, sizeof x); }
static inline vf load_part(const float* p, int w) { /* w < VL floats, zeros after */
    float tmp[VL] = {0};
    memcpy(tmp, p, (size_t)w * sizeof(float));
    return load(tmp);
}

static inline vf exp_clamped(vf x) {
    /* exp(max(x, -87)) for x <= 0 */
    return exp_reduced(pick(x < splat(-87.0f), splat(-87.0f), x));
}

/* Scores of `rr` rows (queries at qs, hd apart) for `nk` vectors of keys from key j: key j's dimension d at
 * kt[d * kds + j]. Row i's scores go to s + i * ls + j. Each score is its own chain of multiply-adds over
 * d, whatever rr and nk (both constants where inlined, so the accumulators stay in registers). */
static inline __attribute__((always_inline)) void score_rows(int rr, int nk, const float* qs, int hd,
                                                             const float* kt, long kds, int j, float* s,
                                                             long ls) {
    vf acc[RS][KT];
    for (int i = 0; i < rr; i++)
        for (int u = 0; u < nk; u++) acc[i][u] = splat(0.0f);
    for (int d = 0; d < hd; d++) {
        const float* kd = kt + d * kds + j;
        vf key[KT];
        for (int u = 0; u < nk; u++) key[u] = load(kd + u * VL);
        for (int i = 0; i < rr; i++) {
            vf qv = bcast(qs[(long)i * hd + d]); /* qs holds 0 + q: splat's value */
            for (int u = 0; u < nk; u++) acc[i][u] = acc[i][u] + qv * key[u];
        }
    }
    for (int i = 0; i < rr; i++)
        for (int u = 0; u < nk; u++) store(s + i * ls + j + u * VL, acc[i][u]);
}

static void score_group(int rr, int nk, const float* qs, int hd, const float* kt, long kds, int j, float* s,
                        long ls) {
    switch (rr * 8 + nk) { /* every case the same operations per score, unrolled for its sizes */
        case 6 * 8 + KT: score_rows(6, KT, qs, hd, kt, kds, j, s, ls); break;
        case 5 * 8 + KT: score_rows(5, KT, qs, hd, kt, kds, j, s, ls); break;
        case 4 * 8 + KT: score_rows(4, KT, qs, hd, kt, kds, j, s, ls); break;
        case 3 * 8 + KT: score_rows(3, KT, qs, hd, kt, kds, j, s, ls); break;
        case 2 * 8 + KT: score_rows(2, KT, qs, hd, kt, kds, j, s, ls); break;
        case 1 * 8 + KT: score_rows(1, KT, qs, hd, kt, kds, j, s, ls); break;
        default: score_rows(rr, nk, qs, hd, kt, kds, j, s, ls); break;
    }
}

/* Weighted value sums of `rr` rows over keys [0, L): weights w + i * lw + j, value j's dimension d at
 * v[j * hd + d]; dimensions [d0, d0 + nv VL) of row i to o + i * hd (hd - d0 < nv VL: the last vector is
 * partial). With `sums`, each row's softmax sum (its weights added in key order) to sums[i]. */
static inline __attribute__((always_inline)) void value_rows(int rr, int nv, int whole, const float* w, long lw,
                                                             int L, const float* v, int hd, int d0, float* o,
                                                             float* sums) {
    vf acc[RS][DV];
    float sum[RS];
    for (int i = 0; i < rr; i++) {
        sum[i] = 0.0f;
        for (int u = 0; u < nv; u++) acc[i][u] = splat(0.0f);
    }
    int part = whole ? VL : hd - d0 - (nv - 1) * VL; /* lanes of the last vector: VL, or fewer */
    for (int j = 0; j < L; j++) {
        const float* vj = v + (long)j * hd + d0;
        vf val[DV];
        if (whole)
            for (int u = 0; u < nv; u++) val[u] = load(vj + u * VL);
        else
            for (int u = 0; u < nv; u++) val[u] = (u < nv - 1 || part == VL) ? load(vj + u * VL) : load_part(vj + u * VL, part);
        for (int i = 0; i < rr; i++) {
            float e = w[i * lw + j];
            vf ev = bcast(e); /* a weight is never -0: splat's value */
            for (int u = 0; u < nv; u++) acc[i][u] = acc[i][u] + ev * val[u];
            sum[i] = sum[i] + e;
        }
    }
    for (int i = 0; i < rr; i++) {
        for (int u = 0; u < nv; u++) {
            float lanes[VL];
            store(lanes, acc[i][u]);
            int n = u < nv - 1 ? VL : part;
            memcpy(o + (long)i * hd + d0 + u * VL, lanes, (size_t)n * sizeof(float));
        }
        if (sums) sums[i] = sum[i];
    }
}

static void value_group(int rr, int nv, const float* w, long lw, int L, const float* v, int hd, int d0, float* o,
                        float* sums) {
    int whole = hd - d0 >= nv * VL; /* every vector full */
    switch ((rr * 8 + nv) * whole) {
        case 6 * 8 + DV: value_rows(6, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        case 5 * 8 + DV: value_rows(5, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        case 4 * 8 + DV: value_rows(4, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        case 3 * 8 + DV: value_rows(3, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        case 2 * 8 + DV: value_rows(2, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        case 1 * 8 + DV: value_rows(1, DV, 1, w, lw, L, v, hd, d0, o, sums); break;
        default: value_rows(rr, nv, 0, w, lw, L, v, hd, d0, o, sums); break;
    }
}

/* One kv head, query rows [r0, r0 + n) of its R = g T (n <= RB), head dimension hd: row r is query head
 * r / T of the group at the pass's token r % T, at q + (r / T) * qh + (r % T) * qr. Key j's dimension d
 * at kt[d * kds + j], value j at v + j * hd. Row r sees key j where mask[(r % T) * L + j] (mask NULL:
 * every key), or with `causal` where j <= L - T + r % T (a pass over the positions after the cache's
 * first L - T). out: the rows' outputs, (n, hd). s: RB rows of scratch of lp floats (lp: L rounded up to
 * VL), qs: RB hd floats, tail: MAX_HD VL floats. */
static void attend_rows(const float* q, long qh, long qr, int r0, int n, int T, int hd, float scale,
                        const float* kt, long kds, const float* v, const uint8_t* mask, int causal, int L,
                        float* out, float* s, long lp, float* qs, float* tail) {
    int tok[RB], seen_end[RB];
    int last = 0;
    for (int i = 0; i < n; i++) {
        tok[i] = (r0 + i) % T;
        if (tok[i] > last) last = tok[i];
    }
    const long stride = L; /* a mask row's length */
    if (causal) L = L - T + last + 1; /* no row of these reads further */
    for (int i = 0; i < n; i++) {
        seen_end[i] = causal ? L - last + tok[i] : L;
        const float* qi = q + (long)((r0 + i) / T) * qh + (long)tok[i] * qr;
        for (int d = 0; d < hd; d++) {
            float x = qi[d] * scale;
            qs[(long)i * hd + d] = x + 0.0f; /* what splat makes of it: -0 turns +0 */
        }
    }
    /* scores, key tile by key tile; a partial last vector of keys reads a zero-padded copy */
    int full = L / VL * VL;
    for (int j = 0; j < full; j += KT * VL) {
        int nk = (full - j) / VL < KT ? (full - j) / VL : KT;
        for (int i = 0; i < n; i += RS)
            score_group(n - i < RS ? n - i : RS, nk, qs + (long)i * hd, hd, kt, kds, j, s + i * lp, lp);
    }
    if (full < L) {
        for (int d = 0; d < hd; d++) {
            memset(tail + d * VL, 0, VL * sizeof(float));
            memcpy(tail + d * VL, kt + d * kds + full, (size_t)(L - full) * sizeof(float));
        }
        for (int i = 0; i < n; i += RS) {
            float* si = s + i * lp + full;
            score_group(n - i < RS ? n - i : RS, 1, qs + (long)i * hd, hd, tail, VL, 0, si, lp);
        }
    }
    /* per row: unseen keys score -inf, the maximum (exact in any order), the weights exp(s - max), an
     * unseen key's exactly 0 */
    const vf ninf = splat(-INFINITY);
    int lv = (L + VL - 1) / VL * VL;
    for (int i = 0; i < n; i++) {
        float* si = s + i * lp;
        if (mask) {
            const uint8_t* mi = mask + (long)tok[i] * stride;
            for (int j = 0; j < L; j++)
                if (!mi[j]) si[j] = -INFINITY;
        }
        for (int j = seen_end[i]; j < lv; j++) si[j] = -INFINITY;
        vf m = ninf, m1 = ninf, m2 = ninf, m3 = ninf; /* four running maxima: no chain of compares */
        int j = 0;
        for (; j + 4 * VL <= lv; j += 4 * VL) {
            vf x0 = load(si + j), x1 = load(si + j + VL), x2 = load(si + j + 2 * VL), x3 = load(si + j + 3 * VL);
            m = pick(x0 > m, x0, m);
            m1 = pick(x1 > m1, x1, m1);
            m2 = pick(x2 > m2, x2, m2);
            m3 = pick(x3 > m3, x3, m3);
        }
        for (; j < lv; j += VL) {
            vf x = load(si + j);
            m = pick(x > m, x, m);
        }
        m = pick(m1 > m, m1, m);
        m2 = pick(m3 > m2, m3, m2);
        m = pick(m2 > m, m2, m);
        float mx = -INFINITY;
        for (int l = 0; l < VL; l++) mx = m[l] > mx ? m[l] : mx;
        vf mv = splat(mx);
        for (int j = 0; j < lv; j += VL) {
            vf x = load(si + j);
            store(si + j, pick(x == ninf, splat(0.0f), exp_clamped(x - mv)));
        }
    }
    /* weighted sums of values and the softmax sums, in key order */
    float sums[RB];
    for (int i = 0; i < n; i += RS) {
        int rr = n - i < RS ? n - i : RS;
        for (int d0 = 0; d0 < hd; d0 += DV * VL) {
            int nv = (hd - d0 + VL - 1) / VL < DV ? (hd - d0 + VL - 1) / VL : DV;
            value_group(rr, nv, s + i * lp, lp, L, v, hd, d0, out + (long)i * hd, d0 == 0 ? sums + i : NULL);
        }
    }
    for (int i = 0; i < n; i++) /* a row whose mask hides every key is zeros, as torch's attention gives */
        for (int d = 0; d < hd; d++) out[(long)i * hd + d] = sums[i] == 0.0f ? 0.0f : out[(long)i * hd + d] / sums[i];
}

/* q: query heads nh = nkv g, each (T, hd) float32, head h at q + h * qh, its row t at + t * qr; kt: float32
 * keys stored transposed, kv head h's key j dimension d at kt + h * khs + d * kds + j; v: float32 values,
 * kv head h's value j at v + h * vhs + j * hd; mask: (T, L) bytes 0/1, or NULL: every key, or with
 * `causal` the keys up to each row's own position (L - T + its token). out: (nh, T, hd). Tasks (a kv
 * head's g T rows, RB at a time) run on up to `threads` threads; a row's result does not depend on which.
 * Returns 0, -1 when hd is too large, or 1 when memory runs out. */
int attend(const float* q, long qh, long qr, int nkv, int g, int T, int hd, float scale, const float* kt,
           long khs, long kds, const float* v, long vhs, const uint8_t* mask, int causal, int L, float* out,
           int threads) {
    if (hd > MAX_HD) return -1;
    int R = g * T;
    int chunks = (R + RB - 1) / RB;
    int tasks = nkv * chunks;
    long lp = (L + VL - 1) / VL * VL;
    if (lp == 0) lp = VL;
    int failed = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : failed) num_threads(threads > 0 ? threads : 1)
    for (int t = 0; t < tasks; t++) {
        int h = t / chunks, r0 = (t % chunks) * RB;
        int n = R - r0 < RB ? R - r0 : RB;
        size_t floats = (size_t)RB * lp + (size_t)RB * MAX_HD + (size_t)MAX_HD * VL;
        float* s = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!s) { failed = 1; continue; }
        attend_rows(q + (long)h * g * qh, qh, qr, r0, n, T, hd, scale, kt + h * khs, kds, v + h * vhs, mask,
                    causal, L, out + ((long)h * R + r0) * hd, s, lp, s + RB * lp, s + RB * lp + RB * MAX_HD);
        free(s);
    }
    return failed ? 1 : 0;
}

/* ---- a whole attention step from the q, k, v projection: rotation, cache write, attention, bf16 out ---- */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch's .to(torch.bfloat16) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x (hd) rotated by cos c and sin s (hd each) in the half-split layout: y = x c + rot(x) s, rot(x) =
 * (-x[hd/2:], x[:hd/2]), each product and the sum rounded on its own, as torch's three elementwise
 * ops round them (no fused multiply-add here) */
__attribute__((optimize("fp-contract=off"))) static void rotate(const float* x, const float* c, const float* s,
                                                               int hd, float* y, long ys) {
    int half = hd / 2;
    for (int d = 0; d < hd; d++) {
        float r = d < half ? -x[d + half] : x[d - half];
        float a = x[d] * c[d];
        float b = r * s[d];
        y[(long)d * ys] = a + b;
    }
}

/* qkv: T rows of (nh + 2 nkv) hd values, bf16 (`bf16`) or float32: the query heads, then the key heads,
 * then the value heads, each hd wide. cos, sin: (T, hd) float32, each row's rotation. The keys, rotated,
 * and the values go to the cache at positions [start, start + T): key j of kv head h dimension d at
 * kt + h khs + d kds + j (transposed), value j at v + h vhs + j hd. Then every row attends (`attend`:
 * over [0, start + T), with `mask` (T, start + T) or `causal`), and out gets (T, nh hd) bf16, as the
 * output projection reads it; scores are scaled by `scale`. scratch: 2 nh T hd floats. Returns attend's
 * status. */
int attend_qkv(const void* qkv, int bf16, int T, int nh, int nkv, int hd, float scale, const float* cos,
               const float* sin, float* kt, long khs, long kds, float* v, long vhs, int start,
               const uint8_t* mask, int causal, uint16_t* out, float* scratch, int threads) {
    if (hd > MAX_HD) return -1;
    const int heads = nh + 2 * nkv;
    float* q = scratch;                  /* (nh, T, hd) rotated queries */
    float* y = scratch + (long)nh * T * hd; /* (nh, T, hd) attention output */
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (T >= 64)
    for (int t = 0; t < T; t++) {
        float x[MAX_HD];
        for (int h = 0; h < heads; h++) {
            long at = ((long)t * heads + h) * hd;
            for (int d = 0; d < hd; d++)
                x[d] = bf16 ? bf16_to_f32(((const uint16_t*)qkv)[at + d]) : ((const float*)qkv)[at + d];
            const float* c = cos + (long)t * hd;
            const float* s = sin + (long)t * hd;
            if (h < nh) {
                rotate(x, c, s, hd, q + ((long)h * T + t) * hd, 1);
            } else if (h < nh + nkv) {
                rotate(x, c, s, hd, kt + (long)(h - nh) * khs + start + t, kds);
            } else {
                memcpy(v + (long)(h - nh - nkv) * vhs + (long)(start + t) * hd, x, (size_t)hd * sizeof(float));
            }
        }
    }
    int status = attend(q, (long)T * hd, hd, nkv, nh / nkv, T, hd, scale, kt, khs, kds, v, vhs,
                        mask, causal, start + T, y, threads);
    if (status != 0) return status;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (T >= 64)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int d = 0; d < hd; d++)
                out[((long)t * nh + h) * hd + d] = f32_to_bf16(y[((long)h * T + t) * hd + d]);
    return 0;
}
