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

void set_num_threads(int n) {
  // OMP_NUM_THREADS, when set, is the user's own count (libgomp has already applied it):
  // only an explicit n overrides it. Left to the cores instead, `OMP_NUM_THREADS=1 moe-ep`
  // and `mpirun -x OMP_NUM_THREADS` were silently ignored (a 16-core benchmark of 1..16
  // threads ran all 16 each time).
  if (n <= 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    if (env != nullptr && *env != '\0') return;
  }
  omp_set_num_threads(n <= 0 ? default_num_threads() : n);
}

int thread_id() { return omp_get_thread_num(); }

}  // namespace moe
