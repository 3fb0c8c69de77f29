// bf16 products on AMX tiles, reading the weights where they lie: Y[M, N] = X[M, K] @ W[K, N] for a
// bf16 X and a W packed in column panels (cpu_decode.py's `pack`), fp32 out. For a prefill's many rows
// on a CPU with AMX.
//
// XLA's bf16 dot runs on AMX too, but on a row-major weight, so the engine unpacked each packed panel
// for the call (0.2 s of a 0.86 s 0.6B prefill, docs/benchmarks.md). Here X is first laid out tile by
// tile (zero-padded to whole tiles); each unit of work takes two panels (96 columns = 6 tiles of 16),
// rewrites them once into AMX's pair-interleaved layout (rows 2i and 2i+1 of a column side by side:
// what TDPBF16PS multiplies) in a buffer that stays in L2, then multiplies row tiles in pairs by
// column tiles in pairs, sums in tiles over all keys, stored into Y.
//
// The tile instructions are compiled for these functions only (target attributes), so the library
// still loads on CPUs without AMX; cpu_decode.py calls them only where /proc/cpuinfo lists amx_bf16
// and Linux granted this process the tile state (HljaxAmxInit).
//
// On CPUs with AVX-512 BF16 but no AMX (AMD Zen 4), the same product by VDPBF16PS (MatmulBf16Dot):
// the same pair-interleaved panels, multiplied in strips of 8 rows with the sums in registers.

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "cpu_simd.h"

namespace {

constexpr int64_t kTileRows = 16;                   // Rows of X (and of Y) per tile.
constexpr int64_t kTileKeys = 32;                   // bf16 products per tile row (64 bytes).
constexpr int64_t kTileCols = 16;                   // fp32 columns of Y per tile.
constexpr int64_t kTileElems = kTileRows * kTileKeys;  // bf16 per X or weight tile (1 KB).
constexpr int64_t kUnitPanels = 2;                  // Panels per unit of work: 6 column tiles, 3 pairs.
constexpr int64_t kUnitTiles = kUnitPanels * kPw / kTileCols;

// AMX's tile configuration (palette 1): tiles 0-3 accumulate Y, 4-5 hold X, 6-7 the weights; every
// tile 16 rows of 64 bytes (16 fp32, 32 bf16, or 16 pairs of bf16).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig MakeConfig() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kTileRows;
    c.colsb[t] = 64;
  }
  return c;
}

__attribute__((target("amx-tile"))) void LoadConfig(const TileConfig& c) { _tile_loadconfig(&c); }

// Rows 16 mb to 16 mb + 15 of x [M, K] -> their tiles in out [Mp / 16][Kp / 32][16][32], zero past M
// rows and K keys: each tile one contiguous KB, so a tile load reads 16 consecutive lines.
void PackRows(const bf16* x, int64_t M, int64_t K, int64_t mb, int64_t Kp, bf16* out) {
  for (int64_t kb = 0; kb < Kp / kTileKeys; ++kb) {
    bf16* tile = out + (mb * (Kp / kTileKeys) + kb) * kTileElems;
    for (int64_t r = 0; r < kTileRows; ++r) {
      const int64_t m = mb * kTileRows + r, k0 = kb * kTileKeys;
      const int64_t n = m < M ? std::clamp<int64_t>(K - k0, 0, kTileKeys) : 0;
      if (n > 0) std::memcpy(tile + r * kTileKeys, x + m * K + k0, n * sizeof(bf16));
      std::fill(tile + r * kTileKeys + n, tile + (r + 1) * kTileKeys, bf16(0));
    }
  }
}

// `panels` consecutive packed panels of a [K, N] matrix from column n0 (the last may be narrow, rows
// `cols` apart; columns past N read as 0) -> per column tile t, [Kp / 2][16][2] bf16: pair i holds
// rows 2i and 2i + 1 of the tile's 16 columns, what TDPBF16PS multiplies.
__attribute__((target("avx512f"))) void Interleave(const bf16* w, int64_t K, int64_t N, int64_t n0, int64_t panels,
                                                   int64_t Kp, bf16* out) {
  alignas(64) bf16 pad[2][kPw];
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t cols = std::min(kPw, N - n0 - q * kPw);
    const bf16* panel = w + (n0 + q * kPw) * K;  // Every panel before it is full.
    for (int64_t i = 0; i < Kp / 2; ++i) {
      const bf16* rows[2];
      for (int r = 0; r < 2; ++r) {
        const int64_t k = 2 * i + r;
        if (cols == kPw && k < K) {
          rows[r] = panel + k * kPw;
        } else {  // A narrow panel's row, or a key past K: through a zero-padded copy.
          std::fill(pad[r], pad[r] + kPw, bf16(0));
          if (k < K) std::memcpy(pad[r], panel + k * cols, cols * sizeof(bf16));
          rows[r] = pad[r];
        }
      }
      for (int64_t t = 0; t < kPw / kTileCols; ++t) {
        const __m512i even = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(rows[0] + t * kTileCols)));
        const __m512i odd = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(rows[1] + t * kTileCols)));
        bf16* dst = out + ((q * kPw / kTileCols + t) * (Kp / 2) + i) * 2 * kTileCols;
        _mm512_storeu_si512(dst, _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
      }
    }
  }
}

// The next key step's tiles into L1 while this one's products run: the tiles stream from L2 (a pair of
// X's row tiles and the unit's weights are 64-192 KB at 0.6B's shapes), and without it the products
// ran at ~0.8x (thread time, 512 rows, 1024 x 3072 and 3072 x 1024).
template <int MR, int NR>
inline void Prefetch(const bf16* a0, const bf16* a1, const bf16* b0, const bf16* b1, int64_t at) {
  for (int64_t line = 0; line < kTileElems * int64_t(sizeof(bf16)); line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(a0 + at) + line, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b0 + at) + line, _MM_HINT_T0);
    if constexpr (MR > 1) _mm_prefetch(reinterpret_cast<const char*>(a1 + at) + line, _MM_HINT_T0);
    if constexpr (NR > 1) _mm_prefetch(reinterpret_cast<const char*>(b1 + at) + line, _MM_HINT_T0);
  }
}

// c[0:16*MR, 0:16*NR] (rows ldc fp32 apart) = MR row tiles of X (a0, a1: consecutive key tiles) @ NR
// interleaved column tiles (b0, b1), over `steps` tiles of keys. 2 x 2 reads 4 tiles per 4
// products; each product is issued as soon as its two tiles are in (~10% faster than loads first).
template <int MR, int NR>
__attribute__((target("amx-tile,amx-bf16"))) void Block(const bf16* a0, const bf16* a1, const bf16* b0, const bf16* b1,
                                                       int64_t steps, float* c, int64_t ldc) {
  _tile_zero(0);
  if constexpr (NR > 1) _tile_zero(1);
  if constexpr (MR > 1) _tile_zero(2);
  if constexpr (MR > 1 && NR > 1) _tile_zero(3);
  for (int64_t k = 0; k < steps; ++k) {
    if (k + 1 < steps) Prefetch<MR, NR>(a0, a1, b0, b1, (k + 1) * kTileElems);
    _tile_loadd(4, a0 + k * kTileElems, 64);
    _tile_loadd(6, b0 + k * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NR > 1) {
      _tile_loadd(7, b1 + k * kTileElems, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MR > 1) {
      _tile_loadd(5, a1 + k * kTileElems, 64);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NR > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t ld = ldc * sizeof(float);
  _tile_stored(0, c, ld);
  if constexpr (NR > 1) _tile_stored(1, c + kTileCols, ld);
  if constexpr (MR > 1) _tile_stored(2, c + kTileRows * ldc, ld);
  if constexpr (MR > 1 && NR > 1) _tile_stored(3, c + kTileRows * ldc + kTileCols, ld);
}

// Y[:, n0 : n0 + 96] = X @ the unit's two panels (or one, at the end): interleaved once, then row
// tiles in pairs against column tiles in pairs, over all keys with the sums in tiles, stored straight
// into Y; a row pair that reaches past M or a narrow unit's columns go through `part`.
void Unit(const bf16* a, int64_t M, int64_t Kp, const bf16* w, int64_t K, int64_t N, int64_t n0, float* y,
          std::vector<bf16>& b) {
  static const TileConfig config = MakeConfig();
  LoadConfig(config);  // Per unit: tile state is per thread, and other code (XLA's dots) may reconfigure.
  const int64_t panels = std::min(kUnitPanels, (N - n0 + kPw - 1) / kPw);
  const int64_t tiles = panels * kPw / kTileCols, cols = std::min(kUnitPanels * kPw, N - n0);
  b.resize(size_t(tiles) * Kp * kTileCols);
  Interleave(w, K, N, n0, panels, Kp, b.data());
  const int64_t Mb = (M + kTileRows - 1) / kTileRows, steps = Kp / kTileKeys;
  const int64_t a_tile = steps * kTileElems, b_tile = Kp * kTileCols;
  constexpr int64_t ldp = kUnitTiles * kTileCols;
  alignas(64) float part[2 * kTileRows * ldp];
  for (int64_t mb = 0; mb < Mb; mb += 2) {
    const bf16* a0 = a + mb * a_tile;
    const bool two = mb + 1 < Mb;
    const int64_t rows = std::min((two ? 2 : 1) * kTileRows, M - mb * kTileRows);
    const bool direct = rows == (two ? 2 : 1) * kTileRows && cols == tiles * kTileCols;
    float* c = direct ? y + mb * kTileRows * N + n0 : part;
    const int64_t ldc = direct ? N : ldp;
    for (int64_t t = 0; t < tiles; t += 2) {
      const bf16* b0 = b.data() + t * b_tile;
      float* ct = c + t * kTileCols;
      if (t + 1 < tiles) {
        if (two) Block<2, 2>(a0, a0 + a_tile, b0, b0 + b_tile, steps, ct, ldc);
        else Block<1, 2>(a0, nullptr, b0, b0 + b_tile, steps, ct, ldc);
      } else {
        if (two) Block<2, 1>(a0, a0 + a_tile, b0, nullptr, steps, ct, ldc);
        else Block<1, 1>(a0, nullptr, b0, nullptr, steps, ct, ldc);
      }
    }
    if (!direct)
      for (int64_t r = 0; r < rows; ++r) std::copy(part + r * ldp, part + r * ldp + cols, y + (mb * kTileRows + r) * N + n0);
  }
}

int64_t RoundUp(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// --- The same product with AVX-512 BF16 dots (VDPBF16PS), for CPUs that have them but no AMX (AMD
// Zen 4 on): each instruction multiplies 16 column pairs of the weights by one pair of X's keys
// broadcast, twice the fp32 FMA's products per instruction.

constexpr int64_t kStripRows = 8;  // Rows per register block: 8 x 3 sums, 3 weight vectors, 1 broadcast.

// y[0:MR, 0:cols] (rows ldy apart) = MR rows of x (ldx apart, keys in pairs) @ one interleaved panel
// (b: Interleave's three column tiles, tile_stride apart), over `pairs` key pairs.
template <int MR>
__attribute__((target("avx512f,avx512bf16"))) void Strip(const bf16* x, int64_t ldx, const bf16* b,
                                                         int64_t tile_stride, int64_t pairs, float* y, int64_t ldy,
                                                         int64_t cols) {
  __m512 acc[MR][3];
  for (int r = 0; r < MR; ++r)
    for (int t = 0; t < 3; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; ++i) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b + i * 2 * kTileCols);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b + tile_stride + i * 2 * kTileCols);
    const __m512bh w2 = (__m512bh)_mm512_loadu_si512(b + 2 * tile_stride + i * 2 * kTileCols);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + 2 * i, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, w2);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int t = 0; t < 3; ++t) {
      const int64_t n = std::clamp<int64_t>(cols - t * kTileCols, 0, kTileCols);
      if (n > 0) _mm512_mask_storeu_ps(y + r * ldy + t * kTileCols, __mmask16((1u << n) - 1), acc[r][t]);
    }
}

// Y[:, n0 : n0 + 48] = X @ panel n0 / 48: the panel interleaved once into `b` (it stays in L2 while
// every strip of rows streams it), then strips of 8 rows.
void PanelBf16(const bf16* x, int64_t M, int64_t Kp, const bf16* w, int64_t K, int64_t N, int64_t n0, float* y,
               std::vector<bf16>& b) {
  const int64_t tile_stride = Kp * kTileCols, cols = std::min(kPw, N - n0);
  b.resize(size_t(kPw / kTileCols) * tile_stride);
  Interleave(w, K, N, n0, 1, Kp, b.data());
  int64_t m = 0;
  for (; m + kStripRows <= M; m += kStripRows)
    Strip<kStripRows>(x + m * Kp, Kp, b.data(), tile_stride, Kp / 2, y + m * N + n0, N, cols);
  switch (M - m) {  // The last rows: one strip of their own height.
    case 0: break;
#define HLJAX_REST(R) case R: Strip<R>(x + m * Kp, Kp, b.data(), tile_stride, Kp / 2, y + m * N + n0, N, cols); break;
    HLJAX_REST(1) HLJAX_REST(2) HLJAX_REST(3) HLJAX_REST(4) HLJAX_REST(5) HLJAX_REST(6) HLJAX_REST(7)
#undef HLJAX_REST
  }
}

// The checks both products make: x [M, K] bf16, w a packed bf16 [K, N], y [M, N] fp32, and this
// build's panels fit the kernel (`panels_fit`, else `why_not`).
ffi::Error CheckArgs(const std::string& name, const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                     ffi::ResultBuffer<ffi::F32> y, bool panels_fit, const std::string& why_not) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 1 || yd.size() != 2 || yd[0] != xd[0] || x.element_type() != ffi::DataType::BF16 ||
      w.element_type() != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument(name + ": want x [M, K] bf16, w packed (1-D) bf16, y [M, N] f32");
  if (!panels_fit) return ffi::Error::InvalidArgument(name + ": " + why_not);
  if (wd[0] != PackedLength(xd[1], yd[1]))
    return ffi::Error::InvalidArgument(name + ": w's length is not that of a packed [K, N] matrix");
  return ffi::Error::Success();
}

ffi::Error MatmulBf16Dot(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::ResultBuffer<ffi::F32> y) {
  if (ffi::Error e = CheckArgs("hljax_matmul_packed_bf16dot", x, w, y, kPw == 3 * kTileCols,
                               "this library's panels are not three 16-column vectors (an AVX2 build; the BF16 "
                               "dots need the AVX-512 one)");
      e.failure())
    return e;
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = y->dimensions()[1];
  if (M == 0 || N == 0) return ffi::Error::Success();
  // Keys in pairs: an odd K gets a zero key (rows copied once), an even one is read in place.
  const int64_t Kp = RoundUp(std::max<int64_t>(K, 1), 2);
  const bf16* xs = static_cast<const bf16*>(x.untyped_data());
  std::vector<bf16> padded;
  if (Kp != K) {
    padded.assign(size_t(M) * Kp, bf16(0));
    for (int64_t m = 0; m < M; ++m) std::memcpy(padded.data() + m * Kp, xs + m * K, K * sizeof(bf16));
    xs = padded.data();
  }
  const bf16* ws = static_cast<const bf16*>(w.untyped_data());
  float* ys = y->typed_data();
  ParallelFor(pool, (N + kPw - 1) / kPw, [=](int64_t p) {
    thread_local std::vector<bf16> b;  // This thread's interleaved panel, reused across calls.
    PanelBf16(xs, M, Kp, ws, K, N, p * kPw, ys, b);
  });
  return ffi::Error::Success();
}

ffi::Error MatmulAmx(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::ResultBuffer<ffi::F32> y) {
  if (ffi::Error e = CheckArgs("hljax_matmul_packed_amx", x, w, y, kPw % kTileCols == 0,
                               "this library's panels are not whole AMX tiles (an AVX2 build; AMX needs the AVX-512 one)");
      e.failure())
    return e;
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = y->dimensions()[1];
  if (M == 0 || N == 0) return ffi::Error::Success();
  const int64_t Mb = (M + kTileRows - 1) / kTileRows, Kp = RoundUp(std::max<int64_t>(K, 1), kTileKeys);
  const bf16* xs = static_cast<const bf16*>(x.untyped_data());
  std::vector<bf16> a(size_t(Mb) * Kp * kTileRows);
  bf16* ap = a.data();
  ParallelFor(pool, Mb, [=](int64_t mb) { PackRows(xs, M, K, mb, Kp, ap); });
  const bf16* ws = static_cast<const bf16*>(w.untyped_data());
  float* ys = y->typed_data();
  const int64_t unit_cols = kUnitPanels * kPw;
  ParallelFor(pool, (N + unit_cols - 1) / unit_cols, [=](int64_t u) {
    thread_local std::vector<bf16> b;  // This thread's interleaved panels, reused across calls.
    Unit(ap, M, Kp, ws, K, N, u * unit_cols, ys, b);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxMatmulPackedAmx, MatmulAmx,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HljaxMatmulPackedBf16Dot, MatmulBf16Dot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Asks Linux for permission to use AMX tile data in this process (needed once, before any thread
// touches a tile). 0 when granted, else the errno.
extern "C" int HljaxAmxInit() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0 ? 0 : errno;
}
