// The world communicator: MPI when started by an MPI launcher (or when asked),
// else one local rank. A single-rank run never touches MPI (no singleton init).
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "comm/communicator.h"
#include "comm/local_comm.h"
#include "comm/mpi_comm.h"
#include "core/check.h"

namespace moe {
namespace {

// MOE_COMM_TIMEOUT (seconds, > 0) or 300.
double default_timeout() {
  const char* s = std::getenv("MOE_COMM_TIMEOUT");
  if (s == nullptr || *s == '\0') return 300.0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  MOE_CHECK(end != s && *end == '\0' && std::isfinite(v) && v > 0,
            "MOE_COMM_TIMEOUT must be a positive number of seconds, got '{}'", s);
  return v;
}

struct World {
  Communicator* comm = nullptr;  // never deleted: MPI is finalised at exit, after static destructors
  bool is_mpi = false;
};

}  // namespace

bool launched_by_mpi() {
  // OpenMPI (mpirun/orterun), PMIx launchers (OpenMPI 5 prte, srun --mpi=pmix),
  // MPICH/Intel MPI hydra and srun --mpi=pmi2 (PMI_RANK/PMI_SIZE).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

Communicator& world_comm(bool want_mpi) {
  static std::mutex mu;
  static World world;
  std::lock_guard<std::mutex> lock(mu);
  if (world.comm == nullptr) {
    const double timeout = default_timeout();
    if (want_mpi || launched_by_mpi()) {
      detail::mpi_init_once();
      MPI_Comm dup;
      const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
      MOE_CHECK(rc == MPI_SUCCESS, "MPI_Comm_dup(MPI_COMM_WORLD) failed (error {})", rc);
      world.comm = new MpiComm(dup, "world", timeout);
      world.is_mpi = true;
      detail::set_mpi_exit_timeout(world.comm);
    } else {
      world.comm = new LocalComm("world", timeout);
    }
  } else if (want_mpi && !world.is_mpi) {
    MOE_FAIL("world_comm(want_mpi=true) called after a single-rank world was created without MPI");
  }
  return *world.comm;
}

std::unique_ptr<Communicator> make_local_comm(const std::string& name) {
  return std::make_unique<LocalComm>(name, default_timeout());
}

}  // namespace moe
