// y[M, N] = x[M, K] @ W^T for float32 on CPU, with W packed at load time into panels of NR
// output columns: packed[p][k][j] = W[p * NR + j][k] (zero past N). A panel is read front to
// back, once per MR rows of x, so the weights stream sequentially from memory and each loaded
// vector feeds MR fused multiply-adds; no per-call packing (what makes BLAS slow at the
// 1-64 rows of a decode step). Accumulation is in float32, in k order. packed_swiglu applies
// SwiGLU to each tile of a gate/up panel pair as it is made (the MLP's first half in one call).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "vec_math.h"
#include "work_split.h"

namespace {

#if defined(__AVX512F__)
constexpr int kVec = 16, kRows = 6;  // 24 accumulators + 4 weight vectors of 32 registers
#else
constexpr int kVec = 8, kRows = 2;  // 8 accumulators + 4 weight vectors of 16 registers
#endif
constexpr int kVecs = 4, kPanel = kVecs * kVec;
typedef float vec __attribute__((vector_size(kVec * 4)));
typedef float vec_u __attribute__((vector_size(kVec * 4), aligned(4)));

// R rows of x (x + i * k_len) times one panel, into out [R, kPanel]. R is a template
// parameter so the accumulators stay in registers and a short tile (one decode row) does
// only its own multiply-adds.
template <int R>
void tile(const float* x, const float* panel, int64_t k_len, float* out) {
  vec acc[R][kVecs];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = vec{};
  for (int64_t k = 0; k < k_len; ++k) {
    const vec_u* w = reinterpret_cast<const vec_u*>(panel + k * kPanel);
    vec wv[kVecs];
    for (int v = 0; v < kVecs; ++v) wv[v] = w[v];
    for (int i = 0; i < R; ++i) {
      const vec a = vec{} + x[i * k_len + k];
      for (int v = 0; v < kVecs; ++v) acc[i][v] += a * wv[v];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < kVecs; ++v) *reinterpret_cast<vec_u*>(out + i * kPanel + v * kVec) = acc[i][v];
}

template <int R>
void tile_upto(int rows, const float* x, const float* panel, int64_t k_len, float* out) {
  if constexpr (R > 1) {
    if (rows < R) return tile_upto<R - 1>(rows, x, panel, k_len, out);
  }
  tile<R>(x, panel, k_len, out);
}

// The checked inputs' output tensor [M, n_out], each panel giving `per_panel` output columns.
torch::Tensor output_for(const torch::Tensor& x, const torch::Tensor& packed, int64_t n_out,
                         int64_t per_panel, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && packed.scalar_type() == torch::kFloat32,
              name, ": float32 only");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kPanel,
              name, ": x [M, K], packed [P, K, ", kPanel, "]");
  TORCH_CHECK(x.is_contiguous() && packed.is_contiguous(), name, ": contiguous inputs");
  const int64_t panels = packed.size(0);
  TORCH_CHECK(packed.size(1) == x.size(1) && n_out > (panels - 1) * per_panel &&
                  n_out <= panels * per_panel,
              name, ": shapes disagree");
  return torch::empty({x.size(0), n_out}, x.options());
}

// Every (panel, row tile) product of x and the packed panels, handed to store(p, m0, rows,
// tile) with tile [rows, kPanel]; panels are split between threads when there is enough work.
template <typename Store>
void for_each_tile(const torch::Tensor& x, const torch::Tensor& packed, const Store& store) {
  const int64_t m_len = x.size(0), k_len = x.size(1), panels = packed.size(0);
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  // A panel: its multiply-adds for every row, and reading its weights once.
  const int64_t grain = work_split::grain(2.0 * m_len * k_len * kPanel, 4.0 * k_len * kPanel);
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    alignas(64) float out[kRows * kPanel];
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t m0 = 0; m0 < m_len; m0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m_len - m0));
        tile_upto<kRows>(rows, xp + m0 * k_len, wp + p * k_len * kPanel, k_len, out);
        store(p, m0, rows, out);
      }
    }
  });
}

}  // namespace

// x [M, K] float32 contiguous; packed [P, K, kPanel] float32 contiguous, P = ceil(N / kPanel).
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, int64_t n_out) {
  auto y = output_for(x, packed, n_out, kPanel, "packed_linear");
  float* yp = y.data_ptr<float>();
  for_each_tile(x, packed, [&](int64_t p, int64_t m0, int rows, const float* tile) {
    const int64_t n0 = p * kPanel, width = std::min<int64_t>(kPanel, n_out - n0);
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(yp + (m0 + i) * n_out + n0, tile + i * kPanel, width * sizeof(float));
  });
  return y;
}

// SwiGLU's gate and up projections with the activation applied to each tile as it is made:
// panel p holds gate rows [p * H, p * H + H) in its first H columns and the matching up rows
// in the last H (H = kPanel / 2, pack_pairs in packed_linear.py). Returns silu(gate) * up
// [M, n_out] without writing the two projections out; silu as fused_ops' silu_mul computes it.
torch::Tensor packed_swiglu(torch::Tensor x, torch::Tensor packed, int64_t n_out) {
  constexpr int64_t half = kPanel / 2;
  auto y = output_for(x, packed, n_out, half, "packed_swiglu");
  float* yp = y.data_ptr<float>();
  for_each_tile(x, packed, [&](int64_t p, int64_t m0, int rows, const float* tile) {
    const int64_t n0 = p * half, width = std::min<int64_t>(half, n_out - n0);
    for (int64_t i = 0; i < rows; ++i) {
      const float *g = tile + i * kPanel, *u = g + half;
      float* o = yp + (m0 + i) * n_out + n0;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) o[j] = g[j] / (1.0f + exp_vec(-g[j])) * u[j];
    }
  });
  return y;
}

int64_t panel_width() { return kPanel; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released while it runs (milliseconds): the event loop delivering tokens
  // works meanwhile instead of between kernels.
  m.def("packed_linear", &packed_linear, "x @ W^T with W packed in panels (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("packed_swiglu", &packed_swiglu,
        "silu(x @ G^T) * (x @ U^T) with G and U packed in half panels (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("panel_width", &panel_width, "output columns per packed panel");
}
