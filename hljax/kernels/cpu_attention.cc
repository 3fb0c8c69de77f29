// Masked grouped-query attention for training and scoring on CPUs, fp32, forward and backward, as XLA
// FFI custom calls (flash-attention style: scores never leave a tile).
//
// Why: XLA:CPU runs attention as separate programs for the scores, the mask, the softmax and the two
// products, each writing a [rows, keys] tensor to memory, plus the transposes between them; on the
// tiny proposer's shapes (hidden 128, 1,000-2,000 tokens) that was about 60% of an SFT step, for a
// few percent of its FLOPs. Here one (query tile, key tile) pair is scored, masked, exponentiated and
// multiplied in a buffer that stays in L1/L2, with an online softmax across key tiles (forward) and
// the probabilities recomputed from the saved log-sum-exp (backward). Tiles whose mask is all False
// (the causal upper triangle, padding) are skipped.
//
// Layouts are the model's: q, o [B, T, N, H]; k, v [B, K, S, H] with N = K x G (the G query heads of
// a kv head share its keys); mask [B, T, S] (False: not attended); lse [B, T, N]. A row with no
// attended key gets o = 0 and lse = +inf (its gradient is 0). H must be a multiple of the vector width.
//
// A generation engine's prefill (hljax_prefill_attention) reads k and v as the projections leave them,
// [B, S, K, H] with S = T, and writes them to the KV cache's [B, K, S, H] layout as it goes: XLA:CPU
// otherwise transposes q, k (twice) and v to and from the layouts of its dots, copies that took a
// quarter of a bf16 0.6B prefill's non-projection time.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "cpu_simd.h"

namespace {

constexpr int64_t kKeyTile = 64;    // Keys per tile: a multiple of kLanes.
constexpr int64_t kQueryRows = 64;  // Query rows per tile (time steps x the G heads of one kv head).
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__)
constexpr int kGemmRows = 6, kGemmVecs = 4;  // 24 accumulators + 4 loads + 1 broadcast <= 32 registers.
#else
constexpr int kGemmRows = 6, kGemmVecs = 2;  // 12 + 2 + 1 <= 16.
#endif

// C[0:MR, 0:NV*kLanes] (+)= sum over k < K of A(m, k) B[k, :], with A(m, k) = a[m * am + k * ak]
// (so A may be read transposed), B rows ldb apart, C rows ldc apart.
template <int MR, int NV>
inline void GemmBlock(const float* a, int64_t am, int64_t ak, const float* b, int64_t ldb, float* c, int64_t ldc,
                      int64_t K, bool accumulate) {
  Vec acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = accumulate ? Load(c + i * ldc + j * kLanes) : Zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = Load(b + k * ldb + j * kLanes);
    for (int i = 0; i < MR; ++i) {
      const Vec av = Bcast(a[i * am + k * ak]);
      for (int j = 0; j < NV; ++j) acc[i][j] = Fma(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) Store(c + i * ldc + j * kLanes, acc[i][j]);
}

template <int NV>
inline void GemmRows(int mr, const float* a, int64_t am, int64_t ak, const float* b, int64_t ldb, float* c,
                     int64_t ldc, int64_t K, bool accumulate) {
  static_assert(kGemmRows == 6, "GemmRows dispatches 1..6 rows");
  switch (mr) {
    case 1: return GemmBlock<1, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
    case 2: return GemmBlock<2, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
    case 3: return GemmBlock<3, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
    case 4: return GemmBlock<4, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
    case 5: return GemmBlock<5, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
    default: return GemmBlock<6, NV>(a, am, ak, b, ldb, c, ldc, K, accumulate);
  }
}

// C[M, N] (+)= A B for A(m, k) = a[m * am + k * ak], B [K, N] (rows ldb apart), N a multiple of kLanes.
void Gemm(const float* a, int64_t am, int64_t ak, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t M,
          int64_t N, int64_t K, bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += kGemmVecs * kLanes) {
    const int64_t nv = std::min<int64_t>(kGemmVecs, (N - n0) / kLanes);
    for (int64_t m0 = 0; m0 < M; m0 += kGemmRows) {
      const int mr = int(std::min<int64_t>(kGemmRows, M - m0));
      const float* am0 = a + m0 * am;
      float* c0 = c + m0 * ldc + n0;
      switch (nv) {
        case 1: GemmRows<1>(mr, am0, am, ak, b + n0, ldb, c0, ldc, K, accumulate); break;
#if defined(__AVX512F__)
        case 2: GemmRows<2>(mr, am0, am, ak, b + n0, ldb, c0, ldc, K, accumulate); break;
        case 3: GemmRows<3>(mr, am0, am, ak, b + n0, ldb, c0, ldc, K, accumulate); break;
        default: GemmRows<4>(mr, am0, am, ak, b + n0, ldb, c0, ldc, K, accumulate); break;
#else
        default: GemmRows<2>(mr, am0, am, ak, b + n0, ldb, c0, ldc, K, accumulate); break;
#endif
      }
    }
  }
}

struct Dims {
  int64_t B, T, N, K, G, S, H;
  float scale;
  int64_t tq;         // Time steps per query tile.
  bool token_major;   // k, v are [B, S, K, H] (a prefill's fresh keys), not [B, K, S, H].
};

// Offset of kv head kh of batch row b in k or v, and the elements between its consecutive keys.
inline int64_t KvHead(const Dims& d, int64_t b, int64_t kh) {
  return d.token_major ? (b * d.S * d.K + kh) * d.H : (b * d.K + kh) * d.S * d.H;
}
inline int64_t KvStride(const Dims& d) { return d.token_major ? d.K * d.H : d.H; }

// The dimensions of q [B, T, N, H] against S keys of K heads, and the query tile they set.
Dims MakeDims(int64_t B, int64_t T, int64_t N, int64_t K, int64_t S, int64_t H, float scale, bool token_major) {
  const int64_t G = N / K;
  return Dims{B, T, N, K, G, S, H, scale, std::max<int64_t>(1, kQueryRows / G), token_major};
}

// Whether any / every key of [s0, s0 + nk) is attended by the query time steps [t0, t0 + tq) of row b.
void TileMask(const Dims& d, const bool* mask, int64_t b, int64_t t0, int64_t tq, int64_t s0, int64_t nk, bool* any,
              bool* all) {
  *any = false;
  *all = true;
  for (int64_t ti = 0; ti < tq; ++ti) {
    const bool* m = mask + ((b * d.T) + t0 + ti) * d.S + s0;
    for (int64_t j = 0; j < nk; ++j) {
      *any |= m[j];
      *all &= m[j];
    }
  }
}

// Scores of a tile for its R query rows and keys [s0, s0 + nk): the score of row r and key j at
// sc[r * rs + j * ks] (ks = 1: [R, width] rows; rs = 1: held transposed). Masked keys, and the columns
// from nk to width, become -inf.
void MaskScores(const Dims& d, const bool* mask, int64_t b, int64_t t0, int64_t R, int64_t s0, int64_t nk,
                int64_t width, float* sc, int64_t rs, int64_t ks) {
  for (int64_t r = 0; r < R; ++r) {
    const bool* m = mask + ((b * d.T) + t0 + r / d.G) * d.S + s0;
    float* row = sc + r * rs;
    for (int64_t j = 0; j < nk; ++j)
      if (!m[j]) row[j * ks] = kNegInf;
    for (int64_t j = nk; j < width; ++j) row[j * ks] = kNegInf;
  }
}

// rows [R, H] of x [B, T, N, H] for query tile (b, kv head kh, t0): row r = (t0 + r / G, head kh G + r % G).
template <typename T>
inline T* QueryRow(const Dims& d, T* x, int64_t b, int64_t kh, int64_t t0, int64_t r) {
  return x + (((b * d.T) + t0 + r / d.G) * d.N + kh * d.G + r % d.G) * d.H;
}

// kt[h, j] = k[s0 + j, h] for j < nk, 0 for nk <= j < width (k rows H apart, kt rows ld apart).
void Transpose(const float* k, int64_t H, int64_t s0, int64_t nk, int64_t width, float* kt, int64_t ld) {
  for (int64_t h = 0; h < H; ++h) {
    float* out = kt + h * ld;
    for (int64_t j = 0; j < nk; ++j) out[j] = k[(s0 + j) * H + h];
    for (int64_t j = nk; j < width; ++j) out[j] = 0.f;
  }
}

struct ForwardScratch {
  std::vector<float> qt, sc, acc, m, l, alpha;
};

// One query tile of one kv head: o and lse for its R = tq x G rows.
//
// The scores are computed transposed, k q^T (one key per row, one query row per lane): q is
// transposed once per query tile, where q k^T needs each key tile transposed for every query tile
// (a quarter of the tile's time at 1,024 keys), and the online softmax runs one query row per lane.
void ForwardTile(const Dims& d, const float* q, const float* k, const float* v, const bool* mask, float* o, float* lse,
                 int64_t b, int64_t kh, int64_t t0, ForwardScratch& s) {
  const int64_t H = d.H, tq = std::min(d.tq, d.T - t0), R = tq * d.G;
  const int64_t Rp = (R + kLanes - 1) / kLanes * kLanes;  // Query rows padded to whole vectors (zero queries).
  s.qt.assign(H * Rp, 0.f);
  s.sc.resize(kKeyTile * Rp);
  s.acc.assign(R * H, 0.f);
  s.m.assign(Rp, kNegInf);
  s.l.assign(Rp, 0.f);
  s.alpha.resize(Rp);
  for (int64_t r = 0; r < R; ++r) {
    const float* src = QueryRow(d, q, b, kh, t0, r);
    for (int64_t h = 0; h < H; ++h) s.qt[h * Rp + r] = src[h] * d.scale;
  }
  const float* kb = k + KvHead(d, b, kh);
  const float* vb = v + KvHead(d, b, kh);
  const int64_t ks = KvStride(d);
  // Where a row has kept no key yet its maximum is -inf; the lowest finite float stands in for it as the
  // exponent's base, so that exp(-inf - base) is 0 rather than NaN.
  const Vec lowest = Bcast(std::numeric_limits<float>::lowest());
  for (int64_t s0 = 0; s0 < d.S; s0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, d.S - s0);
    bool any, all;
    TileMask(d, mask, b, t0, tq, s0, nk, &any, &all);
    if (!any) continue;
    float* sc = s.sc.data();
    Gemm(kb + s0 * ks, ks, 1, s.qt.data(), Rp, sc, Rp, nk, Rp, H, false);
    if (!all) MaskScores(d, mask, b, t0, R, s0, nk, nk, sc, 1, Rp);  // sc [nk, Rp]: key j, row r at j * Rp + r.
    for (int64_t r0 = 0; r0 < Rp; r0 += kLanes) {
      const Vec old = Load(s.m.data() + r0);
      Vec top = old;
      for (int64_t j = 0; j < nk; ++j) top = Max(top, Load(sc + j * Rp + r0));
      const Vec base = Max(top, lowest);
      Vec sum = Zero();
      for (int64_t j = 0; j < nk; ++j) {
        const Vec p = ExpNonPositive(Sub(Load(sc + j * Rp + r0), base));
        Store(sc + j * Rp + r0, p);
        sum = Add(sum, p);
      }
      const Vec alpha = ExpNonPositive(Sub(old, base));
      Store(s.l.data() + r0, Add(Mul(Load(s.l.data() + r0), alpha), sum));
      Store(s.m.data() + r0, top);
      Store(s.alpha.data() + r0, alpha);
    }
    for (int64_t r = 0; r < R; ++r) {
      if (s.alpha[r] == 1.f) continue;
      const Vec av = Bcast(s.alpha[r]);
      float* acc = s.acc.data() + r * H;
      for (int64_t h = 0; h < H; h += kLanes) Store(acc + h, Mul(Load(acc + h), av));
    }
    Gemm(sc, 1, Rp, vb + s0 * ks, ks, s.acc.data(), H, R, H, nk, true);
  }
  for (int64_t r = 0; r < R; ++r) {
    float* dst = QueryRow(d, o, b, kh, t0, r);
    const float inv = s.l[r] > 0.f ? 1.f / s.l[r] : 0.f;
    for (int64_t h = 0; h < H; ++h) dst[h] = s.acc[r * H + h] * inv;
    const int64_t t = t0 + r / d.G, n = kh * d.G + r % d.G;
    if (lse != nullptr) lse[(b * d.T + t) * d.N + n] =
        s.l[r] > 0.f ? s.m[r] + std::log(s.l[r]) : std::numeric_limits<float>::infinity();
  }
}

struct BackwardScratch {
  std::vector<float> kt, vt, qs, dos, dr, lse, sc, dp, dq;
};

// One kv head of one batch row, all its query tiles: dq for its G heads, dk and dv.
void BackwardHead(const Dims& d, const float* q, const float* k, const float* v, const bool* mask, const float* o,
                  const float* lse, const float* dout, float* dq, float* dk, float* dv, int64_t b, int64_t kh,
                  BackwardScratch& s) {
  const int64_t H = d.H, S = d.S, Sp = (S + kKeyTile - 1) / kKeyTile * kKeyTile;
  const float* kb = k + (b * d.K + kh) * S * H;
  const float* vb = v + (b * d.K + kh) * S * H;
  float* dkb = dk + (b * d.K + kh) * S * H;
  float* dvb = dv + (b * d.K + kh) * S * H;
  std::fill(dkb, dkb + S * H, 0.f);
  std::fill(dvb, dvb + S * H, 0.f);
  s.kt.resize(H * Sp);
  s.vt.resize(H * Sp);
  Transpose(kb, H, 0, S, Sp, s.kt.data(), Sp);
  Transpose(vb, H, 0, S, Sp, s.vt.data(), Sp);
  const int64_t rows = d.tq * d.G;
  s.qs.resize(rows * H);
  s.dos.resize(rows * H);
  s.dr.resize(rows);
  s.lse.resize(rows);
  s.sc.resize(rows * kKeyTile);
  s.dp.resize(rows * kKeyTile);
  s.dq.resize(rows * H);
  for (int64_t t0 = 0; t0 < d.T; t0 += d.tq) {
    const int64_t tq = std::min(d.tq, d.T - t0), R = tq * d.G;
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = QueryRow(d, q, b, kh, t0, r);
      const float* gr = QueryRow(d, dout, b, kh, t0, r);
      const float* orow = QueryRow(d, o, b, kh, t0, r);
      float dot = 0.f;
      for (int64_t h = 0; h < H; ++h) {
        s.qs[r * H + h] = qr[h] * d.scale;
        s.dos[r * H + h] = gr[h];
        dot += gr[h] * orow[h];
      }
      s.dr[r] = dot;
      s.lse[r] = lse[(b * d.T + t0 + r / d.G) * d.N + kh * d.G + r % d.G];
    }
    std::fill(s.dq.begin(), s.dq.begin() + R * H, 0.f);
    for (int64_t s0 = 0; s0 < S; s0 += kKeyTile) {
      const int64_t nk = std::min(kKeyTile, S - s0);
      bool any, all;
      TileMask(d, mask, b, t0, tq, s0, nk, &any, &all);
      if (!any) continue;
      float* sc = s.sc.data();
      float* dp = s.dp.data();
      Gemm(s.qs.data(), H, 1, s.kt.data() + s0, Sp, sc, kKeyTile, R, kKeyTile, H, false);
      if (!all || nk < kKeyTile) MaskScores(d, mask, b, t0, R, s0, nk, kKeyTile, sc, kKeyTile, 1);
      for (int64_t r = 0; r < R; ++r) {  // p = exp(score - lse): the forward's probabilities.
        float* row = sc + r * kKeyTile;
        const Vec lv = Bcast(s.lse[r]);
        for (int64_t j = 0; j < kKeyTile; j += kLanes) Store(row + j, ExpNonPositive(Sub(Load(row + j), lv)));
      }
      Gemm(sc, 1, kKeyTile, s.dos.data(), H, dvb + s0 * H, H, nk, H, R, true);            // dv += p^T do
      Gemm(s.dos.data(), H, 1, s.vt.data() + s0, Sp, dp, kKeyTile, R, kKeyTile, H, false);  // dp = do v^T
      for (int64_t r = 0; r < R; ++r) {  // ds = p (dp - rowsum(do o)), in dp.
        float* prow = sc + r * kKeyTile;
        float* grow = dp + r * kKeyTile;
        const Vec dv_ = Bcast(s.dr[r]);
        for (int64_t j = 0; j < kKeyTile; j += kLanes) Store(grow + j, Mul(Load(prow + j), Sub(Load(grow + j), dv_)));
      }
      Gemm(dp, kKeyTile, 1, kb + s0 * H, H, s.dq.data(), H, R, H, nk, true);  // dq += ds k (times scale below)
      Gemm(dp, 1, kKeyTile, s.qs.data(), H, dkb + s0 * H, H, nk, H, R, true);  // dk += ds^T (scale q)
    }
    for (int64_t r = 0; r < R; ++r) {
      float* dst = QueryRow(d, dq, b, kh, t0, r);
      for (int64_t h = 0; h < H; ++h) dst[h] = s.dq[r * H + h] * d.scale;
    }
  }
}

// Shapes of q [B, T, N, H], k and v [B, K, S, H], mask [B, T, S]; an error names what is wrong.
ffi::Error CheckShapes(const char* name, ffi::Span<const int64_t> qd, ffi::Span<const int64_t> kd,
                       ffi::Span<const int64_t> vd, ffi::Span<const int64_t> md, Dims* d, float scale) {
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 3 ||
      !std::equal(kd.begin(), kd.end(), vd.begin()) || kd[0] != qd[0] || kd[3] != qd[3] || qd[2] % kd[1] != 0 ||
      md[0] != qd[0] || md[1] != qd[1] || md[2] != kd[2] || qd[3] % kLanes != 0)
    return ffi::Error::InvalidArgument(std::string(name) +
                                       ": want q [B, T, N, H], k and v [B, K, S, H] with K dividing N, mask [B, T, S], "
                                       "H a multiple of " + std::to_string(kLanes));
  *d = MakeDims(qd[0], qd[1], qd[2], kd[1], kd[2], qd[3], scale, false);
  return ffi::Error::Success();
}

ffi::Error AttentionForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> o,
                            ffi::ResultBuffer<ffi::F32> lse, float scale) {
  Dims d;
  if (auto e = CheckShapes("hljax_attention_forward", q.dimensions(), k.dimensions(), v.dimensions(),
                           mask.dimensions(), &d, scale);
      e.failure())
    return e;
  const int64_t tiles = (d.T + d.tq - 1) / d.tq;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float *op = o->typed_data(), *lp = lse->typed_data();
  ParallelFor(pool, d.B * d.K * tiles, [=](int64_t u) {
    thread_local ForwardScratch scratch;
    const int64_t tile = u % tiles, bk = u / tiles;
    ForwardTile(d, qp, kp, vp, mp, op, lp, bk / d.K, bk % d.K, tile * d.tq, scratch);
  });
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                             ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> o,
                             ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout, ffi::ResultBuffer<ffi::F32> dq,
                             ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv, float scale) {
  Dims d;
  if (auto e = CheckShapes("hljax_attention_backward", q.dimensions(), k.dimensions(), v.dimensions(),
                           mask.dimensions(), &d, scale);
      e.failure())
    return e;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data(), *op = o.typed_data(),
              *lp = lse.typed_data(), *gp = dout.typed_data();
  const bool* mp = mask.typed_data();
  float *dqp = dq->typed_data(), *dkp = dk->typed_data(), *dvp = dv->typed_data();
  // One unit per (batch row, kv head): it alone writes that head's dk and dv and its G heads' dq.
  ParallelFor(pool, d.B * d.K, [=](int64_t u) {
    thread_local BackwardScratch scratch;
    BackwardHead(d, qp, kp, vp, mp, op, lp, gp, dqp, dkp, dvp, u / d.K, u % d.K, scratch);
  });
  return ffi::Error::Success();
}

// fp32 -> bf16 bits, rounding to nearest even as XLA's convert does (a NaN stays a quiet NaN).
inline bf16 ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);
  return bf16((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Keys or values of kv head kh of row b, x [B, T, K, H] fp32, into cache [B, K, T, H] (fp32 or bf16).
void WriteCache(const Dims& d, const float* x, void* cache, bool bf16_cache, int64_t b, int64_t kh) {
  const int64_t H = d.H;
  for (int64_t t = 0; t < d.T; ++t) {
    const float* src = x + ((b * d.T + t) * d.K + kh) * H;
    const int64_t at = ((b * d.K + kh) * d.T + t) * H;
    if (bf16_cache) {
      bf16* dst = static_cast<bf16*>(cache) + at;
      for (int64_t h = 0; h < H; ++h) dst[h] = ToBf16(src[h]);
    } else {
      std::memcpy(static_cast<float*>(cache) + at, src, size_t(H) * 4);
    }
  }
}

ffi::Error PrefillAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> o,
                            ffi::Result<ffi::AnyBuffer> kc, ffi::Result<ffi::AnyBuffer> vc, float scale) {
  // q, o: [B, T, N, H]; k, v: [B, T, K, H], the fresh keys and values as the projections leave them;
  // mask [B, T, T]; kc, vc: [B, K, T, H] f32 or bf16, the KV cache of the T fresh slots.
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  const auto cd = kc->dimensions();
  const auto type = kc->element_type();
  if (qd.size() != 4 || kd.size() != 4 || md.size() != 3 || cd.size() != 4 || !std::equal(kd.begin(), kd.end(), vd.begin()) ||
      kd[0] != qd[0] || kd[1] != qd[1] || kd[3] != qd[3] || qd[2] % kd[2] != 0 || md[0] != qd[0] || md[1] != qd[1] ||
      md[2] != qd[1] || cd[0] != kd[0] || cd[1] != kd[2] || cd[2] != kd[1] || cd[3] != kd[3] ||
      !std::equal(cd.begin(), cd.end(), vc->dimensions().begin()) || vc->element_type() != type ||
      (type != ffi::DataType::F32 && type != ffi::DataType::BF16) || qd[3] % kLanes != 0)
    return ffi::Error::InvalidArgument(
        "hljax_prefill_attention: want q [B, T, N, H], k and v [B, T, K, H] with K dividing N, mask [B, T, T], "
        "caches [B, K, T, H] both f32 or both bf16, H a multiple of " + std::to_string(kLanes));
  const Dims d = MakeDims(qd[0], qd[1], qd[2], kd[2], qd[1], qd[3], scale, true);
  const int64_t tiles = (d.T + d.tq - 1) / d.tq;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float* op = o->typed_data();
  void *kcp = kc->untyped_data(), *vcp = vc->untyped_data();
  const bool bf16_cache = type == ffi::DataType::BF16;
  ParallelFor(pool, d.B * d.K * tiles, [=](int64_t u) {
    thread_local ForwardScratch scratch;
    const int64_t tile = u % tiles, bk = u / tiles, b = bk / d.K, kh = bk % d.K;
    ForwardTile(d, qp, kp, vp, mp, op, nullptr, b, kh, tile * d.tq, scratch);
    if (tile == 0) {  // One unit per kv head writes its keys and values in the cache's layout.
      WriteCache(d, kp, kcp, bf16_cache, b, kh);
      WriteCache(d, vp, vcp, bf16_cache, b, kh);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxPrefillAttention, PrefillAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxAttentionForward, AttentionForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxAttentionBackward, AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
