/* Vectors of 16 floats for the CPU round's C kernels (engine/cpu/decode_attention.c, engine/cpu/elem.c), with
 * bf16 widened and rounded exactly as torch's c10::BFloat16 does. GCC/Clang vector extensions;
 * built with -ffp-contract=off, no -ffast-math (engine/cpu/decode_attention.py), so every operation rounds
 * once, as written. */
#ifndef TFE_CPU_VEC_H
#define TFE_CPU_VEC_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));
typedef uint32_t u8v __attribute__((vector_size(32)));
typedef uint16_t h8v __attribute__((vector_size(16)));

#define W 16 /* floats a vector */

static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

/* 16 values at p, widened to float32 (bf16: the 16 bits shifted into the high half, exactly) */
static inline v16 load16(const void *p, int bf16) {
  v16 r;
  if (!bf16) {
    memcpy(&r, p, sizeof r);
    return r;
  }
  h16v h;
  memcpy(&h, p, sizeof h);
  u16v u = __builtin_convertvector(h, u16v) << 16;
  memcpy(&r, &u, sizeof r);
  return r;
}

/* 8 values at p, widened as load16 does: half a vector, for loops whose live vectors must fit
 * AVX2's 16 registers (without AVX-512 a 16-float vector is an aggregate that GCC moves through
 * the stack and general registers) */
static inline v8 load8(const void *p, int bf16) {
  v8 r;
  if (!bf16) {
    memcpy(&r, p, sizeof r);
    return r;
  }
  h8v h;
  memcpy(&h, p, sizeof h);
  u8v u = __builtin_convertvector(h, u8v) << 16;
  memcpy(&r, &u, sizeof r);
  return r;
}

static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }

/* 16 floats rounded to bf16 as torch's c10::BFloat16 does (to nearest even, NaN -> 0x7fc0), as
 * float32 bits (the low half zero) */
static inline u16v round16(v16 f) {
  u16v u, nan;
  memcpy(&u, &f, sizeof u);
  nan = (u16v)((u & 0x7fffffffu) > 0x7f800000u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return (u & ~nan) | (0x7fc00000u & nan);
}
#endif
