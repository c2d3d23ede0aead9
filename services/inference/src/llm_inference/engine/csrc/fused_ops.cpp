// The small per-layer operations of a CPU float32 decoder step, each one pass over its rows:
// RMSNorm, residual add + RMSNorm, rotary embedding in place, and SwiGLU's silu(gate) * up.
// torch runs each as several dispatched ops (RMSNorm ~12 us a call at one row, RoPE six ops),
// which at decode batch sizes costs more than the arithmetic. Rows are split across threads
// only when there are enough of them to pay for it (work_split.h).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>

#include "vec_math.h"
#include "work_split.h"

namespace {

// Rows per thread chunk for rows of `width` elements: each element read and written once with a
// few operations on it (work_split.h: a chunk must outweigh waking a thread).
int64_t grain(int64_t width) { return work_split::grain(8.0 * width, 12.0 * width); }

void check_rows(const torch::Tensor& x, const torch::Tensor& w, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32, what,
              ": float32 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), what, ": contiguous inputs");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == w.numel(), what, ": weight does not match rows");
}

// out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), the reference's order of operations.
inline void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

// x [..., n]; w [n]. Returns the normalised rows.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, w, "rms_norm");
  const int64_t n = w.numel(), rows = x.numel() / n;
  auto out = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      norm_row(xp + r * n, wp, op + r * n, n, static_cast<float>(eps));
  });
  return out;
}

// x, y [..., n]; w [n]. Returns (x + y, rms_norm(x + y)): the residual stream and the next
// block's input, in one pass.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor y,
                                                     torch::Tensor w, double eps) {
  check_rows(x, w, "add_rms_norm");
  TORCH_CHECK(y.sizes() == x.sizes() && y.is_contiguous() && y.scalar_type() == torch::kFloat32,
              "add_rms_norm: x and y must match");
  const int64_t n = w.numel(), rows = x.numel() / n;
  auto sum = torch::empty_like(x);
  auto out = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *yp = y.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *sp = sum.data_ptr<float>(), *op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* s = sp + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) s[i] = xp[r * n + i] + yp[r * n + i];
      norm_row(s, wp, op + r * n, n, static_cast<float>(eps));
    }
  });
  return {sum, out};
}

// qkv [tokens, heads, dim] (contiguous); cos, sin [tokens, dim], halves repeated (HF layout).
// Rotates heads [0, rotated) of every token in place, rotate-half style:
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
void rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t rotated) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat32 && cos.scalar_type() == torch::kFloat32 &&
                  sin.scalar_type() == torch::kFloat32,
              "rope_: float32 only");
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() && qkv.dim() == 3,
              "rope_: contiguous [tokens, heads, dim]");
  const int64_t tokens = qkv.size(0), heads = qkv.size(1), dim = qkv.size(2), half = dim / 2;
  TORCH_CHECK(cos.size(0) == tokens && cos.size(1) == dim && sin.sizes() == cos.sizes() &&
                  rotated <= heads && dim % 2 == 0,
              "rope_: shapes");
  float* xp = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, grain(rotated * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * dim, *s = sp + t * dim;
      for (int64_t h = 0; h < rotated; ++h) {
        float* x = xp + (t * heads + h) * dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c[i] - x2 * s[i];
          x[i + half] = x2 * c[i + half] + x1 * s[i + half];
        }
      }
    }
  });
}

// gate_up [rows, 2 * width] (gate columns first, as the fused projection writes them).
// Returns silu(gate) * up [rows, width], silu(g) = g / (1 + e^-g).
torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == torch::kFloat32, "silu_mul: float32 only");
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
              "silu_mul: contiguous [..., 2 * width]");
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * width);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = width;
  auto out = torch::empty(sizes, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *g = gp + r * 2 * width, *u = g + width;
      float* o = op + r * width;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) o[i] = g[i] / (1.0f + exp_vec(-g[i])) * u[i];
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension (float32, CPU)");
  m.def("add_rms_norm", &add_rms_norm, "(x + y, RMSNorm(x + y)) (float32, CPU)");
  m.def("rope_", &rope_, "rotary embedding of the first heads, in place (float32, CPU)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up over a fused gate/up row (float32, CPU)");
}
