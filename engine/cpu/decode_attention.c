/* The CPU decode round's attention, one row (lane, position) at a time, every floating-point sum
 * in an order written here (engine/cpu/decode_attention.py builds it with -ffp-contract=off, no -ffast-math,
 * and both decode rounds, Python and C++, call this one compiled function).
 *
 * A row attends over its own lane's keys [0, pos]: keys past pos weigh exactly zero in the
 * span-masked attention of engine.cpu.packed.decode_attention_buckets, so they are skipped, and a
 * row's arithmetic depends on its own lane's cache and its position only, never on other rows.
 * Rounding steps as that path's (bf16): scores rounded to bf16, softmax in float32, probabilities
 * rounded to bf16, P@V accumulated in float32 and rounded to bf16 once; float32 keeps all in fp32.
 * Vectors are GCC/Clang vector extensions of 16 floats: QK has 16 partial sums over d (lane j
 * takes d = j mod 16, chunks in order), then a fixed halving tree; PV is a sequential sum over
 * keys for each output element (vectorized over d, no reassociation); exp is a polynomial
 * written here (Cephes' expf), so no libm version or vector width changes a bit. */
#include "vec.h"

#define MAX_DC 8      /* head_dim / W: 1, 2, 4 or 8 (head_dim 16, 32, 64 or 128) */
#define MAX_REP 8     /* query heads a KV head: 1, 2, 4 or 8 */
#define UNROLL _Pragma("GCC unroll 16") /* register-resident vectors (no effect on the order) */

/* 8 lanes summed: halves added pairwise, 8 -> 4 -> 2 -> 1 */
static inline float hsum8(v8 a) {
  v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

/* the 16 lanes summed: halves added pairwise, 16 -> 8 -> 4 -> 2 -> 1 */
static inline float hsum(v16 v) {
  return hsum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* 16 vectors of 16 partial sums -> one vector of their 16 sums, each summed by hsum's tree
 * (lanes j + j+8, then j + j+4, j + j+2, j + j+1), in lane bitrev(slot): four levels of shuffles
 * that each add two halves of two vectors, 15 adds a key where hsum took 4 plus shuffles */
#define SH(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
static inline v16 reduce16(const v16 *a) {
  v16 z[8], w[4], u[2];
  for (int k = 0; k < 8; ++k)
    z[k] = SH(a[2 * k], a[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SH(a[2 * k], a[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int k = 0; k < 4; ++k)
    w[k] = SH(z[2 * k], z[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           SH(z[2 * k], z[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int k = 0; k < 2; ++k)
    u[k] = SH(w[2 * k], w[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           SH(w[2 * k], w[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return SH(u[0], u[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
         SH(u[0], u[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}
static const int BITREV[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* exp(x) for x <= 0 (scores minus their max), Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2,
 * a degree-7 polynomial in r, times 2^n by the exponent bits; exactly 0 at or below -86 (-inf
 * too: its NaN lanes are masked off) */
static inline v16 exp16(v16 x) {
  const v16 magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
  v16 t = x * splat(1.44269504088896341f) + magic;
  v16 n = t - magic;
  v16 r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  v16 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.0f);
  u16v nu, pu;
  memcpy(&nu, &t, sizeof nu);
  memcpy(&pu, &p, sizeof pu);
  nu = (nu - 0x4b400000u) << 23; /* n, from t's low mantissa bits, into the exponent field */
  pu = (pu + nu) & (u16v)(x > splat(-86.0f));
  memcpy(&p, &pu, sizeof p);
  return p;
}

/* 16 keys' scores: rounded to bf16 first where the cache is bf16 (as the bucketed path rounds), scaled */
static inline __attribute__((always_inline)) void store_scores(float *dst, v16 x, int bf16, float scale) {
  if (bf16) {
    u16v u = round16(x);
    memcpy(&x, &u, sizeof x);
  }
  x = x * splat(scale);
  memcpy(dst, &x, sizeof x);
}

/* one row, one KV head: scores of its `rep` query heads over keys [0, n), softmax, P@V
 * (always inlined, so each (dc, rep) below gets loops of constant trip counts, unrolled, its
 * vectors in registers). Without AVX-512 a 16-float vector has no register of its own, and GCC
 * moves arrays of them through the stack and general registers (the AVX2 build took 3x the
 * AVX-512 build's time on the same float32 cache), so there the scores and P@V take one query
 * head at a time in halves of 8 floats, at most PV_DC chunks of accumulators live: every sum is
 * the same sum in the same order, so both builds give the same bits. */
#define PV_DC 4
static inline __attribute__((always_inline)) void head_group(const char *kc, const char *vc, int64_t pos_bytes, const char *q, int64_t q_head_bytes,
                       char *out, int64_t n, int64_t rep, int64_t dc, float scale, int bf16, float *s, int64_t cap) {
  int64_t es = bf16 ? 2 : 4, d = dc * W;
#ifdef __AVX512F__
  v16 qv[MAX_REP][MAX_DC];
  UNROLL for (int64_t h = 0; h < rep; ++h)
    UNROLL for (int64_t c = 0; c < dc; ++c) qv[h][c] = load16(q + h * q_head_bytes + c * W * es, bf16);
  for (int64_t t0 = 0; t0 < n; t0 += W) { /* scores, 16 keys at a time: 16 partial sums over d each */
    int64_t m = n - t0 < W ? n - t0 : W;   /* (keys past n: no read, their scores are overwritten) */
    for (int64_t h = 0; h < rep; ++h) {
      v16 a[W];
      for (int j = 0; j < W; ++j) {
        v16 acc = splat(0.0f);
        if (j < m) {
          const char *k = kc + (t0 + j) * pos_bytes;
          acc = qv[h][0] * load16(k, bf16);
          UNROLL for (int64_t c = 1; c < dc; ++c) acc = acc + qv[h][c] * load16(k + c * W * es, bf16);
        }
        a[BITREV[j]] = acc;
      }
      store_scores(s + h * cap + t0, reduce16(a), bf16, scale);
    }
  }
#else
  for (int64_t h = 0; h < rep; ++h) { /* scores, 16 keys at a time: each key's 16 partial sums, hsum's tree */
    v8 ql[MAX_DC], qu[MAX_DC]; /* lanes 0-7 and 8-15 of each 16-float chunk of the query */
    UNROLL for (int64_t c = 0; c < dc; ++c) {
      ql[c] = load8(q + h * q_head_bytes + c * W * es, bf16);
      qu[c] = load8(q + h * q_head_bytes + (c * W + 8) * es, bf16);
    }
    for (int64_t t0 = 0; t0 < n; t0 += W) {
      int64_t m = n - t0 < W ? n - t0 : W; /* (keys past n: no read, their scores are overwritten) */
      float sc[W] = {0};
      for (int j = 0; j < m; ++j) {
        const char *k = kc + (t0 + j) * pos_bytes;
        v8 al = ql[0] * load8(k, bf16), au = qu[0] * load8(k + 8 * es, bf16);
        UNROLL for (int64_t c = 1; c < dc; ++c) {
          al = al + ql[c] * load8(k + c * W * es, bf16);
          au = au + qu[c] * load8(k + (c * W + 8) * es, bf16);
        }
        sc[j] = hsum8(al + au); /* lanes j + j+8 first, as hsum and reduce16 add them */
      }
      v16 x;
      memcpy(&x, sc, sizeof x);
      store_scores(s + h * cap + t0, x, bf16, scale);
    }
  }
#endif
  int64_t np = (n + W - 1) / W * W;
  for (int64_t h = 0; h < rep; ++h) { /* softmax in float32; padding keys weigh exactly 0 */
    float *sh = s + h * cap, m = sh[0];
    for (int64_t t = 1; t < n; ++t) m = sh[t] > m ? sh[t] : m;
    for (int64_t t = n; t < np; ++t) sh[t] = -__builtin_inff(); /* exp16 gives exactly 0 */
    v16 sum = splat(0.0f);
    for (int64_t t = 0; t < np; t += W) {
      v16 e;
      memcpy(&e, sh + t, sizeof e);
      e = exp16(e - splat(m));
      memcpy(sh + t, &e, sizeof e);
      sum = sum + e;
    }
    v16 total = splat(hsum(sum));
    for (int64_t t = 0; t < np; t += W) {
      v16 e;
      memcpy(&e, sh + t, sizeof e);
      e = e / total;
      if (bf16) {
        u16v u = round16(e);
        memcpy(&e, &u, sizeof e);
      }
      memcpy(sh + t, &e, sizeof e);
    }
  }
#ifdef __AVX512F__
  v16 acc[MAX_REP][MAX_DC];
  UNROLL for (int64_t h = 0; h < rep; ++h)
    UNROLL for (int64_t c = 0; c < dc; ++c) acc[h][c] = splat(0.0f);
  for (int64_t t = 0; t < n; ++t) { /* P@V: each output element a sequential sum over keys */
    v16 vv[MAX_DC];
    UNROLL for (int64_t c = 0; c < dc; ++c) vv[c] = load16(vc + t * pos_bytes + c * W * es, bf16);
    UNROLL for (int64_t h = 0; h < rep; ++h) {
      v16 p = splat(s[h * cap + t]);
      UNROLL for (int64_t c = 0; c < dc; ++c) acc[h][c] = acc[h][c] + p * vv[c];
    }
  }
  UNROLL for (int64_t h = 0; h < rep; ++h)
    UNROLL for (int64_t c = 0; c < dc; ++c) {
      char *o = out + (h * d + c * W) * es;
      if (bf16) {
        h16v b = __builtin_convertvector(round16(acc[h][c]) >> 16, h16v);
        memcpy(o, &b, sizeof b);
      } else {
        memcpy(o, &acc[h][c], sizeof acc[h][c]);
      }
    }
#else
  for (int64_t h = 0; h < rep; ++h) /* P@V: each output element a sequential sum over keys */
    for (int64_t c0 = 0; c0 < dc; c0 += PV_DC) {
      int64_t cn = dc - c0 < PV_DC ? dc - c0 : PV_DC;
      const float *sh = s + h * cap;
      v8 al[PV_DC], au[PV_DC];
      UNROLL for (int64_t c = 0; c < cn; ++c) al[c] = au[c] = splat8(0.0f);
      for (int64_t t = 0; t < n; ++t) {
        v8 p = splat8(sh[t]);
        const char *v = vc + t * pos_bytes + c0 * W * es;
        UNROLL for (int64_t c = 0; c < cn; ++c) {
          al[c] = al[c] + p * load8(v + c * W * es, bf16);
          au[c] = au[c] + p * load8(v + (c * W + 8) * es, bf16);
        }
      }
      UNROLL for (int64_t c = 0; c < cn; ++c) {
        v16 acc;
        memcpy(&acc, &al[c], sizeof al[c]);
        memcpy((char *)&acc + sizeof al[c], &au[c], sizeof au[c]);
        char *o = out + (h * d + (c0 + c) * W) * es;
        if (bf16) {
          h16v b = __builtin_convertvector(round16(acc) >> 16, h16v);
          memcpy(o, &b, sizeof b);
        } else {
          memcpy(o, &acc, sizeof acc);
        }
      }
    }
#endif
}

/* q [rows, H, d] (strides in elements, d contiguous); caches [lanes, positions, KVH, d] of one
 * layer; out [rows, H*d] contiguous; a row of lane `spare` (padding) gets zeros. Returns 0, or
 * -1 for a shape this kernel does not take (head_dim other than 16, 32, 64 or 128, query heads a KV
 * head other than 1, 2, 4 or 8) or a failed allocation. */
int tfe_decode_attention(const void *kcache, const void *vcache, int64_t lane_stride, int64_t pos_stride,
                         const void *q, int64_t q_row_stride, int64_t q_head_stride, void *out,
                         const int64_t *lanes, const int64_t *positions, int64_t rows, int64_t spare,
                         int64_t n_heads, int64_t kv_heads, int64_t head_dim, float scale, int32_t bf16) {
  int64_t es = bf16 ? 2 : 4, rep = n_heads / kv_heads, dc = head_dim / W, cap = 0;
  if (head_dim % W || !(dc == 1 || dc == 2 || dc == 4 || dc == 8) || !(rep == 1 || rep == 2 || rep == 4 || rep == 8) ||
      rep * kv_heads != n_heads)
    return -1;
  for (int64_t r = 0; r < rows; ++r)
    if (lanes[r] != spare && positions[r] + 1 > cap) cap = positions[r] + 1;
  cap = (cap + W - 1) / W * W;
  float *s = malloc(sizeof(float) * (size_t)(rep * cap + W));
  if (!s) return -1;
  for (int64_t r = 0; r < rows; ++r) {
    char *o = (char *)out + r * n_heads * head_dim * es;
    if (lanes[r] == spare) {
      memset(o, 0, (size_t)(n_heads * head_dim * es));
      continue;
    }
    const char *kl = (const char *)kcache + lanes[r] * lane_stride * es;
    const char *vl = (const char *)vcache + lanes[r] * lane_stride * es;
    const char *qr = (const char *)q + r * q_row_stride * es;
    for (int64_t g = 0; g < kv_heads; ++g) {
      const char *kg = kl + g * head_dim * es, *vg = vl + g * head_dim * es, *qg = qr + g * rep * q_head_stride * es;
      char *og = o + g * rep * head_dim * es;
      int64_t n = positions[r] + 1, pb = pos_stride * es, qb = q_head_stride * es;
#define GROUP(DC, REP) head_group(kg, vg, pb, qg, qb, og, n, REP, DC, scale, bf16, s, cap)
#define REPS(DC) (rep == 1 ? GROUP(DC, 1) : rep == 2 ? GROUP(DC, 2) : rep == 4 ? GROUP(DC, 4) : GROUP(DC, 8))
      (void)(dc == 1 ? REPS(1) : dc == 2 ? REPS(2) : dc == 4 ? REPS(4) : REPS(8));
#undef REPS
#undef GROUP
    }
  }
  free(s);
  return 0;
}
