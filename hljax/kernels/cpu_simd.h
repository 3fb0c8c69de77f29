// SIMD helpers shared by the CPU kernels (cpu_decode.cc, cpu_attention.cc): one vector type for
// AVX-512F or AVX2 + FMA (the compiler flags pick it), bf16 widening, a vector exp for softmaxes, and
// a parallel loop over XLA's intra-op pool.
#ifndef HLJAX_KERNELS_CPU_SIMD_H_
#define HLJAX_KERNELS_CPU_SIMD_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = xla::ffi;

using bf16 = uint16_t;  // Raw bfloat16 bits: the high half of an fp32.

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using Vec = __m512;
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec Load(const bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline Vec Bcast(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline float Sum(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float MaxOf(Vec v) { return _mm512_reduce_max_ps(v); }
inline Vec Round(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec Scale2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, n integral.
inline Vec ZeroWhereBelow(Vec r, Vec x, float lim) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, Bcast(lim), _CMP_LT_OQ), r, Zero());
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
using Vec = __m256;
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec Load(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline Vec Bcast(float x) { return _mm256_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline float Sum(Vec v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
inline Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float MaxOf(Vec v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}
inline Vec Round(Vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec Scale2(Vec p, Vec n) {  // p * 2^n for integral n in [-126, 127]: n + 127 is 2^n's exponent field.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline Vec ZeroWhereBelow(Vec r, Vec x, float lim) {
  return _mm256_blendv_ps(r, Zero(), _mm256_cmp_ps(x, Bcast(lim), _CMP_LT_OQ));
}
#else
#error "the hljax CPU kernels need AVX-512F, or AVX2 and FMA (build with -mavx512f or -mavx2 -mfma)"
#endif

inline float ToFloat(float x) { return x; }
inline float ToFloat(bf16 x) {
  const uint32_t bits = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The first n (< kLanes) elements of p, zero-filled; and the matching partial store.
template <typename T>
Vec LoadPart(const T* p, int64_t n) {
  alignas(64) T buf[kLanes] = {};
  std::copy(p, p + n, buf);
  return Load(buf);
}
inline void StorePart(float* p, Vec v, int64_t n) {
  alignas(64) float buf[kLanes];
  Store(buf, v);
  std::copy(buf, buf + n, p);
}

// exp(x) for x <= 0 (a softmax's shifted scores), within a few ulp of expf; 0 below -87, where expf
// underflows. Cody-Waite reduction x = n ln2 + r and Cephes' expf polynomial on r. The softmax runs
// between the K and V passes with no loads to overlap; with scalar expf the kernel took 11-15% longer.
inline Vec ExpNonPositive(Vec x) {
  const Vec xc = Max(x, Bcast(-87.f));
  const Vec n = Round(Mul(xc, Bcast(1.44269504088896341f)));
  Vec r = Fma(n, Bcast(-0.693359375f), xc);
  r = Fma(n, Bcast(2.12194440e-4f), r);
  Vec p = Bcast(1.9875691500e-4f);
  p = Fma(p, r, Bcast(1.3981999507e-3f));
  p = Fma(p, r, Bcast(8.3334519073e-3f));
  p = Fma(p, r, Bcast(4.1665795894e-2f));
  p = Fma(p, r, Bcast(1.6666665459e-1f));
  p = Fma(p, r, Bcast(5.0000001201e-1f));
  p = Fma(p, Mul(r, r), Add(r, Bcast(1.f)));
  return ZeroWhereBelow(Scale2(p, n), x, -87.f);
}

// The packed weight layout (cpu_decode.py's `pack`), read by cpu_decode.cc and cpu_amx.cc: column
// panels of kPw = kNr vectors.
constexpr int kNr = 3;                  // Vectors per register panel.
constexpr int64_t kPw = kNr * kLanes;   // Columns per register panel.

// The packed length of a [K, N] matrix: N / kPw full panels [K, kPw], then the remaining r columns as
// one panel [K, r] and kPw - r zeros (whole-vector reads of its last row stay in the buffer).
inline int64_t PackedLength(int64_t K, int64_t N) {
  const int64_t r = N % kPw;
  return K * N + (r == 0 ? 0 : kPw - r);
}

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

}  // namespace

#endif  // HLJAX_KERNELS_CPU_SIMD_H_
