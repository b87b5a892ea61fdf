/* The decode round's weight products on CPUs without bf16 arithmetic (AVX2 and FMA, no
 * avx512_bf16 or AMX): weights stored as bf16, widened to float32 in registers (a 16-bit shift),
 * float32 inputs, float32 sums. A round streams half the bytes of float32 weights.
 *
 * y[r, j] = sum_c x[r, c] * w[j, c] for each listed row r and every column j in [j0, j1): 16 lane
 * sums (lane l takes c = l mod 16, chunks in order, each step one fused multiply-add), then a
 * fixed halving tree (l + l+8, + l+4, + l+2, + l+1). That order is a row's own: it depends
 * neither on the rows beside it, nor on how many rows or columns a call or a block takes, nor on
 * the vector width (AVX-512: one 16-lane FMA; AVX2: two 8-lane ones; elsewhere fmaf a lane; every
 * FMA rounds once), so stepped = whole, alone = beside others, and the plain reference, which
 * calls this same function, agree bit for bit. Built into the C attention's library
 * (engine/cpu/decode_attention.py: -march=native, -ffp-contract=off). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* Each (row, column) keeps 16 lane sums as two halves, lanes 0-7 and 8-15 (AVX2: one register
 * each; an AVX-512 machine runs the same AVX2 code, so the same instructions and bits). */
#if defined(__AVX2__) && defined(__FMA__)
#if defined(__AVX512F__)
#define TFE_WIDE_ISA "avx2+fma (on an avx512 cpu)"
#else
#define TFE_WIDE_ISA "avx2+fma"
#endif
typedef __m256 half_t;
#define ZERO() _mm256_setzero_ps()
#define FMA(w, xp, a) _mm256_fmadd_ps(w, _mm256_loadu_ps(xp), a)
/* 16 bf16 weights at p -> two halves of float32 (the bits shifted into the high half, exactly) */
#define WIDEN(p, lo, hi)                                                                      \
  do {                                                                                        \
    __m256i h_ = _mm256_loadu_si256((const __m256i *)(p));                                    \
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h_)), 16)); \
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h_, 1)), 16)); \
  } while (0)
/* the 16 lane sums -> one value: l + l+8, then + l+4, + l+2, + l+1 */
static inline float fold(half_t lo, half_t hi) {
  __m256 a = _mm256_add_ps(lo, hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}
#else
#define TFE_WIDE_ISA "scalar fmaf"
typedef struct {
  float v[8];
} half_t;
static inline half_t zero8(void) {
  half_t a;
  memset(&a, 0, sizeof a);
  return a;
}
static inline half_t fma8(half_t w, const float *x, half_t a) {
  for (int l = 0; l < 8; ++l) a.v[l] = fmaf(w.v[l], x[l], a.v[l]);
  return a;
}
static inline void widen8(const uint16_t *p, half_t *o) {
  for (int l = 0; l < 8; ++l) {
    uint32_t u = (uint32_t)p[l] << 16;
    memcpy(&o->v[l], &u, 4);
  }
}
#define ZERO() zero8()
#define FMA(w, xp, a) fma8(w, xp, a)
#define WIDEN(p, lo, hi) (widen8((p), &(lo)), widen8((p) + 8, &(hi)))
static inline float fold(half_t lo, half_t hi) {
  float s[8];
  for (int l = 0; l < 8; ++l) s[l] = lo.v[l] + hi.v[l];
  for (int h = 4; h >= 1; h >>= 1)
    for (int l = 0; l < h; ++l) s[l] = s[l] + s[l + h];
  return s[0];
}
#endif

/* Blocks of rows (one column) whose accumulators stay in registers; each (row, column) runs the
 * same FMAs in the same order in every block. (Pairs of columns at one or two rows, which kept 8
 * FMA chains in flight, were 1.1-1.4x slower at 1-3 rows here: more weight streams at once.) */
static void dot_4x1(const float *x0, const float *x1, const float *x2, const float *x3, const uint16_t *w,
                    int64_t k, float *y0, float *y1, float *y2, float *y3) {
  half_t a0 = ZERO(), b0 = ZERO(), a1 = ZERO(), b1 = ZERO(), a2 = ZERO(), b2 = ZERO(), a3 = ZERO(), b3 = ZERO(), lo, hi;
  for (int64_t e = 0; e < k; e += 16) {
    WIDEN(w + e, lo, hi);
    a0 = FMA(lo, x0 + e, a0), b0 = FMA(hi, x0 + e + 8, b0);
    a1 = FMA(lo, x1 + e, a1), b1 = FMA(hi, x1 + e + 8, b1);
    a2 = FMA(lo, x2 + e, a2), b2 = FMA(hi, x2 + e + 8, b2);
    a3 = FMA(lo, x3 + e, a3), b3 = FMA(hi, x3 + e + 8, b3);
  }
  *y0 = fold(a0, b0), *y1 = fold(a1, b1), *y2 = fold(a2, b2), *y3 = fold(a3, b3);
}

static void dot_2x1(const float *x0, const float *x1, const uint16_t *w, int64_t k, float *y0, float *y1) {
  half_t a0 = ZERO(), b0 = ZERO(), a1 = ZERO(), b1 = ZERO(), lo, hi;
  for (int64_t e = 0; e < k; e += 16) {
    WIDEN(w + e, lo, hi);
    a0 = FMA(lo, x0 + e, a0), b0 = FMA(hi, x0 + e + 8, b0);
    a1 = FMA(lo, x1 + e, a1), b1 = FMA(hi, x1 + e + 8, b1);
  }
  *y0 = fold(a0, b0), *y1 = fold(a1, b1);
}

static void dot_1x1(const float *x, const uint16_t *w, int64_t k, float *y) {
  half_t a = ZERO(), b = ZERO(), lo, hi;
  for (int64_t e = 0; e < k; e += 16) {
    WIDEN(w + e, lo, hi);
    a = FMA(lo, x + e, a), b = FMA(hi, x + e + 8, b);
  }
  *y = fold(a, b);
}

/* The ISA this library's products were compiled for (what -march=native found). */
const char *tfe_wide_isa(void) { return TFE_WIDE_ISA; }

/* x [*, ldx] float32, the rows `rows[0..n_rows)` of it; w [n, k] bf16 bits; y [*, ldy] float32:
 * y[r, j0..j1) for each listed r (other rows of y untouched). k a multiple of 16, else -1.
 * Columns outside, rows inside: a chunk of 4 weight rows (<= 12 KB here) is read from memory
 * once and from L1 by each group of rows after the first. */
int tfe_wide_linear(const float *x, int64_t ldx, const int64_t *rows, int64_t n_rows, const uint16_t *w, int64_t n,
                    int64_t k, float *y, int64_t ldy, int64_t j0, int64_t j1) {
  if (k % 16 || k <= 0 || j0 < 0 || j1 > n || j0 > j1 || n_rows < 0) return -1;
#define X(i) (x + rows[i] * ldx)
#define Y(i) (y + rows[i] * ldy)
  for (int64_t j = j0; j < j1; j += 4) {
    int64_t cols = j1 - j < 4 ? j1 - j : 4, i = 0;
    const uint16_t *wj = w + j * k;
    for (; i + 4 <= n_rows; i += 4) /* 4 rows share each widened weight vector */
      for (int64_t c = 0; c < cols; ++c)
        dot_4x1(X(i), X(i + 1), X(i + 2), X(i + 3), wj + c * k, k, Y(i) + j + c, Y(i + 1) + j + c, Y(i + 2) + j + c,
                Y(i + 3) + j + c);
    if (n_rows - i >= 2) {
      for (int64_t c = 0; c < cols; ++c) dot_2x1(X(i), X(i + 1), wj + c * k, k, Y(i) + j + c, Y(i + 1) + j + c);
      i += 2;
    }
    if (n_rows - i == 1) {
      for (int64_t c = 0; c < cols; ++c) dot_1x1(X(i), wj + c * k, k, Y(i) + j + c);
    }
  }
#undef X
#undef Y
  return 0;
}
