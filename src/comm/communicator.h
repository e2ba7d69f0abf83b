// Communication between ranks: the interface every parallel strategy uses.
//
// Two backends: MpiComm (OpenMPI/MPICH, across processes and hosts) and LocalComm
// (one rank, no MPI at all: every collective is a copy). NCCL will come on the same
// seam. Sizes and displacements are in BYTES for the byte-moving collectives and in
// ELEMENTS for the float reductions, as their names say.
//
// Every wait is bounded: a collective that does not complete within timeout()
// seconds (a rank died, hung, or took another code path) aborts the whole job with
// a message naming the operation, instead of hanging forever. A rank that throws
// calls abort_all() so the others exit too.
//
// Not thread-safe: one thread drives a communicator. Overlap is done with the
// nonblocking forms (start, compute, wait), not with concurrent calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace moe {

// A started nonblocking operation. wait() blocks (bounded) until it completes;
// the destructor waits if wait() was not called. Buffers must outlive the request.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete (never blocks)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "world", "ep", "moe_tp", "dp", "local"

  virtual void barrier() = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;

  // In-place sum over ranks of n floats.
  virtual void all_reduce_sum(float* buf, size_t n) = 0;
  virtual std::unique_ptr<CommRequest> iall_reduce_sum(float* buf, size_t n) = 0;

  // Every rank contributes `bytes` bytes; recv holds size() * bytes, in rank order.
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // Rank r contributes recv_bytes[r] bytes (may be 0); recv holds them in rank order,
  // packed (offsets are prefix sums of recv_bytes).
  virtual void all_gather_v(const void* send, size_t send_bytes, void* recv,
                            const std::vector<size_t>& recv_bytes) = 0;

  // send holds size() blocks of counts[r] floats, in rank order; rank r receives the
  // sum over ranks of block r into recv (counts[r] floats; counts may differ, even be 0).
  virtual void reduce_scatter_v_sum(const float* send, float* recv, const std::vector<size_t>& counts) = 0;

  // Byte-wise all-to-all: send_bytes[r] bytes at send + send_offsets[r] go to rank r;
  // recv_bytes[r] bytes from rank r land at recv + recv_offsets[r].
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                            const std::vector<size_t>& send_offsets, void* recv,
                            const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) = 0;
  virtual std::unique_ptr<CommRequest> iall_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                                     const std::vector<size_t>& send_offsets, void* recv,
                                                     const std::vector<size_t>& recv_bytes,
                                                     const std::vector<size_t>& recv_offsets) = 0;

  // Point-to-point, started together and completed together: every send goes to
  // sends[i].rank, every receive comes from recvs[i].rank into a buffer of bytes bytes
  // that the message may fill only in part (the payload says how much it holds), all
  // with `tag`. Between one pair of ranks messages of one tag match in posting order,
  // so both sides must post them in the same order. Used to move expert weights
  // (online load balancing) while the step loop goes on, and for alltoall-ll's
  // variable-length dispatch; collectives never match these messages.
  struct Message {
    int rank = 0;
    void* buf = nullptr;  // a send reads it, a receive writes it
    size_t bytes = 0;
  };
  virtual std::unique_ptr<CommRequest> isend_recv(const std::vector<Message>& sends,
                                                  const std::vector<Message>& recvs, int tag) = 0;

  // A sub-communicator of the ranks passing the same color, ordered by key.
  // Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Stops every rank of the job (MPI_Abort) after printing `why` on this rank.
  [[noreturn]] virtual void abort_all(const std::string& why) = 0;

  // Seconds a blocking wait may take before the job is aborted (default 300;
  // MOE_COMM_TIMEOUT or --comm-timeout).
  double timeout() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

 protected:
  double timeout_s_ = 300.0;
};

// The world communicator of this process: MPI when launched by mpirun/srun (or
// when `want_mpi`), else a single local rank. Initialises MPI on first use;
// MPI is finalised at exit.
Communicator& world_comm(bool want_mpi = false);
// True when the environment says we were started by an MPI launcher.
bool launched_by_mpi();
// Runs once, on the aborting rank, just before the job is aborted (a collective that
// timed out, an error on this rank): lets a server answer its clients first. The hook
// must not call into the communicator.
void set_abort_hook(std::function<void(const std::string& why)> hook);

// A standalone single-rank communicator.
std::unique_ptr<Communicator> make_local_comm(const std::string& name = "local");

}  // namespace moe
