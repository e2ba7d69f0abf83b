#include "core/threads.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

namespace moe {

namespace {

// Ranks sharing this host, as the MPI launchers (OpenMPI, MPICH/Hydra) announce it.
int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

}  // namespace

int num_threads() { return omp_get_max_threads(); }

int default_num_threads() { return std::max(1, omp_get_num_procs() / local_ranks()); }

void set_num_threads(int n) { omp_set_num_threads(n <= 0 ? default_num_threads() : n); }

int thread_id() { return omp_get_thread_num(); }

}  // namespace moe
