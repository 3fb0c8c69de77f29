// CPU decode kernels as XLA FFI custom calls: skinny matmuls over weights packed in column panels
// (fp32 or bf16), one-token attention over the filled part of a KV cache (fp32 or bf16), the cache's
// per-row writes and prefilled-row copies (in place), and the token-embedding lookup.
//
// Built for AVX-512F or for AVX2 + FMA: the compiler flags pick the vector width (cpu_decode.py
// chooses them from the CPU), the code is the same.
//
// A decode step multiplies a few rows (the batch) by every weight matrix once, so it should run at
// memory bandwidth. XLA's CPU dot reaches that at one row but drops to ~40% of it at eight (its
// kernels are tuned for square GEMMs), and it has no fast bf16 path (it converts the weights first).
// hljax_matmul streams each weight element once and uses it for all rows while it is in registers:
// Y[M, N] = X[M, K] @ W[K, N]. W is read in tiles of kKc rows x one register panel of columns; the
// accumulators live in Y between tiles. Walking a [K, N] matrix panel by panel touches a new page
// every row, which the hardware prefetcher does not follow; so each tile prefetches the tile it will
// read two tiles later. bf16 weights are widened in registers (a 16-bit shift), which halves the
// bytes a step reads: what bounds decode at small batch.
// hljax_matmul_nt: Y = X @ E^T for a [N, K] matrix (a tied embedding used as the output projection)
// read row by row, so the embedding is not stored a second time transposed.
// hljax_decode_attention: one query token per row against its KV cache. XLA runs it as two batched
// dots of [G, H] x [H, S] per (row, kv head) over the whole (bucketed) cache; here each (row, kv
// head) reads its keys and values once for all G query heads that share them, and only the slots
// below `filled`, so a step costs what the cache holds, not what it could hold.
//
// Work is split over XLA's intra-op pool. The calling thread works too and then waits only for
// units that a running thread has claimed, so a busy pool can delay but never deadlock the call.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "cpu_simd.h"

namespace {

// Rows per register block: 8 x 3 accumulators + 3 weights + 1 broadcast <= 32 zmm registers; with
// AVX2, 4 x 3 + 3 + 1 = 16 ymm registers.
constexpr int kMr = kLanes == 16 ? 8 : 4;

// Touch every cache line of [p, p + bytes) so it is on its way to L1.
template <int64_t kBytes>
inline void PrefetchRow(const char* p) {
  for (int64_t b = 0; b < kBytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
  _mm_prefetch(p + kBytes - 1, _MM_HINT_T0);
}

// acc[0:MR, 0:kPw] (+)= x[0:MR, 0:kc] @ w[0:kc, 0:kPw]; x, w and acc rows are ldx, ldw, ldacc apart.
// pf, if set, is a tile of the same shape (rows ldw apart) to prefetch while this one is read.
template <int MR, typename W>
void Tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kc, float* acc, int64_t ldacc, bool first,
          const W* pf) {
  Vec a[MR][kNr];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNr; ++j) a[m][j] = first ? Zero() : Load(acc + m * ldacc + j * kLanes);
  for (int64_t k = 0; k < kc; ++k) {
    const W* row = w + k * ldw;
    if (pf != nullptr) PrefetchRow<kPw * sizeof(W)>(reinterpret_cast<const char*>(pf + k * ldw));
    Vec wv[kNr];
    for (int j = 0; j < kNr; ++j) wv[j] = Load(row + j * kLanes);
    for (int m = 0; m < MR; ++m) {
      const Vec xv = Bcast(x[m * ldx + k]);
      for (int j = 0; j < kNr; ++j) a[m][j] = Fma(xv, wv[j], a[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNr; ++j) Store(acc + m * ldacc + j * kLanes, a[m][j]);
}

template <typename W>
void TileRows(int mr, const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kc, float* acc, int64_t ldacc,
              bool first, const W* pf) {
  switch (mr) {
    case 1: return Tile<1>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
    case 2: return Tile<2>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
    case 3: return Tile<3>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
#if defined(__AVX512F__)
    case 4: return Tile<4>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
    case 5: return Tile<5>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
    case 6: return Tile<6>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
    case 7: return Tile<7>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
#endif
    default: return Tile<kMr>(x, ldx, w, ldw, kc, acc, ldacc, first, pf);
  }
}

// y[:, n0:n0+cols] = x[M, K] @ one packed panel [K, cols] (rows cols apart). A full panel has kPw
// columns; the last may be narrower: its rows are read as whole panel rows, the lanes past `cols`
// (the next row's first weights, or the zeros `pack` appends after the last row) land in columns
// that are not stored. The panel is one contiguous stream: read once from memory for the first kMr
// rows, then from L2.
template <typename W>
void PanelRows(const float* x, int64_t M, int64_t K, const W* panel, float* y, int64_t N, int64_t n0, int64_t cols) {
  alignas(64) float part[kMr * kPw];
  for (int64_t m0 = 0; m0 < M; m0 += kMr) {
    const int mr = int(std::min<int64_t>(kMr, M - m0));
    const W* pf = m0 == 0 ? panel + 16 * cols : nullptr;  // 16 rows ahead, on the first pass only.
    if (cols == kPw) {
      TileRows<W>(mr, x + m0 * K, K, panel, kPw, K, y + m0 * N + n0, N, true, pf);
    } else {
      TileRows<W>(mr, x + m0 * K, K, panel, cols, K, part, kPw, true, pf);
      for (int m = 0; m < mr; ++m) std::copy(part + m * kPw, part + m * kPw + cols, y + (m0 + m) * N + n0);
    }
  }
}

// y[m, v0 + r] = x[m] . e[v0 + r] for r < VR, m < MR (e rows are K long, y rows N long).
template <int MR, int VR, typename W>
void RowDots(const float* x, int64_t K, const W* e, float* y, int64_t N, int64_t v0) {
  Vec a[MR][VR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < VR; ++r) a[m][r] = Zero();
  const int64_t kv = K / kLanes * kLanes;
  for (int64_t k = 0; k < kv; k += kLanes) {
    Vec ev[VR];
    for (int r = 0; r < VR; ++r) ev[r] = Load(e + (v0 + r) * K + k);
    for (int m = 0; m < MR; ++m) {
      const Vec xv = Load(x + m * K + k);
      for (int r = 0; r < VR; ++r) a[m][r] = Fma(xv, ev[r], a[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < VR; ++r) {
      float s = Sum(a[m][r]);
      for (int64_t k = kv; k < K; ++k) s += x[m * K + k] * ToFloat(e[(v0 + r) * K + k]);
      y[m * N + v0 + r] = s;
    }
}

constexpr int kNtRows = 4;                                 // Embedding rows per register block.
constexpr int kNtMr = kLanes == 16 ? 4 : 3;                // Rows of x per register block.

template <typename W>
void RowDotsRows(int mr, const float* x, int64_t K, const W* e, float* y, int64_t N, int64_t v0, int vr) {
  if (vr == kNtRows) {
    switch (mr) {
      case 1: return RowDots<1, kNtRows>(x, K, e, y, N, v0);
      case 2: return RowDots<2, kNtRows>(x, K, e, y, N, v0);
#if defined(__AVX512F__)
      case 3: return RowDots<3, kNtRows>(x, K, e, y, N, v0);
#endif
      default: return RowDots<kNtMr, kNtRows>(x, K, e, y, N, v0);
    }
  }
  for (int r = 0; r < vr; ++r)
    for (int m = 0; m < mr; ++m) RowDots<1, 1>(x + m * K, K, e, y + m * N, N, v0 + r);
}

// Chunk c (kLanes elements) of an H-long row, zero-filled past H.
template <typename T>
inline Vec LoadChunk(const T* row, int64_t c, int64_t H) {
  const int64_t at = c * kLanes;
  if (at + kLanes <= H) return Load(row + at);
  return at < H ? LoadPart(row + at, H - at) : Zero();
}

// scores[0:4] = q . k[0:4] over H: four key rows (kh apart) at once, four independent FMA chains
// (one chain per score would wait on the FMA latency at every chunk).
template <typename T>
inline void Dot4(const float* q, const T* k, int64_t kh, int64_t H, float* scores) {
  Vec a0 = Zero(), a1 = Zero(), a2 = Zero(), a3 = Zero();
  const int64_t chunks = (H + kLanes - 1) / kLanes;
  for (int64_t c = 0; c < chunks; ++c) {
    const Vec qv = LoadChunk(q, c, H);
    a0 = Fma(qv, LoadChunk(k, c, H), a0);
    a1 = Fma(qv, LoadChunk(k + kh, c, H), a1);
    a2 = Fma(qv, LoadChunk(k + 2 * kh, c, H), a2);
    a3 = Fma(qv, LoadChunk(k + 3 * kh, c, H), a3);
  }
  scores[0] = Sum(a0), scores[1] = Sum(a1), scores[2] = Sum(a2), scores[3] = Sum(a3);
}

constexpr int kPvHeads = 2;                    // Query heads per register block of the p . v pass.
constexpr int kPvChunks = kLanes == 16 ? 8 : 4;  // Vectors of output channels per block.

// out[g, chunks c0..c0+kPvChunks) = sum_s p[g, s] v[s] for GN query heads (p rows S apart), over the
// slots `use` admits: the accumulators stay in registers for the whole pass over the slots.
template <int GN, typename T>
void PvBlock(const float* p, int64_t S, const T* v, int64_t H, int64_t c0, const bool* use, float* out) {
  Vec acc[GN][kPvChunks];
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < kPvChunks; ++j) acc[g][j] = Zero();
  const int64_t cn = std::min<int64_t>(kPvChunks, (H + kLanes - 1) / kLanes - c0);
  for (int64_t s = 0; s < S; ++s) {
    if (use != nullptr && !use[s]) continue;
    const T* row = v + s * H;
    if (s + 4 < S) _mm_prefetch(reinterpret_cast<const char*>(row + 4 * H + c0 * kLanes), _MM_HINT_T0);
    Vec pg[GN];
    for (int g = 0; g < GN; ++g) pg[g] = Bcast(p[g * S + s]);
    for (int j = 0; j < kPvChunks; ++j) {
      if (j >= cn) break;
      const Vec vv = LoadChunk(row, c0 + j, H);
      for (int g = 0; g < GN; ++g) acc[g][j] = Fma(pg[g], vv, acc[g][j]);
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < cn; ++j) {
      const int64_t at = (c0 + j) * kLanes;
      if (at + kLanes <= H) Store(out + g * H + at, acc[g][j]);
      else StorePart(out + g * H + at, acc[g][j], H - at);
    }
}

// row[0:S] -> softmax(row), in place.
inline void SoftmaxRow(float* row, int64_t S) {
  const int64_t sv = S / kLanes * kLanes;
  float top = row[0];
  if (sv > 0) {
    Vec m = Load(row);
    for (int64_t s = kLanes; s < sv; s += kLanes) m = Max(m, Load(row + s));
    top = std::max(top, MaxOf(m));
  }
  for (int64_t s = sv; s < S; ++s) top = std::max(top, row[s]);
  const Vec tv = Bcast(top);
  Vec acc = Zero();
  for (int64_t s = 0; s < sv; s += kLanes) {
    const Vec e = ExpNonPositive(Sub(Load(row + s), tv));
    Store(row + s, e);
    acc = Add(acc, e);
  }
  float total = Sum(acc);
  for (int64_t s = sv; s < S; ++s) total += (row[s] = std::exp(row[s] - top));
  const float inv = 1.f / total;
  const Vec iv = Bcast(inv);
  for (int64_t s = 0; s < sv; s += kLanes) Store(row + s, Mul(Load(row + s), iv));
  for (int64_t s = sv; s < S; ++s) row[s] *= inv;
}

// One (row, kv head): q [G, H] fp32, k, v [S, H], valid [S]; only slots s < filled are read.
// -> out [G, H]. A row with no valid slot below `filled` averages those slots uniformly.
template <typename T>
void AttendOne(const float* q, const T* k, const T* v, const bool* valid, float* out, int64_t G, int64_t filled,
               int64_t H, float scale, std::vector<float>& scores) {
  constexpr float kMasked = -1e30f;  // As the XLA path: a fully masked row gives a uniform softmax.
  const int64_t S = filled;
  scores.assign(G * S, kMasked);
  // Scores, four slots at a time; each key row is read from memory once for all G query heads.
  float d[4];
  for (int64_t s0 = 0; s0 < S; s0 += 4) {
    const int64_t n = std::min<int64_t>(4, S - s0);
    if (s0 + 8 < S)
      for (int64_t b = 0; b < int64_t(4 * H * sizeof(T)); b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(k + (s0 + 8) * H) + b, _MM_HINT_T0);
    for (int64_t g = 0; g < G; ++g) {
      if (n == 4) {
        Dot4(q + g * H, k + s0 * H, H, H, d);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          Vec a = Zero();
          for (int64_t c = 0; c < (H + kLanes - 1) / kLanes; ++c)
            a = Fma(LoadChunk(q + g * H, c, H), LoadChunk(k + (s0 + i) * H, c, H), a);
          d[i] = Sum(a);
        }
      }
      for (int64_t i = 0; i < n; ++i)
        if (valid[s0 + i]) scores[g * S + s0 + i] = d[i] * scale;
    }
  }
  for (int64_t g = 0; g < G; ++g) SoftmaxRow(scores.data() + g * S, S);
  // out = p . v in register blocks of query heads x output channels. Masked slots have p = 0 and
  // are skipped, unless every slot is masked (then p is uniform and every slot counts).
  const bool any_valid = std::any_of(valid, valid + S, [](bool b) { return b; });
  const bool* use = any_valid ? valid : nullptr;
  const int64_t chunks = (H + kLanes - 1) / kLanes;
  for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks)
    for (int64_t g0 = 0; g0 < G; g0 += kPvHeads) {
      const float* p = scores.data() + g0 * S;
      static_assert(kPvHeads == 2, "PvBlock is instantiated for 2 query heads and 1");
      if (G - g0 >= kPvHeads) PvBlock<kPvHeads>(p, S, v, H, c0, use, out + g0 * H);
      else PvBlock<1>(p, S, v, H, c0, use, out + g0 * H);
    }
}

template <typename W>
void MatmulAll(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* w, int64_t P, int64_t N,
               float* y) {
  ParallelFor(pool, P, [=](int64_t p) {
    PanelRows(x, M, K, w + p * K * kPw, y, N, p * kPw, std::min(kPw, N - p * kPw));
  });
}

template <typename W>
void MatmulNtAll(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* e, int64_t N, float* y) {
  // x rows outer: a block of x rows stays in L1 while the unit's embedding rows stream past it
  // (from memory for the first block, from L2 after).
  constexpr int64_t kRowsPerUnit = 64;
  ParallelFor(pool, (N + kRowsPerUnit - 1) / kRowsPerUnit, [=](int64_t u) {
    const int64_t v_end = std::min(N, (u + 1) * kRowsPerUnit);
    for (int64_t m0 = 0; m0 < M; m0 += kNtMr)
      for (int64_t v0 = u * kRowsPerUnit; v0 < v_end; v0 += kNtRows)
        RowDotsRows(int(std::min<int64_t>(kNtMr, M - m0)), x + m0 * K, K, e, y + m0 * N, N, v0,
                    int(std::min<int64_t>(kNtRows, v_end - v0)));
  });
}

bool IsBf16(ffi::DataType t) { return t == ffi::DataType::BF16; }
bool IsF32OrBf16(ffi::DataType t) { return t == ffi::DataType::F32 || t == ffi::DataType::BF16; }

ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 1 || yd.size() != 2 || yd[0] != xd[0] || !IsF32OrBf16(w.element_type()))
    return ffi::Error::InvalidArgument(
        "hljax_matmul_packed: want x [M, K] f32, w packed (1-D) f32 or bf16, y [M, N] f32");
  const int64_t M = xd[0], K = xd[1], N = yd[1], P = (N + kPw - 1) / kPw;
  if (wd[0] != PackedLength(K, N))
    return ffi::Error::InvalidArgument("hljax_matmul_packed: w's length is not that of a packed [K, N] matrix "
                                       "(is the panel width the one this library was built for?)");
  if (IsBf16(w.element_type()))
    MatmulAll(pool, x.typed_data(), M, K, static_cast<const bf16*>(w.untyped_data()), P, N, y->typed_data());
  else
    MatmulAll(pool, x.typed_data(), M, K, static_cast<const float*>(w.untyped_data()), P, N, y->typed_data());
  return ffi::Error::Success();
}

ffi::Error MatmulNt(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer e, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), ed = e.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || ed.size() != 2 || yd.size() != 2 || ed[1] != xd[1] || yd[0] != xd[0] || yd[1] != ed[0] ||
      !IsF32OrBf16(e.element_type()))
    return ffi::Error::InvalidArgument("hljax_matmul_nt: want x [M, K] f32, e [N, K] f32 or bf16, y [M, N] f32");
  const int64_t M = xd[0], K = xd[1], N = ed[0];
  if (IsBf16(e.element_type()))
    MatmulNtAll(pool, x.typed_data(), M, K, static_cast<const bf16*>(e.untyped_data()), N, y->typed_data());
  else
    MatmulNtAll(pool, x.typed_data(), M, K, static_cast<const float*>(e.untyped_data()), N, y->typed_data());
  return ffi::Error::Success();
}

ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::Buffer<ffi::PRED> valid, ffi::Buffer<ffi::S32> filled,
                           ffi::ResultBuffer<ffi::F32> out, float scale) {
  // q, out: [B, K, G, H] f32; k, v: [B, K, S, H] f32 or bf16; valid: [B, S] (False: masked slot);
  // filled: [] int32, slots at or past it are not read.
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = valid.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2 || filled.dimensions().size() != 0 ||
      !std::equal(kd.begin(), kd.end(), vd.begin()) || k.element_type() != v.element_type() ||
      !IsF32OrBf16(k.element_type()) || kd[0] != qd[0] || kd[1] != qd[1] || kd[3] != qd[3] || md[0] != qd[0] ||
      md[1] != kd[2])
    return ffi::Error::InvalidArgument(
        "hljax_decode_attention: want q [B, K, G, H] f32, k and v [B, K, S, H] (both f32 or both bf16), "
        "valid [B, S], filled []");
  const int64_t B = qd[0], Kh = qd[1], G = qd[2], H = qd[3], S = kd[2];
  const int64_t used = std::clamp<int64_t>(*filled.typed_data(), 1, S);
  const float* qp = q.typed_data();
  const bool* mp = valid.typed_data();
  float* op = out->typed_data();
  auto run = [&](const auto* kp, const auto* vp) {
    ParallelFor(pool, B * Kh, [=](int64_t u) {
      thread_local std::vector<float> scores;
      const int64_t b = u / Kh;
      AttendOne(qp + u * G * H, kp + u * S * H, vp + u * S * H, mp + b * S, op + u * G * H, G, used, H, scale, scores);
    });
  };
  if (IsBf16(k.element_type()))
    run(static_cast<const bf16*>(k.untyped_data()), static_cast<const bf16*>(v.untyped_data()));
  else
    run(static_cast<const float*>(k.untyped_data()), static_cast<const float*>(v.untyped_data()));
  return ffi::Error::Success();
}

// The output of an in-place call, holding `in`'s bytes: XLA aliases the two (input_output_aliases);
// if it did not, start from a copy.
char* InPlace(const ffi::AnyBuffer& in, void* out) {
  if (out != in.untyped_data()) std::memcpy(out, in.untyped_data(), in.size_bytes());
  return static_cast<char*>(out);
}

ffi::Error KvWrite(ffi::AnyBuffer cache, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> slots,
                   ffi::Result<ffi::AnyBuffer> out) {
  // cache, out: [B, K, S, H] (one buffer: the call aliases them); x: [B, K, H] of cache's dtype;
  // slots: [B]. Row b's x goes to slot slots[b]; a slot outside [0, S) writes nothing.
  const auto cd = cache.dimensions(), xd = x.dimensions(), sd = slots.dimensions();
  if (cd.size() != 4 || xd.size() != 3 || sd.size() != 1 || xd[0] != cd[0] || xd[1] != cd[1] || xd[2] != cd[3] ||
      sd[0] != cd[0] || x.element_type() != cache.element_type() || !IsF32OrBf16(cache.element_type()))
    return ffi::Error::InvalidArgument("hljax_kv_write: want cache [B, K, S, H] f32 or bf16, x [B, K, H] of its "
                                       "dtype, slots [B]");
  const int64_t B = cd[0], K = cd[1], S = cd[2], H = cd[3];
  const int64_t es = IsBf16(cache.element_type()) ? 2 : 4;
  char* dst = InPlace(cache, out->untyped_data());
  const char* src = static_cast<const char*>(x.untyped_data());
  const int32_t* sp = slots.typed_data();
  for (int64_t b = 0; b < B; ++b) {
    if (sp[b] < 0 || sp[b] >= S) continue;
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(dst + ((b * K + k) * S + sp[b]) * H * es, src + (b * K + k) * H * es, size_t(H * es));
  }
  return ffi::Error::Success();
}

ffi::Error CopyRows(ffi::ThreadPool pool, ffi::AnyBuffer dst, ffi::AnyBuffer src, ffi::Buffer<ffi::S32> src_rows,
                    ffi::Buffer<ffi::S32> dst_rows, ffi::Result<ffi::AnyBuffer> out) {
  // dst, out: [B, K, S, H] (one buffer: the call aliases them); src: [U, K, W, H] of dst's dtype, W <= S;
  // src_rows, dst_rows: [R]. Row src_rows[r] of src fills slots [0, W) of row dst_rows[r]; a row index
  // out of range copies nothing. XLA gathers the R source rows into a temporary first (R x a prefill's
  // cache, every layer's at once), then scatters them.
  const auto dd = dst.dimensions(), sd = src.dimensions(), rd = src_rows.dimensions(), qd = dst_rows.dimensions();
  if (dd.size() != 4 || sd.size() != 4 || rd.size() != 1 || qd.size() != 1 || rd[0] != qd[0] || sd[1] != dd[1] ||
      sd[3] != dd[3] || sd[2] > dd[2] || src.element_type() != dst.element_type() || !IsF32OrBf16(dst.element_type()))
    return ffi::Error::InvalidArgument("hljax_copy_rows: want dst [B, K, S, H] f32 or bf16, src [U, K, W <= S, H] of "
                                       "its dtype, src_rows and dst_rows [R]");
  const int64_t B = dd[0], K = dd[1], S = dd[2], H = dd[3], U = sd[0], W = sd[2], R = rd[0];
  const int64_t es = IsBf16(dst.element_type()) ? 2 : 4;
  char* to = InPlace(dst, out->untyped_data());
  const char* from = static_cast<const char*>(src.untyped_data());
  const int32_t* sr = src_rows.typed_data();
  const int32_t* dr = dst_rows.typed_data();
  ParallelFor(pool, R * K, [=](int64_t u) {
    const int64_t r = u / K, k = u % K;
    if (sr[r] < 0 || sr[r] >= U || dr[r] < 0 || dr[r] >= B) return;
    std::memcpy(to + (dr[r] * K + k) * S * H * es, from + (sr[r] * K + k) * W * H * es, size_t(W * H * es));
  });
  return ffi::Error::Success();
}

ffi::Error Unpack(ffi::ThreadPool pool, ffi::AnyBuffer w, ffi::AnyBuffer after, ffi::Result<ffi::AnyBuffer> out) {
  // w: a packed [K, N] matrix (1-D, f32 or bf16); out: [K, N] of its dtype, row-major. For XLA's bf16 dot
  // on a prefill's many rows: XLA's own unpacking (a transpose of 48-column runs) moved under 1 GB/s.
  // `after` is not read: the call waits for it (the product's input), so that XLA's scheduler cannot
  // unpack every layer's weights at once at the start of the program and hold all the copies.
  const auto wd = w.dimensions(), od = out->dimensions();
  if (wd.size() != 1 || od.size() != 2 || w.element_type() != out->element_type() || !IsF32OrBf16(w.element_type()) ||
      wd[0] != PackedLength(od[0], od[1]))
    return ffi::Error::InvalidArgument("hljax_unpack: want w packed (1-D) f32 or bf16 and out [K, N] of its dtype");
  const int64_t K = od[0], N = od[1], es = IsBf16(w.element_type()) ? 2 : 4;
  const char* from = static_cast<const char*>(w.untyped_data());
  char* to = static_cast<char*>(out->untyped_data());
  // A panel at a time, read in order (its rows are `cols` apart): reading row k of every panel in turn
  // instead strode K x kPw elements between reads and ran at a tenth of the speed.
  ParallelFor(pool, (N + kPw - 1) / kPw, [=](int64_t p) {
    const int64_t n0 = p * kPw, cols = std::min(kPw, N - n0);
    const char* panel = from + n0 * K * es;
    for (int64_t k = 0; k < K; ++k) std::memcpy(to + (k * N + n0) * es, panel + k * cols * es, size_t(cols * es));
  });
  return ffi::Error::Success();
}

ffi::Error TakeRows(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> ids, ffi::ResultBuffer<ffi::F32> out) {
  // table: [V, D] f32 or bf16; ids: [N]; out: [N, D] f32, row n = table[ids[n]] (NaN for an id outside
  // [0, V), as jnp.take). XLA:CPU gathers a bf16 table by first converting (or bit-casting) all of it.
  const auto td = table.dimensions(), id = ids.dimensions(), od = out->dimensions();
  if (td.size() != 2 || id.size() != 1 || od.size() != 2 || od[0] != id[0] || od[1] != td[1] ||
      !IsF32OrBf16(table.element_type()))
    return ffi::Error::InvalidArgument("hljax_take_rows: want table [V, D] f32 or bf16, ids [N], out [N, D] f32");
  const int64_t V = td[0], D = td[1], N = id[0];
  const int32_t* ip = ids.typed_data();
  float* op = out->typed_data();
  for (int64_t n = 0; n < N; ++n) {
    float* row = op + n * D;
    if (ip[n] < 0 || ip[n] >= V) {
      std::fill(row, row + D, std::nanf(""));
    } else if (IsBf16(table.element_type())) {
      const bf16* src = static_cast<const bf16*>(table.untyped_data()) + ip[n] * D;
      for (int64_t d = 0; d < D; ++d) row[d] = ToFloat(src[d]);
    } else {
      const float* src = static_cast<const float*>(table.untyped_data()) + ip[n] * D;
      std::copy(src, src + D, row);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxMatmulPacked, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxMatmulNt, MatmulNt,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxKvWrite, KvWrite,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxCopyRows, CopyRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxUnpack, Unpack,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxTakeRows, TakeRows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Columns per packed panel in this build (cpu_decode.py checks it against its own).
extern "C" int HljaxPanelWidth() { return int(kPw); }
