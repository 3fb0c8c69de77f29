// CPU decode kernels (fp32, AVX-512) as XLA FFI custom calls: a skinny matmul and one-token attention.
//
// A decode step multiplies a few rows (the batch) by every weight matrix once, so it should run at
// memory bandwidth. XLA's CPU dot reaches that at one row but drops to ~40% of it at eight (its
// kernels are tuned for square GEMMs). hljax_matmul_packed streams each weight element once and uses
// it for all rows while it is in registers: Y[M, N] = X[M, K] @ W, W packed as [P, K, 48] column
// panels (zero-padded), so each panel is one contiguous stream. (The unpacked [K, N] walk crosses a
// 4 KiB page every row and runs 2x slower; a row-dot kernel on a [N, K] tied embedding ran 1.5x
// slower than the packed panels.)
// hljax_decode_attention: one query token per row against its KV cache. XLA runs it as two batched
// dots of [G, H] x [H, S] per (row, kv head), each a separate tiny GEMM; here each (row, kv head)
// reads its keys and values once for all G query heads that share them.
//
// Work is split over XLA's intra-op pool. The calling thread works too and then waits only for
// units that a running thread has claimed, so a busy pool can delay but never deadlock the call.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 48;  // Columns per packed panel: 3 zmm registers.
constexpr int kMaxRows = 8;     // Rows per register block; more rows reuse the panel from L2.

__mmask16 TailMask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Rows [0, MR) of Y[:, n0:n0+cols] from one packed panel (K x 48).
template <int MR>
void PackedPanel(const float* x, int64_t K, const float* panel, float* y, int64_t N, int64_t n0, int64_t cols) {
  __m512 acc[MR][3];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
  const float* w = panel;
  for (int64_t k = 0; k < K; ++k, w += kPanel) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 16 * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + 16 * kPanel + 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + 16 * kPanel + 32), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(xv, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xv, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(xv, w2, acc[m][2]);
    }
  }
  for (int j = 0; j < 3; ++j) {
    const int64_t left = cols - 16 * j;
    if (left <= 0) break;
    const __mmask16 mask = TailMask(left);
    for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * N + n0 + 16 * j, mask, acc[m][j]);
  }
}

// One (row, kv head): q [G, H] (pre-scaled), k, v [S, H], valid [S] -> out [G, H].
void AttendOne(const float* q, const float* k, const float* v, const bool* valid, float* out, int64_t G, int64_t S,
               int64_t H, float scale, std::vector<float>& scores) {
  constexpr float kMasked = -1e30f;  // As the XLA path: a fully masked row gives a uniform softmax.
  scores.assign(G * S, kMasked);
  const int64_t chunks = (H + 15) / 16;
  for (int64_t s = 0; s < S; ++s) {
    if (!valid[s]) continue;
    const float* krow = k + s * H;
    _mm_prefetch(reinterpret_cast<const char*>(krow + 4 * H), _MM_HINT_T0);
    for (int64_t g = 0; g < G; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        const __mmask16 mask = TailMask(H - 16 * c);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + g * H + 16 * c),
                              _mm512_maskz_loadu_ps(mask, krow + 16 * c), acc);
      }
      scores[g * S + s] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* row = scores.data() + g * S;
    float top = row[0];
    for (int64_t s = 1; s < S; ++s) top = std::max(top, row[s]);
    float total = 0.f;
    for (int64_t s = 0; s < S; ++s) total += (row[s] = std::exp(row[s] - top));
    const float inv = 1.f / total;
    for (int64_t s = 0; s < S; ++s) row[s] *= inv;
  }
  // out[g] = sum_s p[g, s] v[s]: 16 output channels at a time, up to 8 query heads per pass. Masked
  // slots have p = 0 and are skipped, unless every slot is masked (then p is uniform).
  const bool any_valid = std::any_of(valid, valid + S, [](bool b) { return b; });
  for (int64_t c = 0; c < chunks; ++c) {
    const __mmask16 mask = TailMask(H - 16 * c);
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
      const int64_t gn = std::min<int64_t>(8, G - g0);
      __m512 acc[8];
      for (int64_t g = 0; g < gn; ++g) acc[g] = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; ++s) {
        if (!valid[s] && any_valid) continue;
        const __m512 vv = _mm512_maskz_loadu_ps(mask, v + s * H + 16 * c);
        for (int64_t g = 0; g < gn; ++g)
          acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[(g0 + g) * S + s]), vv, acc[g]);
      }
      for (int64_t g = 0; g < gn; ++g) _mm512_mask_storeu_ps(out + (g0 + g) * H + 16 * c, mask, acc[g]);
    }
  }
}

template <template <int> class F, typename... Args>
void ByRows(int rows, Args... args) {
  switch (rows) {
    case 1: F<1>::Run(args...); break;
    case 2: F<2>::Run(args...); break;
    case 3: F<3>::Run(args...); break;
    case 4: F<4>::Run(args...); break;
    case 5: F<5>::Run(args...); break;
    case 6: F<6>::Run(args...); break;
    case 7: F<7>::Run(args...); break;
    default: F<8>::Run(args...); break;
  }
}

template <int MR>
struct PackedRun {
  static void Run(const float* x, int64_t K, const float* panel, float* y, int64_t N, int64_t n0, int64_t cols) {
    PackedPanel<MR>(x, K, panel, y, N, n0, cols);
  }
};

// Runs unit(i) for i in [0, units) on the calling thread and the pool.
template <typename Unit>
void ParallelFor(ffi::ThreadPool& pool, int64_t units, Unit unit) {
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, units, unit]() {
    for (int64_t i; (i = shared->next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      unit(i);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), units) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule(decltype(work)(work));
  work();
  // Every unit is claimed by now; the ones still running are on threads that are running them.
  while (shared->done.load(std::memory_order_acquire) < units) std::this_thread::yield();
}

ffi::Error MatmulPacked(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kPanel)
    return ffi::Error::InvalidArgument("hljax_matmul_packed: want x [M, K], w [P, K, 48], y [M, N]");
  const int64_t M = xd[0], K = xd[1], P = wd[0], N = yd[1];
  if (wd[1] != K || yd[0] != M || N > P * kPanel || N <= (P - 1) * kPanel)
    return ffi::Error::InvalidArgument("hljax_matmul_packed: shapes do not match");
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  ParallelFor(pool, P, [=](int64_t p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    for (int64_t r = 0; r < M; r += kMaxRows)
      ByRows<PackedRun>(static_cast<int>(std::min<int64_t>(kMaxRows, M - r)), xp + r * K, K, wp + p * K * kPanel,
                        yp + r * N, N, n0, cols);
  });
  return ffi::Error::Success();
}

ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> valid, ffi::ResultBuffer<ffi::F32> out,
                           float scale) {
  // q, out: [B, K, G, H]; k, v: [B, K, S, H]; valid: [B, S] (False: masked slot).
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = valid.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2 ||
      !std::equal(kd.begin(), kd.end(), vd.begin()) ||
      kd[0] != qd[0] || kd[1] != qd[1] || kd[3] != qd[3] || md[0] != qd[0] || md[1] != kd[2])
    return ffi::Error::InvalidArgument(
        "hljax_decode_attention: want q [B, K, G, H], k and v [B, K, S, H], valid [B, S]");
  const int64_t B = qd[0], K = qd[1], G = qd[2], H = qd[3], S = kd[2];
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = valid.typed_data();
  float* op = out->typed_data();
  ParallelFor(pool, B * K, [=](int64_t u) {
    thread_local std::vector<float> scores;
    const int64_t b = u / K;
    AttendOne(qp + u * G * H, kp + u * S * H, vp + u * S * H, mp + b * S, op + u * G * H, G, S, H, scale, scores);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxMatmulPacked, MatmulPacked,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
