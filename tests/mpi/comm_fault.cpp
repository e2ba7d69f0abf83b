// A job that misbehaves on purpose, to check that the others do not hang.
// usage: comm_fault <mode>   (run under mpirun with >= 2 ranks, except `local`)
//   skip       rank 1 skips an all_reduce and sleeps: the others time out (2 s)
//   skip-exit  rank 1 skips an all_reduce and returns from main
//   kill       rank 1 dies by SIGKILL before an all_reduce
//   throw      rank 1 throws; main catches and calls abort_all
//   other-path rank 1 waits in a barrier on communicator 'pair' (ranks 1 and 2) while the
//              others all_reduce on 'world': every rank answers the timeout's pings, and
//              the reports say where rank 1 waits (nobody is lost)
//   ok         every rank does the collectives and exits 0
//   local      no launcher: world_comm() must be one local rank, MPI untouched
// The C API only: OpenMPI/MPICH would otherwise pull in their deprecated C++ bindings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/communicator.h"
#include "core/check.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "local") {
    auto& w = moe::world_comm();
    int inited = 1;
    MPI_Initialized(&inited);
    if (w.size() != 1 || w.rank() != 0 || inited != 0 || moe::launched_by_mpi()) {
      std::fprintf(stderr, "comm_fault local: size %d rank %d MPI initialised %d\n", w.size(), w.rank(), inited);
      return 1;
    }
    float x = 3;
    w.all_reduce_sum(&x, 1);
    std::printf("comm_fault local: ok (single rank, MPI not initialised)\n");
    return x == 3 ? 0 : 1;
  }

  auto& w = moe::world_comm(true);
  const bool timeout_mode = mode == "skip" || mode == "skip-exit" || mode == "other-path";
  // other-path: rank 1 waits longer than the others (10 s against 2 s), so they time out
  // first and their pings find it still waiting in the barrier. With equal limits rank
  // 1 sometimes timed out first and answered "aborting the job" instead: the test then
  // failed on a race, not on the reports.
  w.set_timeout(mode == "other-path" && w.rank() == 1 ? 10.0 : timeout_mode ? 2.0 : 120.0);
  try {
    float x = static_cast<float>(w.rank());
    std::unique_ptr<moe::Communicator> pair;
    if (mode == "other-path") pair = w.split(w.rank() == 1 || w.rank() == 2 ? 1 : 0, w.rank(), "pair");
    w.barrier();
    if (mode == "other-path" && w.rank() == 1) pair->barrier();
    if (w.rank() == 1) {
      if (mode == "skip") {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        return 0;
      }
      if (mode == "skip-exit") return 0;
      if (mode == "kill") std::raise(SIGKILL);
      if (mode == "throw") MOE_FAIL("boom on rank {}", w.rank());
    }
    w.all_reduce_sum(&x, 1);
    const float want = static_cast<float>(w.size() * (w.size() - 1) / 2);
    if (x != want) MOE_FAIL("all_reduce gave {}, want {}", x, want);
    if (mode != "ok") MOE_FAIL("unknown mode '{}' (or fewer than 2 ranks)", mode);
  } catch (const std::exception& e) {
    w.abort_all(e.what());
  }
  return 0;
}
