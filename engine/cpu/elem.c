/* The C++ decode round's RMSNorms (engine/cpu/round.cpp), with the bits of the ATen ops they stand
 * for: every op rounds once, float32 inside and the model's dtype (bf16 or float32) after each
 * `.to` and each bf16 mul or add, as ATen's CPU kernels do (a bf16 binary op widens both sides,
 * operates in float32, rounds to nearest even). The mean of squares is ATen's float sum in ATen's
 * order (mean_sq below), at the vector width a start-up check found ATen to use here
 * (engine.cpu.decode_attention.AttentionKernel.sum_width; 0: the caller passes ATen's means). Built into the
 * C attention's library (engine/cpu/decode_attention.py: -ffp-contract=off, no -ffast-math, so no product is
 * fused into a sum). Each function returns 0, or -1 for a shape it does not take (then the round
 * calls ATen). */
#include "vec.h"

#define MAX_DC 16 /* head_dim / W up to 16 */

/* x rounded to the model's dtype, kept as float32 (bf16: the low half zero) */
static inline v16 to_t(v16 x, int bf16) {
  if (!bf16) return x;
  u16v u = round16(x);
  memcpy(&x, &u, sizeof x);
  return x;
}

/* 16 values of the model's dtype at p, from x already rounded to it */
static inline void store16(void *p, v16 x, int bf16) {
  if (!bf16) {
    memcpy(p, &x, sizeof x);
    return;
  }
  u16v u;
  memcpy(&u, &x, sizeof u);
  h16v h = __builtin_convertvector(u >> 16, h16v);
  memcpy(p, &h, sizeof h);
}

/* `f.pow(2).mean(-1)` of one row of n floats as ATen computes it (SumKernel.cpp's cascade_sum on
 * a contiguous row): vectors of vw lanes taken 4 at a time into 4 accumulators, which move up 4
 * levels every 2^lp vectors; then the vectors left, the 4 accumulators in order, the scalars
 * past the last whole vector, and the vw lanes one by one; divided by n. */
static float mean_sq(const float *f, int64_t n, int vw) {
  float acc[4][4][16] = {{{0}}};
  int64_t nv = n / vw, size = nv / 4, i = 0, lp = 0;
  while ((1LL << lp) < size) ++lp; /* ceil(log2(size)) */
  lp = lp / 4 > 4 ? lp / 4 : 4;
  int64_t step = 1LL << lp, mask = step - 1;
#define ADD_VEC(dst, v) for (int l = 0; l < vw; ++l) (dst)[l] += f[(v) * vw + l] * f[(v) * vw + l]
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int k = 0; k < 4; ++k) ADD_VEC(acc[0][k], i * 4 + k);
    for (int j = 1; j < 4; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < vw; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0.0f;
      if (i & (mask << (j * lp))) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k) ADD_VEC(acc[0][k], i * 4 + k);
  for (int j = 1; j < 4; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < vw; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = size * 4; v < nv; ++v) ADD_VEC(acc[0][0], v);
#undef ADD_VEC
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < vw; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0.0f;
  for (int64_t e = nv * vw; e < n; ++e) total += f[e] * f[e];
  for (int l = 0; l < vw; ++l) total += acc[0][0][l];
  return total / (float)n;
}

/* One row of n (n a multiple of 16) widened from the model's dtype into f */
static inline void widen(const char *x, float *f, int64_t n, int bf16) {
  int64_t es = bf16 ? 2 : 4;
  for (int64_t c = 0; c < n; c += W) {
    v16 v = load16(x + c * es, bf16);
    memcpy(f + c, &v, sizeof v);
  }
}

/* engine.models.qwen3.RMSNorm.forward after the mean: y = w * (f * rsqrt(ms + eps)).to(T) (rsqrt:
 * 1 / sqrt, as ATen's, both correctly rounded); y: n floats, each rounded to T */
static inline void norm_row(const float *f, float ms, const char *w, float *y, int64_t n, float eps, int bf16) {
  /* (y may be f: element c of y needs element c of f only) */
  int64_t es = bf16 ? 2 : 4;
  v16 r = splat(1.0f / __builtin_sqrtf(ms + eps));
  for (int64_t c = 0; c < n; c += W) {
    v16 x = to_t(load16(f + c, 0) * r, bf16);
    x = to_t(load16(w + c * es, bf16) * x, bf16);
    memcpy(y + c, &x, sizeof x);
  }
}

/* Rows of n in the model's dtype: out = RMSNorm(x) with weight w [n]. With y (and vw): first
 * x + y, rounded to T, into sum (the residual add before the norm). ms: ATen's means (vw 0), or
 * NULL (vw 8 or 16: mean_sq). */
int tfe_norm_rows(const void *x, const void *y, void *sum, const float *ms, const void *w, void *out, int64_t rows,
                  int64_t n, float eps, int32_t bf16, int32_t vw) {
  int64_t es = bf16 ? 2 : 4;
  if (n % W || (!ms && vw != 8 && vw != 16) || (y && ms)) return -1;
  float *f = malloc(sizeof(float) * (size_t)n); /* one row: its sum, then its norm in place */
  if (!f) return -1;
  for (int64_t r = 0; r < rows; ++r) {
    const char *xr = (const char *)x + r * n * es;
    for (int64_t c = 0; c < n; c += W) {
      v16 v = load16(xr + c * es, bf16);
      if (y) {
        v = to_t(v + load16((const char *)y + (r * n + c) * es, bf16), bf16);
        store16((char *)sum + (r * n + c) * es, v, bf16);
      }
      memcpy(f + c, &v, sizeof v);
    }
    norm_row(f, ms ? ms[r] : mean_sq(f, n, vw), (const char *)w, f, n, eps, bf16);
    for (int64_t c = 0; c < n; c += W) store16((char *)out + (r * n + c) * es, load16(f + c, 0), bf16);
  }
  free(f);
  return 0;
}

/* PackedLinears.heads' q and k: each of a row's nh heads of d (row r at qk + r * stride elements)
 * normed by its own weight row (w [nh, d]) and rotated as engine.models.qwen3.rotate's ATen ops round
 * it: a = x * cos, b = rot * sin, out = a + b, each rounded to T (rot: the two halves swapped, the
 * first negated, exactly). ms [rows, nh] (ATen's) or NULL (mean_sq at vw); cos and sin [rows, d]
 * and out [rows, nh, d] in T. */
int tfe_heads(const void *qk, int64_t stride, const float *ms, const void *w, const void *cos, const void *sin,
              void *out, int64_t rows, int64_t nh, int64_t d, float eps, int32_t bf16, int32_t vw) {
  int64_t es = bf16 ? 2 : 4, dc = d / W, hc = dc / 2;
  float f[MAX_DC * W], y[MAX_DC * W];
  if (d % (2 * W) || dc > MAX_DC || (!ms && vw != 8 && vw != 16)) return -1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nh; ++j) {
      widen((const char *)qk + (r * stride + j * d) * es, f, d, bf16);
      norm_row(f, ms ? ms[r * nh + j] : mean_sq(f, d, vw), (const char *)w + j * d * es, y, d, eps, bf16);
      for (int64_t c = 0; c < dc; ++c) {
        v16 x = load16(y + c * W, 0);
        v16 rot = c < hc ? -load16(y + (c + hc) * W, 0) : load16(y + (c - hc) * W, 0);
        v16 a = to_t(x * load16((const char *)cos + (r * d + c * W) * es, bf16), bf16);
        v16 b = to_t(rot * load16((const char *)sin + (r * d + c * W) * es, bf16), bf16);
        store16((char *)out + ((r * nh + j) * d + c * W) * es, to_t(a + b, bf16), bf16);
      }
    }
  return 0;
}

/* The means of squares of rows of n floats at width vw, for the start-up check against ATen */
int tfe_mean_sq_rows(const float *f, int64_t rows, int64_t n, int32_t vw, float *out) {
  if (vw != 8 && vw != 16) return -1;
  for (int64_t r = 0; r < rows; ++r) out[r] = mean_sq(f + r * n, n, vw);
  return 0;
}

/* argmax(-1) of each row of lane != spare (padding rows: 0), as ATen's: the first maximum, a NaN
 * above every number (the first NaN). The maximum over vectors, then the first index holding it
 * (ATen's argmax of the logits widened to float32 took 65-130 us a round on real logits). */
typedef int32_t i16v __attribute__((vector_size(64)));

static inline float at_(const char *x, int64_t i, int bf16) { /* element i, widened */
  float v;
  if (!bf16) return ((const float *)x)[i];
  uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
  memcpy(&v, &u, sizeof v);
  return v;
}

static int64_t first_max(const char *x, int64_t n, int bf16) {
  int64_t es = bf16 ? 2 : 4, i = 0;
  v16 mv = splat(-__builtin_inff());
  i16v nan = {0};
  for (; i + W <= n; i += W) {
    v16 v = load16(x + i * es, bf16);
    i16v gt = v > mv; /* a NaN compares false: kept out of the maximum, counted apart */
    mv = (v16)(((i16v)v & gt) | ((i16v)mv & ~gt));
    nan |= v != v;
  }
  float m = -__builtin_inff();
  int any_nan = 0;
  for (int l = 0; l < W; ++l) m = mv[l] > m ? mv[l] : m, any_nan |= nan[l] != 0;
  for (; i < n; ++i) {
    float v = at_(x, i, bf16);
    m = v > m ? v : m, any_nan |= v != v;
  }
  for (int64_t j = 0; j < n; ++j) {
    float v = at_(x, j, bf16);
    if (any_nan ? v != v : v == m) return j;
  }
  return 0;
}

int tfe_greedy(const void *logits, int64_t rows, int64_t n, const int64_t *lanes, int64_t spare, int32_t bf16,
               int64_t *out) {
  for (int64_t r = 0; r < rows; ++r)
    out[r] = lanes[r] == spare ? 0 : first_max((const char *)logits + r * n * (bf16 ? 2 : 4), n, bf16);
  return 0;
}
