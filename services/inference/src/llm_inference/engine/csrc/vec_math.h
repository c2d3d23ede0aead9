// Vectorisable float32 math shared by the CPU kernels. torch's extension builder hashes the
// .cpp sources only: when this header changes, bump the names of the kernels that include it
// (paged_kernel.py, fused_ops.py, packed_linear.py) so cached builds are not reused.
#pragma once

#include <cstdint>
#include <cstring>

// e^x for float32 in a form the compiler vectorises (libm's expf is a call per element):
// x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial to r^7 (relative error
// below 1e-7 there), times 2^n built in the exponent bits. Inputs are clamped to where
// e^x is a normal float.
static inline float exp_vec(float x) {
  // Ternaries, not std::min/max (they go through references) and rounding by adding
  // 1.5 * 2^23, not floor (GCC vectorises neither without -ffast-math).
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln2, split
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

