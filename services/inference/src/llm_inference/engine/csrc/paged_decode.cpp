// Attention straight from the paged KV cache: no gather into a contiguous buffer. Each query
// row has its own key count and names its sequence's block table, so one call serves decode
// rows, drafted positions and prefill chunks alike (row i of a chunk starting at position s
// sees s + i + 1 keys: causal without a mask, and the masked half is never computed). One task
// per (row, KV head) reads the keys and values block by block through the table. float32, CPU.
//
// Head sizes that are a multiple of the vector width take a register-blocked path: a query
// head's vectors and its output accumulator stay in registers while the keys (then values)
// stream past, one horizontal sum per score. Other sizes take a scalar-loop path.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vec_math.h"
#include "work_split.h"

namespace {

#if defined(__AVX512F__)
constexpr int kVec = 16;
#else
constexpr int kVec = 8;
#endif
typedef float vec __attribute__((vector_size(kVec * 4)));
typedef float vec_u __attribute__((vector_size(kVec * 4), aligned(4)));

inline float hsum(vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX__)
  const __m256 x = reinterpret_cast<__m256>(v);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float s = 0.f;
  for (int i = 0; i < kVec; ++i) s += v[i];
  return s;
#endif
}

struct Task {
  const float* k_cache;
  const float* v_cache;
  const int64_t* table;  // this row's block table
  int64_t len, block, dim, kv_heads, head;

  const float* keys(const float* cache, int64_t b) const {
    return cache + ((table[b] * kv_heads + head) * block) * dim;
  }
};

// scores[len] = scale * q . k_i for every key of the task. DV = dim / kVec vectors per head.
template <int DV>
void score_keys(const Task& t, const float* q, float scale, float* scores) {
  vec qv[DV];
  for (int j = 0; j < DV; ++j) qv[j] = *reinterpret_cast<const vec_u*>(q + j * kVec);
  for (int64_t pos = 0; pos < t.len; pos += t.block) {
    const int64_t n = std::min(t.block, t.len - pos);
    const float* keys = t.keys(t.k_cache, pos / t.block);
    for (int64_t i = 0; i < n; ++i) {
      const vec_u* k = reinterpret_cast<const vec_u*>(keys + i * DV * kVec);
      vec acc = qv[0] * k[0];
      for (int j = 1; j < DV; ++j) acc += qv[j] * k[j];
      scores[pos + i] = hsum(acc) * scale;
    }
  }
}

// out[dim] = sum_i probs[i] * v_i, the accumulator in registers.
template <int DV>
void mix_values(const Task& t, const float* probs, float* out) {
  vec acc[DV];
  for (int j = 0; j < DV; ++j) acc[j] = vec{};
  for (int64_t pos = 0; pos < t.len; pos += t.block) {
    const int64_t n = std::min(t.block, t.len - pos);
    const float* values = t.keys(t.v_cache, pos / t.block);
    for (int64_t i = 0; i < n; ++i) {
      const vec p = vec{} + probs[pos + i];
      const vec_u* v = reinterpret_cast<const vec_u*>(values + i * DV * kVec);
      for (int j = 0; j < DV; ++j) acc[j] += p * v[j];
    }
  }
  for (int j = 0; j < DV; ++j) *reinterpret_cast<vec_u*>(out + j * kVec) = acc[j];
}

// The same two loops for any head size (scalar loops the compiler vectorises where it can).
void score_keys_any(const Task& t, const float* q, float scale, float* scores) {
  for (int64_t pos = 0; pos < t.len; pos += t.block) {
    const int64_t n = std::min(t.block, t.len - pos);
    const float* keys = t.keys(t.k_cache, pos / t.block);
    for (int64_t i = 0; i < n; ++i) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < t.dim; ++d) s += q[d] * keys[i * t.dim + d];
      scores[pos + i] = s * scale;
    }
  }
}

void mix_values_any(const Task& t, const float* probs, float* out) {
  std::fill(out, out + t.dim, 0.f);
  for (int64_t pos = 0; pos < t.len; pos += t.block) {
    const int64_t n = std::min(t.block, t.len - pos);
    const float* values = t.keys(t.v_cache, pos / t.block);
    for (int64_t i = 0; i < n; ++i) {
      const float p = probs[pos + i];
#pragma omp simd
      for (int64_t d = 0; d < t.dim; ++d) out[d] += p * values[i * t.dim + d];
    }
  }
}

void softmax_(float* s, int64_t len) {
  const float top = *std::max_element(s, s + len);
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < len; ++i) {
    const float e = exp_vec(s[i] - top);  // libm's expf would be a call per score
    s[i] = e;
    total += e;
  }
  const float inv = 1.f / total;
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) s[i] *= inv;
}

// Rows in the order 0, n-1, 1, n-2, ...: rows come sorted by length (decode rows longest
// first, a prefill chunk's rows one key longer each), and parallel_for hands each thread a
// contiguous range, so in plain order one thread would get all the long rows.
inline int64_t zigzag(int64_t i, int64_t n) { return i % 2 == 0 ? i / 2 : n - 1 - i / 2; }

using ScoreFn = void (*)(const Task&, const float*, float, float*);
using MixFn = void (*)(const Task&, const float*, float*);

struct Loops {
  ScoreFn score;
  MixFn mix;
};

Loops pick(int64_t dim) {
  if (dim % kVec == 0) {
    switch (dim / kVec) {
      case 1: return {score_keys<1>, mix_values<1>};
      case 2: return {score_keys<2>, mix_values<2>};
      case 4: return {score_keys<4>, mix_values<4>};
      case 8: return {score_keys<8>, mix_values<8>};
      case 16: return {score_keys<16>, mix_values<16>};
      default: break;
    }
  }
  return {score_keys_any, mix_values_any};
}

}  // namespace

// q [rows, heads, dim]; caches [blocks, kv_heads, block_size, dim]; tables [seqs, max_blocks]
// (int64); table_rows [rows] (int64, the tables row of each query row); lens [rows] (int64,
// keys per row). Returns [rows, heads, dim].
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor tables, torch::Tensor table_rows, torch::Tensor lens,
                           double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32,
              "paged_decode: float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  tables.is_contiguous() && table_rows.is_contiguous() && lens.is_contiguous(),
              "paged_decode: contiguous inputs");
  TORCH_CHECK(table_rows.size(0) == q.size(0) && lens.size(0) == q.size(0),
              "paged_decode: one table row and one length per query row");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), block = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = tables.size(1);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* trp = table_rows.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const Loops loops = pick(dim);
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  // A task (row, KV head) on average: its keys and values read, group scores and mixes each.
  double keys = 0.0;
  for (int64_t r = 0; r < rows; ++r) keys += static_cast<double>(lp[r]);
  keys /= std::max<int64_t>(rows, 1);
  const int64_t grain = work_split::grain(4.0 * keys * group * dim, 8.0 * keys * dim);
  at::parallel_for(0, rows * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = zigzag(task / kv_heads, rows), h = task % kv_heads;
      const Task t{kp, vp, tp + trp[r] * max_blocks, lp[r], block, dim, kv_heads, h};
      scores.resize(t.len);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t at = (r * heads + h * group + g) * dim;
        loops.score(t, qp + at, fscale, scores.data());
        softmax_(scores.data(), t.len);
        loops.mix(t, scores.data(), op + at);
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "attention over the paged KV cache (float32)",
        py::call_guard<py::gil_scoped_release>());  // as packed_linear
}
