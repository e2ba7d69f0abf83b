#include "core/threads.h"

#include <omp.h>

namespace moe {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
}

int thread_id() { return omp_get_thread_num(); }

}  // namespace moe
