// Decode attention straight from the paged KV cache: no gather into a contiguous buffer.
// One task per (sequence, KV head) reads its keys and values block by block through the block
// table; the query heads sharing that KV head (GQA) are scored together. float32, CPU.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec_math.h"

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

}  // namespace

// q [rows, heads, dim]; caches [blocks, kv_heads, block_size, dim]; tables [rows, max_blocks]
// (int64); lens [rows] (int64, keys per row). Returns [rows, heads, dim].
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor tables, torch::Tensor lens, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32,
              "paged_decode: float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  tables.is_contiguous() && lens.is_contiguous(),
              "paged_decode: contiguous inputs");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), block = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = tables.size(1);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(group * dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / kv_heads, h = task % kv_heads, len = lp[r];
      const float* qr = qp + (r * heads + h * group) * dim;
      scores.assign(group * len, 0.f);
      for (int64_t pos = 0; pos < len; pos += block) {
        const int64_t n = std::min(block, len - pos);
        const float* keys = kp + ((tp[r * max_blocks + pos / block] * kv_heads + h) * block) * dim;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t g = 0; g < group; ++g)
            scores[g * len + pos + i] = dot(qr + g * dim, keys + i * dim, dim) * fscale;
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        const float top = *std::max_element(s, s + len);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < len; ++i) {
          const float e = exp_vec(s[i] - top);  // libm's expf would be a call per score
          s[i] = e;
          total += e;
        }
        const float inv = 1.f / total;
        for (int64_t i = 0; i < len; ++i) s[i] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t pos = 0; pos < len; pos += block) {
        const int64_t n = std::min(block, len - pos);
        const float* values = vp + ((tp[r * max_blocks + pos / block] * kv_heads + h) * block) * dim;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t g = 0; g < group; ++g)
            axpy(scores[g * len + pos + i], values + i * dim, acc.data() + g * dim, dim);
      }
      std::copy(acc.begin(), acc.end(), op + (r * heads + h * group) * dim);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention over the paged KV cache (float32)",
        py::call_guard<py::gil_scoped_release>());  // as packed_linear
}
