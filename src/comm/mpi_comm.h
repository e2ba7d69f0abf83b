// The MPI backend of Communicator (private to src/comm and the MPI tests).
//
// Every collective is started in its nonblocking MPI-3 form and completed by a
// polling loop (MPI_Testall) with a deadline of timeout() seconds: it spins for
// about a millisecond, then yields, then sleeps in short naps so that waiting ranks
// leave the CPU to the ranks still computing (oversubscribed runs). On the deadline
// the job is aborted with a message naming the operation, the communicator, this
// rank and the timeout, and naming the ranks that are lost: before aborting, the rank
// pings every other rank on a private communicator (every rank answers pings while it
// waits, saying what it waits for) and reports those that did not answer within 2 s
// with their host names (gathered at MPI init). MPI errors are returned
// (MPI_ERRORS_RETURN) and turned into moe::Error carrying MPI_Error_string.
//
// Counts: MPI counts are int. Byte collectives whose sizes or offsets exceed
// INT_MAX are expressed in blocks of 2^k bytes (a contiguous derived datatype,
// k chosen per call so every size and offset is a whole number of blocks);
// all_reduce and broadcast are split into several requests. reduce_scatter_v with
// a block above INT_MAX floats fails with a clear moe::Error.
#pragma once

// The C API only: OpenMPI/MPICH would otherwise pull in their deprecated C++ bindings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "comm/communicator.h"

namespace moe {

class MpiComm final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor while MPI is still active).
  MpiComm(MPI_Comm comm, std::string name, double timeout_s);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void barrier() override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void all_reduce_sum(float* buf, size_t n) override;
  std::unique_ptr<CommRequest> iall_reduce_sum(float* buf, size_t n) override;
  void all_gather(const void* send, size_t bytes, void* recv) override;
  void all_gather_v(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes) override;
  void reduce_scatter_v_sum(const float* send, float* recv, const std::vector<size_t>& counts) override;
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_offsets,
                    void* recv, const std::vector<size_t>& recv_bytes,
                    const std::vector<size_t>& recv_offsets) override;
  std::unique_ptr<CommRequest> iall_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                             const std::vector<size_t>& send_offsets, void* recv,
                                             const std::vector<size_t>& recv_bytes,
                                             const std::vector<size_t>& recv_offsets) override;
  std::unique_ptr<CommRequest> isend_recv(const std::vector<Message>& sends, const std::vector<Message>& recvs,
                                          int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort_all(const std::string& why) override;

  MPI_Comm handle() const { return comm_; }

  // Bounded wait for `n` started requests of operation `op`; aborts the job on the deadline.
  void wait_requests(MPI_Request* reqs, int n, const char* op);
  // Throws moe::Error naming `op`, this communicator and MPI's error string unless rc == MPI_SUCCESS.
  void check(int rc, const char* op) const;

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
};

namespace detail {

// Initialises MPI once (MPI_Init_thread, MPI_THREAD_FUNNELED; sets OpenMPI's
// mpi_yield_when_idle when this host runs more ranks than it has cores) and
// registers finalisation at exit: a bounded barrier, then MPI_Finalize; skipped
// after an abort.
void mpi_init_once();
// MPI initialised by this process and not finalised yet.
bool mpi_active();
// The timeout of the bounded barrier done before MPI_Finalize at exit (default 300 s).
void set_mpi_exit_timeout(const Communicator* world);
// Prints "moe-ep: rank R: <why>" (R: the rank in MPI_COMM_WORLD, 0 without MPI)
// and stops the job: MPI_Abort(MPI_COMM_WORLD, 1) when MPI is active, else exit(1).
// With grace_s > 0 it first waits that long (answering liveness pings), so that the
// other ranks' reports get out before the abort kills them. When MPI_Abort does not
// end this process within 3 s (its daemon is cut off from mpirun) it _exits(1).
[[noreturn]] void abort_job(const std::string& why, double grace_s = 0);
// Tests only: pretend MPI counts stop at `limit` instead of INT_MAX, so the
// large-count paths can be exercised with small buffers. limit <= 0 restores INT_MAX.
void set_mpi_count_limit_for_testing(long long limit);

}  // namespace detail
}  // namespace moe
