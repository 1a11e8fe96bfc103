// A checkpoint writer killed (SIGKILL) in the middle of a save leaves the previous checkpoint
// intact and loadable. The writer is this test binary re-executed (a fresh process, so no
// OpenMP/MPI state crosses a fork) running the hidden test "[.ckpt_writer]" in a loop.
#include <catch2/catch_test_macros.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <shardtensor/io/checkpoint.hpp>
#include <shardtensor/shardtensor.hpp>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;  // POSIX; declared at global scope

namespace st_io_test_checkpoint_kill {

using namespace shard;
namespace F = shard::nn::functional;


namespace {
DeviceMesh self_mesh() { return DeviceMesh(std::make_shared<SelfComm>(), {1}); }

/// About 19 MB of parameters, so that one save takes long enough to be interrupted.
std::shared_ptr<nn::Sequential<double, 4>> big_model(const DeviceMesh& mesh) {
  auto m = std::make_shared<nn::Sequential<double, 4>>();
  for (int i = 0; i < 4; ++i)
    m->add(std::make_shared<nn::Conv2d<double>>(mesh, 256, 256, 3, F::ConvOptions<2>::same({3, 3}), false, i));
  return m;
}

/// Sets every parameter element to c.
void fill(const nn::Module<double>& m, double c) {
  for (auto& np : m.named_parameters()) np.param->value_flat().fill(c);
}
/// The value c if every parameter element equals c, NaN otherwise.
double uniform_value(const nn::Module<double>& m) {
  double c = std::nan("");
  for (auto& np : m.named_parameters()) {
    const auto v = np.param->value_flat();
    for (index_t i = 0; i < v.numel(); ++i) {
      if (std::isnan(c)) c = v(i);
      if (v(i) != c) return std::nan("");
    }
  }
  return c;
}
}  // namespace

TEST_CASE("checkpoint writer loop (run by the kill test)", "[.ckpt_writer]") {
  const char* path = std::getenv("SHARDTENSOR_CKPT_WRITER_PATH");
  REQUIRE(path != nullptr);
  auto mesh = self_mesh();
  auto m = big_model(mesh);
  for (int i = 1; i < 100000; ++i) {
    fill(*m, static_cast<double>(i));
    io::save_checkpoint(path, *m, nullptr, io::TrainingState{i, {}, {}});
  }
}

TEST_CASE("a writer killed mid-write leaves the previous checkpoint intact", "[io][checkpoint]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  auto mesh = self_mesh();
  auto m = big_model(mesh);
  const std::string path = fmt::format("/tmp/shardtensor_kill_{}.h5", static_cast<long>(::getpid()));
  const std::string tmp = path + ".tmp";
  fill(*m, 0.0);
  io::save_checkpoint(path, *m, nullptr, io::TrainingState{0, {}, {}});
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe");
  const std::string env_path = "SHARDTENSOR_CKPT_WRITER_PATH=" + path;
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(env_path.c_str()));
  env.push_back(nullptr);
  int mid_write = 0;
  for (int attempt = 0; attempt < 12 && mid_write < 3; ++attempt) {
    pid_t pid = 0;
    char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("[.ckpt_writer]"), nullptr};
    REQUIRE(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, env.data()) == 0);
    // Wait until a save is under way (its temporary file exists), then kill at a varying point.
    bool seen = false;
    for (int i = 0; i < 20000 && !seen; ++i) {
      seen = std::filesystem::exists(tmp);
      if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300 * attempt));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    const bool partial = std::filesystem::exists(tmp);
    mid_write += partial;
    // Whatever the moment of the kill, `path` is one complete checkpoint: every element equals
    // the step it was saved at, and it loads (checksums verified).
    auto back = big_model(mesh);
    fill(*back, -1.0);
    io::TrainingState st;
    REQUIRE_NOTHROW(st = io::load_checkpoint(path, *back, nullptr));
    CHECK(uniform_value(*back) == static_cast<double>(st.step));
    std::filesystem::remove(tmp);
  }
  INFO("kills that landed while the temporary file was being written: " << mid_write);
  CHECK(mid_write >= 1);
  std::filesystem::remove(path);
}

}  // namespace st_io_test_checkpoint_kill
