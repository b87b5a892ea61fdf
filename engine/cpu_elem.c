/* The C++ decode round's elementwise passes after a mean of squares (engine/cpu_round.cpp), with
 * the bits of the ATen ops they stand for: every op rounds once, float32 inside and the model's
 * dtype (bf16 or float32) after each `.to` and each bf16 mul or add, as ATen's CPU kernels do
 * (a bf16 binary op widens both sides, operates in float32, rounds to nearest even). The means
 * themselves stay ATen's (its summation order is its own). Built into the C attention's library
 * (engine/cpu_attn.py: -ffp-contract=off, no -ffast-math, so no product is fused into a sum).
 * Each function returns 0, or -1 for a row length it does not take (then the round calls ATen). */
#include "cpu_vec.h"

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

/* engine.model.RMSNorm.forward after `ms = f.pow(2).mean(-1)`: out = w * (f * rsqrt(ms + eps)).to(T)
 * (rsqrt: 1 / sqrt, as ATen's, both correctly rounded). f [n] float32 of one row; y: n floats, each
 * rounded to T. */
static inline void norm_row(const float *f, float ms, const char *w, float *y, int64_t n, float eps, int bf16) {
  int64_t es = bf16 ? 2 : 4;
  v16 r = splat(1.0f / __builtin_sqrtf(ms + eps));
  for (int64_t c = 0; c < n; c += W) {
    v16 x = to_t(load16(f + c, 0) * r, bf16);
    x = to_t(load16(w + c * es, bf16) * x, bf16);
    memcpy(y + c, &x, sizeof x);
  }
}

/* rows of n: f [rows, n] float32, ms [rows], w [n] and out [rows, n] in the model's dtype */
int tfe_norm_rows(const float *f, const float *ms, const void *w, void *out, int64_t rows, int64_t n, float eps,
                  int32_t bf16) {
  int64_t es = bf16 ? 2 : 4;
  float y[MAX_DC * W * 64];
  if (n % W || n > (int64_t)(sizeof y / sizeof y[0])) return -1;
  for (int64_t r = 0; r < rows; ++r) {
    norm_row(f + r * n, ms[r], (const char *)w, y, n, eps, bf16);
    for (int64_t c = 0; c < n; c += W) store16((char *)out + (r * n + c) * es, load16(y + c, 0), bf16);
  }
  return 0;
}

/* PackedLinears.heads' q and k: each of a row's nh heads of d normed by its own weight row
 * (w [nh, d]) and rotated as engine.model.rotate's ATen ops round it: a = x * cos, b = rot * sin,
 * out = a + b, each rounded to T (rot: the two halves swapped, the first negated, exactly).
 * f [rows, nh, d] float32, ms [rows, nh], cos and sin [rows, d] and out [rows, nh, d] in T. */
int tfe_heads(const float *f, const float *ms, const void *w, const void *cos, const void *sin, void *out,
              int64_t rows, int64_t nh, int64_t d, float eps, int32_t bf16) {
  int64_t es = bf16 ? 2 : 4, dc = d / W, hc = dc / 2;
  float y[MAX_DC * W];
  if (d % (2 * W) || dc > MAX_DC) return -1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nh; ++j) {
      norm_row(f + (r * nh + j) * d, ms[r * nh + j], (const char *)w + j * d * es, y, d, eps, bf16);
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
