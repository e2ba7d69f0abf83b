// main() of moe_mpi_tests: initialises MPI through world_comm(true), lets only
// rank 0 print GoogleTest's report (other ranks print just their failures, tagged
// with the rank) and exits with the same status on every rank: non-zero when any
// rank had a failure.
#include "core/threads.h"
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "comm/communicator.h"

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::printf("[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
      std::fflush(stdout);
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  moe::Communicator* world = nullptr;
  try {
    world = &moe::world_comm(/*want_mpi=*/true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_mpi_tests: %s\n", e.what());
    return 1;
  }
  // A test that fails on one rank may leave the others waiting in a collective:
  // keep that wait short unless the environment says otherwise.
  if (std::getenv("MOE_COMM_TIMEOUT") == nullptr) world->set_timeout(60);
  // Share the host's cores among the ranks (4 ranks on 2 cores: 1 thread each).
  moe::set_num_threads(0);
  if (world->rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0f : 0.0f;
  world->all_reduce_sum(&failed, 1);
  if (failed > 0 && world->rank() == 0)
    std::printf("moe_mpi_tests: %d of %d ranks had failures (see the [rank N] lines)\n", static_cast<int>(failed),
                world->size());
  return failed > 0 ? 1 : 0;
}
