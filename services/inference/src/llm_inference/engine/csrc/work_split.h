// When a CPU kernel's work is worth a second thread. Waking a sleeping OpenMP worker costs
// ~65 us on a 2-core VM under OMP_WAIT_POLICY=PASSIVE (the image's setting; measured: a
// 512x256 layer at one row took 74 us on two threads, 7.6 us on one), more than a small
// model's whole layer at decode batch sizes, and an idle vCPU can take far longer to wake.
// Kernels estimate an item's single-thread time from its arithmetic and its memory reads and
// split only into chunks of at least kMinChunkUs. Measured under PASSIVE: a demo-chat decode
// step 3.3 ms with every kernel threaded, ~1.0-1.5 ms at 250 us; at 1,000 us bench-llama's
// 16-row step went from 40 to 57 ms (its layers need both cores). torch's extension builder
// hashes the .cpp sources only: when this header changes, bump the names of the kernels that
// include it (all three).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace work_split {

constexpr double kFlopsPerUs = 1e5;  // ~100 GFLOP/s: one core's float32 FMA rate, roughly
constexpr double kBytesPerUs = 5e4;  // ~50 GB/s: one core reading L3 (a small model fits there)
constexpr double kMinChunkUs = 250.0;  // wake cost above, and then some

// at::parallel_for's grain: items per chunk so that a chunk is at least kMinChunkUs of work.
inline int64_t grain(double flops_per_item, double bytes_per_item) {
  const double item_us = flops_per_item / kFlopsPerUs + bytes_per_item / kBytesPerUs;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinChunkUs / item_us)));
}

}  // namespace work_split
