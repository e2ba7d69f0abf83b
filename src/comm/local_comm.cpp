// LocalComm: one rank, every collective is a copy (see local_comm.h).
#include "comm/local_comm.h"

#include <cstring>

#include "comm/mpi_comm.h"
#include "core/check.h"

namespace moe {
namespace {

// An already-complete request: the copy happened when it was started.
class DoneRequest final : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n != 0 && dst != src) std::memmove(dst, src, n);
}

}  // namespace

void LocalComm::broadcast(void* buf, size_t bytes, int root) {
  MOE_CHECK(root == 0, "broadcast on communicator '{}': root {} is not a rank of 1", name_, root);
}

std::unique_ptr<CommRequest> LocalComm::iall_reduce_sum(float* buf, size_t n) {
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> LocalComm::isend_recv(const std::vector<Message>& sends,
                                                  const std::vector<Message>& recvs, int tag) {
  // One rank: the i-th send is the i-th receive (messages of a tag match in order).
  MOE_CHECK(sends.size() == recvs.size(), "isend_recv on communicator '{}' (1 rank): {} sends but {} receives", name_,
            sends.size(), recvs.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    MOE_CHECK(sends[i].rank == 0 && recvs[i].rank == 0 && sends[i].bytes <= recvs[i].bytes,
              "isend_recv on communicator '{}' (1 rank): message {} goes to rank {} from rank {} ({} vs {} bytes)",
              name_, i, sends[i].rank, recvs[i].rank, sends[i].bytes, recvs[i].bytes);
    copy_bytes(recvs[i].buf, sends[i].buf, sends[i].bytes);
  }
  (void)tag;
  return std::make_unique<DoneRequest>();
}

void LocalComm::all_gather(const void* send, size_t bytes, void* recv) { copy_bytes(recv, send, bytes); }

void LocalComm::all_gather_v(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes) {
  MOE_CHECK(recv_bytes.size() == 1 && recv_bytes[0] == send_bytes,
            "all_gather_v on communicator '{}' (1 rank): recv_bytes must be {{{}}}, got {} entries", name_, send_bytes,
            recv_bytes.size());
  copy_bytes(recv, send, send_bytes);
}

void LocalComm::reduce_scatter_v_sum(const float* send, float* recv, const std::vector<size_t>& counts) {
  MOE_CHECK(counts.size() == 1, "reduce_scatter_v_sum on communicator '{}' (1 rank): counts has {} entries", name_,
            counts.size());
  copy_bytes(recv, send, counts[0] * sizeof(float));
}

void LocalComm::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                             const std::vector<size_t>& send_offsets, void* recv,
                             const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) {
  MOE_CHECK(send_bytes.size() == 1 && send_offsets.size() == 1 && recv_bytes.size() == 1 && recv_offsets.size() == 1,
            "all_to_all_v on communicator '{}' (1 rank): sizes and offsets need 1 entry each", name_);
  MOE_CHECK(send_bytes[0] == recv_bytes[0],
            "all_to_all_v on communicator '{}' (1 rank): sends itself {} bytes but expects {}", name_, send_bytes[0],
            recv_bytes[0]);
  copy_bytes(static_cast<char*>(recv) + recv_offsets[0], static_cast<const char*>(send) + send_offsets[0],
             send_bytes[0]);
}

std::unique_ptr<CommRequest> LocalComm::iall_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                                      const std::vector<size_t>& send_offsets, void* recv,
                                                      const std::vector<size_t>& recv_bytes,
                                                      const std::vector<size_t>& recv_offsets) {
  all_to_all_v(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<Communicator> LocalComm::split(int color, int key, const std::string& name) {
  MOE_CHECK(color >= 0, "split of communicator '{}' into '{}': color must be >= 0, got {}", name_, name, color);
  return std::make_unique<LocalComm>(name, timeout_s_);
}

// Prints and exits with status 1; in a process that also runs MPI this stops the
// whole job (MPI_Abort), as the contract says.
void LocalComm::abort_all(const std::string& why) { detail::abort_job(why); }

}  // namespace moe
