// The box engine (exec/box.hpp) against naive element loops: copy, add, fill and zero over
// random boxes of random strided views (including negative strides and size-1 dims), every
// element size and every accumulating dtype, small boxes and boxes above the OpenMP threshold;
// operand checks; and the CUDA implementation against the CPU one (skipped without a GPU).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <complex>
#include <cstring>
#include <random>
#include <shardtensor/exec/box.hpp>
#include <shardtensor/tensor/memory.hpp>
#include <vector>

namespace st_exec_test_box {

using namespace shard;
using Catch::Matchers::ContainsSubstring;

namespace {

/// A host array of `n` elements of T with a Block view over a random sub-box of it.
template <class T>
struct Arena {
  std::vector<T> data;
  explicit Arena(std::size_t n) : data(n) {}
  Block view(const std::vector<index_t>& shape, const std::vector<index_t>& strides, index_t offset) {
    return Block::view(dtype_of<T>, Device::cpu(), data.data() + offset, shape.data(), static_cast<int>(shape.size()),
                       strides.data());
  }
};

template <class T> T value_of(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(-1000, 1000);
  if constexpr (std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>) {
    using R = typename T::value_type;
    return T(static_cast<R>(u(rng)) / 8, static_cast<R>(u(rng)) / 16);
  } else {
    return static_cast<T>(u(rng));
  }
}

/// Element pointer of multi-index idx in block b.
template <class T> T* at(const Block& b, const std::vector<index_t>& idx) { return static_cast<T*>(b.at(idx.data())); }

/// Calls f(idx) for every multi-index of `shape`.
template <class F> void for_each_index(const std::vector<index_t>& shape, F&& f) {
  index_t n = 1;
  for (auto e : shape) n *= e;
  std::vector<index_t> idx(shape.size(), 0);
  for (index_t lin = 0; lin < n; ++lin) {
    index_t rem = lin;
    for (std::size_t d = shape.size(); d-- > 0;) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    f(idx);
  }
}

/// A random strided layout of `shape` inside an arena: permuted dims, gaps, and (optionally) one
/// reversed dim. Returns (strides, offset, arena size).
struct Layout {
  std::vector<index_t> strides;
  index_t offset = 0, size = 0;
};
Layout random_layout(const std::vector<index_t>& shape, std::mt19937_64& rng, bool allow_negative) {
  const std::size_t R = shape.size();
  std::vector<std::size_t> order(R);
  for (std::size_t i = 0; i < R; ++i) order[i] = i;
  if (rng() % 2) std::shuffle(order.begin(), order.end(), rng);  // else row-major
  Layout l;
  l.strides.assign(R, 1);
  index_t acc = 1;
  for (std::size_t k = R; k-- > 0;) {
    const std::size_t d = order[k];
    l.strides[d] = acc;
    acc *= shape[d] + static_cast<index_t>(rng() % 3 == 0 ? rng() % 3 : 0);  // sometimes a gap
  }
  l.size = acc + 1;
  if (allow_negative && R > 0 && rng() % 3 == 0) {
    const std::size_t d = rng() % R;
    l.offset += (shape[d] - 1) * l.strides[d];
    l.strides[d] = -l.strides[d];
  }
  return l;
}

template <class T>
void check_dtype(std::mt19937_64& rng, bool big) {
  for (int trial = 0; trial < (big ? 4 : 60); ++trial) {
    const int R = static_cast<int>(rng() % 5);
    std::vector<index_t> shape(static_cast<std::size_t>(R));
    for (auto& e : shape) e = big ? static_cast<index_t>(10 + rng() % 40) : static_cast<index_t>(rng() % 5 + (rng() % 4 == 0 ? 0 : 1));
    if (big && R > 0) shape[0] = 64;  // above the OpenMP threshold
    const Layout ls = random_layout(shape, rng, true), ld = random_layout(shape, rng, true);
    Arena<T> sa(static_cast<std::size_t>(ls.size)), da(static_cast<std::size_t>(ld.size));
    for (auto& v : sa.data) v = value_of<T>(rng);
    for (auto& v : da.data) v = value_of<T>(rng);
    const Block src = sa.view(shape, ls.strides, ls.offset), dst = da.view(shape, ld.strides, ld.offset);
    INFO(fmt::format("{} shape {} src strides {} dst strides {}", dtype_of<T>, shape, ls.strides, ld.strides));
    // copy: dst == src at every index; memory outside dst untouched.
    {
      auto before = da.data;
      exec::box_copy(dst, src);
      auto expect = before;
      for_each_index(shape, [&](const std::vector<index_t>& i) {
        expect[static_cast<std::size_t>(at<T>(dst, i) - da.data.data())] = *at<T>(src, i);
      });
      CHECK(std::memcmp(expect.data(), da.data.data(), expect.size() * sizeof(T)) == 0);
    }
    // add (arithmetic dtypes)
    if constexpr (!std::is_same_v<T, std::uint8_t>) {
      for (auto& v : da.data) v = value_of<T>(rng);
      auto expect = da.data;
      for_each_index(shape, [&](const std::vector<index_t>& i) {
        expect[static_cast<std::size_t>(at<T>(dst, i) - da.data.data())] += *at<T>(src, i);
      });
      exec::box_add(dst, src);
      CHECK(expect == da.data);
    }
    // fill and zero
    {
      const T v = value_of<T>(rng);
      auto expect = da.data;
      for_each_index(shape, [&](const std::vector<index_t>& i) {
        expect[static_cast<std::size_t>(at<T>(dst, i) - da.data.data())] = v;
      });
      exec::box_fill(dst, &v);
      CHECK(std::memcmp(expect.data(), da.data.data(), expect.size() * sizeof(T)) == 0);
      for_each_index(shape, [&](const std::vector<index_t>& i) {
        expect[static_cast<std::size_t>(at<T>(dst, i) - da.data.data())] = T{};
      });
      exec::box_zero(dst);
      CHECK(std::memcmp(expect.data(), da.data.data(), expect.size() * sizeof(T)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("box engine: copy/add/fill/zero match element loops for every dtype (c64, c128 too) and layout", "[exec][box]") {
  std::mt19937_64 rng(42);
  for (bool big : {false, true}) {
    check_dtype<float>(rng, big);
    check_dtype<double>(rng, big);
    check_dtype<std::int32_t>(rng, big);
    check_dtype<std::int64_t>(rng, big);
    check_dtype<std::uint8_t>(rng, big);
    check_dtype<std::complex<float>>(rng, big);
    check_dtype<std::complex<double>>(rng, big);
  }
}

TEST_CASE("box engine: a long contiguous run and a strided slice of a large block", "[exec][box]") {
  // 1 M elements in one run (split in chunks over threads) and a column half (rows of memcpy).
  const index_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n)), b(static_cast<std::size_t>(n * n), -1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  const index_t shape[2] = {n, n};
  const Block A = Block::view(DType::f32, Device::cpu(), a.data(), shape, 2);
  const Block B = Block::view(DType::f32, Device::cpu(), b.data(), shape, 2);
  exec::box_copy(B, A);
  CHECK(a == b);
  const Block half = B.slice({0, 0}, {n, n / 2});
  exec::box_zero(half);
  exec::box_add(half, A.slice({0, n / 2}, {n, n / 2}));
  bool ok = true;
  for (index_t i = 0; i < n && ok; ++i)
    for (index_t j = 0; j < n && ok; ++j)
      ok = b[static_cast<std::size_t>(i * n + j)] == (j < n / 2 ? a[static_cast<std::size_t>(i * n + j + n / 2)]
                                                               : a[static_cast<std::size_t>(i * n + j)]);
  CHECK(ok);
}

TEST_CASE("box engine: operand checks name the op, shapes, dtypes and devices", "[exec][box][errors]") {
  std::vector<double> a(12), b(12);
  std::vector<std::uint8_t> c(12);
  const index_t s34[2] = {3, 4}, s43[2] = {4, 3};
  const Block A = Block::view(DType::f64, Device::cpu(), a.data(), s34, 2);
  const Block B = Block::view(DType::f64, Device::cpu(), b.data(), s43, 2);
  const Block C = Block::view(DType::u8, Device::cpu(), c.data(), s34, 2);
  const Block Cd = Block::view(DType::u8, Device::cpu(), c.data(), s34, 2);
  CHECK_THROWS_WITH(exec::box_copy(A, B), ContainsSubstring("box_copy") && ContainsSubstring("shapes differ"));
  CHECK_THROWS_WITH(exec::box_copy(A, C), ContainsSubstring("box_copy") && ContainsSubstring("dtype"));
  CHECK_THROWS_WITH(exec::box_add(C, Cd), ContainsSubstring("box_add") && ContainsSubstring("cannot be accumulated"));
  Block G = A;
  G.device = Device::cuda(0);
  CHECK_THROWS_WITH(exec::box_add(G, A), ContainsSubstring("box_add") && ContainsSubstring("different devices"));
  if (cuda_device_count() == 0)  // no GPU (or no CUDA backend): a clear error, never a crash
    CHECK_THROWS_WITH(exec::box_copy(G, A), ContainsSubstring("box_copy"));
}

TEST_CASE("box engine on CUDA matches the CPU engine (skipped without a GPU)", "[exec][box][cuda]") {
  if (cuda_device_count() == 0) SKIP("no CUDA device visible: the CUDA box kernels were not run");
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int R = 1 + static_cast<int>(rng() % 4);
    std::vector<index_t> shape(static_cast<std::size_t>(R));
    for (auto& e : shape) e = 1 + static_cast<index_t>(rng() % 6);
    const Layout ls = random_layout(shape, rng, false), ld = random_layout(shape, rng, false);
    std::vector<double> hs(static_cast<std::size_t>(ls.size)), hd(static_cast<std::size_t>(ld.size));
    for (auto& v : hs) v = value_of<double>(rng);
    for (auto& v : hd) v = value_of<double>(rng);
    const auto bytes_s = hs.size() * sizeof(double), bytes_d = hd.size() * sizeof(double);
    auto ds = allocate_bytes(bytes_s, Device::cuda(0)), dd = allocate_bytes(bytes_d, Device::cuda(0));
    copy_bytes(ds.get(), Device::cuda(0), hs.data(), Device::cpu(), bytes_s);
    copy_bytes(dd.get(), Device::cuda(0), hd.data(), Device::cpu(), bytes_d);
    const Block S = Block::view(DType::f64, Device::cuda(0), ds.get(), shape.data(), R, ls.strides.data());
    const Block D = Block::view(DType::f64, Device::cuda(0), dd.get(), shape.data(), R, ld.strides.data());
    const Block hS = Block::view(DType::f64, Device::cpu(), hs.data(), shape.data(), R, ls.strides.data());
    const Block hD = Block::view(DType::f64, Device::cpu(), hd.data(), shape.data(), R, ld.strides.data());
    exec::box_add(D, S);
    exec::box_add(hD, hS);
    std::vector<double> back(hd.size());
    current_context(Device::cuda(0)).synchronize();
    copy_bytes(back.data(), Device::cpu(), dd.get(), Device::cuda(0), bytes_d);
    CHECK(back == hd);
    // host -> device strided copy (staged) and back
    exec::box_copy(D, hS);
    std::vector<double> round(hd.size(), 0.0);
    const Block hR = Block::view(DType::f64, Device::cpu(), round.data(), shape.data(), R, ld.strides.data());
    exec::box_copy(hR, D);
    bool same = true;
    for_each_index(shape, [&](const std::vector<index_t>& i) { same = same && *at<double>(hR, i) == *at<double>(hS, i); });
    CHECK(same);
  }
}

}  // namespace st_exec_test_box
