// Threading: OpenMP.
//
// Why OpenMP rather than our own pool: every kernel here is a flat list of
// independent tasks (expert x output block) run with dynamic scheduling, which
// `#pragma omp parallel for schedule(dynamic)` does with no code of ours to
// maintain; GCC ships libgomp, so it costs no dependency. Its threads spin
// briefly between parallel regions (OMP_WAIT_POLICY), which is what a
// layer-after-layer inference loop wants. The number of threads is set once by
// set_num_threads (the CLI's --threads; default: OMP_NUM_THREADS when set, else
// default_num_threads()).
#pragma once

namespace moe {

int num_threads();
// The cores of this process's affinity mask divided by the ranks on this host, so
// that ranks started by mpirun on one machine do not oversubscribe its cores.
int default_num_threads();
void set_num_threads(int n);  // n <= 0: OMP_NUM_THREADS's count when set, else default_num_threads()
int thread_id();              // inside a parallel region, 0..num_threads()-1

}  // namespace moe
