// dist_demo: a DistTensor tour. A generated 2-D field is distributed from rank 0 over a 2-D
// mesh (2x2 at 4 ranks), moved through a chain of placements — a transpose of the
// decomposition, a replicated dim, both mesh dims sharding one tensor dim, a pending sum — and
// after every step compared with the full field, which every rank generates independently. A
// simulation's own ghosted array is then wrapped zero-copy with from_local. Prints what moved
// and how; exits non-zero on any mismatch (on every rank).
//
//   mpiexec -n 4 ./dist_demo [rows cols [mesh_rows mesh_cols]]     (default 97 130, mesh auto)
//   mpiexec -n 4 ./dist_demo --rows 97 --cols 130 --mesh 2x2        (the same with flags; --help)
// Bad flags or sizes exit with code 2 and a message, a failed check with 1.
#include <shardtensor/shardtensor.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cli_common.hpp"

namespace {

using namespace shard;
using Field = Tensor<double, 2>;
using DField = DistTensor<double, 2>;

/// The field every rank can generate on its own: a smooth periodic pattern plus seeded noise.
Field make_field(index_t rows, index_t cols) {
  auto f = Field::empty({rows, cols});
  f.fill_random(7, RandomInit::uniform(-0.05, 0.05));
  const double two_pi = 6.283185307179586;
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j)
      f(i, j) += std::sin(two_pi * static_cast<double>(j) / static_cast<double>(cols)) *
                 std::cos(two_pi * static_cast<double>(i) / static_cast<double>(rows));
  return f;
}

/// Most square 2-D factorisation of p (rows <= cols).
std::vector<int> auto_mesh(int p) {
  int r = 1;
  for (int d = 1; d * d <= p; ++d)
    if (p % d == 0) r = d;
  return {r, p / r};
}

std::string placements_str(const std::vector<Placement>& ps) {
  std::string s = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ps[i]);
  return s + "]";
}

/// Every rank's local extents, as "r0 3x4 | r1 ..." (collective).
std::string local_shapes(const DField& t) {
  const auto shape = t.local().shape();
  const auto all = t.mesh().comm()->allgather_vectors({shape[0], shape[1]});
  std::string s;
  for (std::size_t r = 0; r < all.size(); ++r) s += fmt::format("{}r{} {}x{}", r ? " | " : "", r, all[r][0], all[r][1]);
  return s;
}

struct Demo {
  DeviceMesh mesh;
  Field reference;
  int failures = 0;
  bool root() const { return mesh.rank() == 0; }

  /// Checks `t` against the reference on every rank and prints one report line.
  void check(const DField& t, const std::string& what, const std::string& plan, double ms) {
    const double err = max_rel_diff(t.full_tensor(), reference);
    const bool ok = err <= 1e-15;
    int bad = ok ? 0 : 1;
    mesh.comm()->allreduce_inplace(&bad, 1, ReduceOp::sum);
    failures += bad;
    const auto shapes = local_shapes(t);
    if (root())
      fmt::print("{:<52} {:<24} {:8.3f} ms  {}\n  local blocks: {}\n", what, plan, ms,
                 bad ? fmt::format("MISMATCH on {} rank(s) (rel err {:.2e})", bad, err) : "== full field", shapes);
  }

  /// Redistributes `t` to `target`, timing it (max over ranks) and checking the result.
  DField step(const DField& t, const std::vector<Placement>& target) {
    const auto plan = detail::redistribute_plan(t.spec(), t.spec().with_placements(target));
    mesh.comm()->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    DField out = t.redistribute(target);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    mesh.comm()->allreduce_inplace(&ms, 1, ReduceOp::max);
    std::string plan_s;
    for (auto k : plan->kinds()) plan_s += (plan_s.empty() ? "" : "+") + std::string(detail::redist_step_name(k));
    if (plan_s.empty()) plan_s = "none";
    check(out, fmt::format("{} -> {}", placements_str(t.placements()), placements_str(target)), plan_s, ms);
    return out;
  }
};

namespace cli = examples::cli;

struct Args {
  index_t rows = 97, cols = 130;
  std::vector<int> mesh;  // empty: auto_mesh
};

/// Flags (CLI11): rows and cols as positionals or --rows/--cols, the mesh as two positionals or
/// --mesh AxB. Every extent >= 1; the mesh must hold the ranks started. Empty shards are fine
/// here (every step of the tour works with them), so rows/cols may be smaller than the mesh.
Args parse_args(int argc, char** argv, int ranks, bool print, int* exit_code) {
  Args a;
  std::string mesh;
  std::vector<int> mesh_pos;
  CLI::App app{"DistTensor tour: a 2-D field through a chain of placements, checked against the full field.",
               "dist_demo"};
  auto extent = [](CLI::Option* o) {
    return o->check(cli::decimal_integer())->check(CLI::Range(index_t{1}, index_t{1} << 28))->capture_default_str();
  };
  extent(app.add_option("rows,--rows", a.rows, "global rows of the field"));
  extent(app.add_option("cols,--cols", a.cols, "global columns of the field"));
  app.add_option("mesh_dims", mesh_pos, "mesh_rows mesh_cols (as --mesh)")
      ->expected(2)
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--mesh", mesh, "mesh AxB (default: the most square factorisation of the ranks)")
      ->check(cli::mesh_check(2, 2));
  *exit_code = cli::parse(app, argc, argv, print);
  if (*exit_code >= 0) return a;
  if (!mesh.empty() && !mesh_pos.empty()) throw cli::UsageError("give the mesh either as --mesh or as two positionals");
  a.mesh = !mesh.empty() ? cli::parse_mesh(mesh, 2, 2) : mesh_pos.empty() ? auto_mesh(ranks) : mesh_pos;
  cli::check_mesh_ranks(a.mesh, 1, ranks, "mesh");
  return a;
}

int run(int argc, char** argv, bool& print) {
  auto comm = default_comm();  // a duplicate of MPI_COMM_WORLD (MPI initialised if needed), or SelfComm
  print = comm->rank() == 0;
  int exit_code = -1;
  const Args args = parse_args(argc, argv, comm->size(), print, &exit_code);
  if (exit_code >= 0) return exit_code;
  const index_t rows = args.rows, cols = args.cols;
  const auto& mshape = args.mesh;
  Demo demo{DeviceMesh(comm, mshape, {"y", "x"}), make_field(rows, cols)};
  if (demo.root())
    fmt::print("shardtensor {} dist_demo: field {}x{} (fp64) on a {}x{} mesh of {} rank(s), backend '{}'\n\n",
               SHARDTENSOR_VERSION, rows, cols, mshape[0], mshape[1], comm->size(), comm->backend());

  // 1. Scatter from rank 0 into a 2-D block decomposition (uneven: 97 rows over 2).
  const Field on_root = demo.root() ? demo.reference : Field();
  DField t = DField::distribute(on_root, demo.mesh, {Shard(0), Shard(1)}, /*root=*/0);
  demo.check(t, "distribute from rank 0 -> [Shard(0), Shard(1)]", "scatter", 0.0);

  // 2. The chain. Each step is one collective or none; see docs/architecture.md.
  t = demo.step(t, {Shard(1), Shard(0)});         // transpose the decomposition: alltoallv
  t = demo.step(t, {Replicate(), Shard(0)});      // gather along mesh dim y
  t = demo.step(t, {Shard(0), Shard(0)});         // rows over all ranks, row-major over (y, x)
  t = demo.step(t, {Partial(ReduceOp::sum), Shard(0)});  // a pending sum (value on y == 0)
  t = demo.step(t, {Shard(1), Shard(0)});         // reduce-scatter, then re-split
  t = demo.step(t, {Replicate(), Replicate()});   // everything everywhere
  t = demo.step(t, {Shard(0), Shard(1)});         // back to blocks: a local slice, no messages

  // 3. A simulation's own array with one ghost layer, wrapped zero-copy (sizes are gathered).
  const auto box = t.spec().local_box();
  const index_t lr = box.len[0], lc = box.len[1];
  std::vector<double> ghosted(static_cast<std::size_t>((lr + 2) * (lc + 2)), -1.0);
  for (index_t i = 0; i < lr; ++i)
    for (index_t j = 0; j < lc; ++j)
      ghosted[static_cast<std::size_t>((i + 1) * (lc + 2) + j + 1)] = demo.reference(box.lo[0] + i, box.lo[1] + j);
  auto interior = Field::view(ghosted.data() + (lc + 2) + 1, {lr, lc}, {lc + 2, 1});
  DField user = DField::from_local(interior, demo.mesh, {Shard(0), Shard(1)});
  const bool zero_copy = user.local().data() == ghosted.data() + (lc + 2) + 1;
  demo.check(user, fmt::format("from_local (ghosted user array, zero-copy: {})", zero_copy ? "yes" : "NO"), "gather sizes",
             0.0);
  if (!zero_copy) ++demo.failures;
  demo.step(user, {Shard(1), Replicate()});

  // 4. A reduction computed from the shards equals the one over the full field.
  double local_sum = sum(t.local());
  comm->allreduce_inplace(&local_sum, 1, ReduceOp::sum);
  const double full_sum = sum(demo.reference);
  const bool sum_ok = std::abs(local_sum - full_sum) <= 1e-9 * std::max(1.0, std::abs(full_sum));
  if (!sum_ok) ++demo.failures;
  int any_failed = demo.failures;  // agree across ranks (the zero-copy check is per rank)
  comm->allreduce_inplace(&any_failed, 1, ReduceOp::max);
  demo.failures = std::max(demo.failures, any_failed);
  const auto mem = memory_stats();
  if (demo.root()) {
    fmt::print("\nsum over shards {:.12f}, over the full field {:.12f}: {}\n", local_sum, full_sum,
               sum_ok ? "equal" : "DIFFERENT");
    fmt::print("rank 0 memory: shardtensor peak {:.2f} MiB, process peak RSS {:.1f} MiB\n",
               static_cast<double>(mem.peak_bytes) / (1 << 20),
               static_cast<double>(process_peak_rss_bytes()) / (1 << 20));
    fmt::print("{}\n", demo.failures ? fmt::format("dist_demo: {} FAILED check(s)", demo.failures)
                                     : std::string("dist_demo: all checks passed"));
  }
  return demo.failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("dist_demo", print, [&] { return run(argc, argv, print); });
}
