// LocalComm: the single-rank Communicator (rank 0 of 1, no MPI). Every collective
// is a copy of this rank's own data; all_reduce is a no-op.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace moe {

class LocalComm final : public Communicator {
 public:
  explicit LocalComm(std::string name, double timeout_s = 300.0) : name_(std::move(name)) { timeout_s_ = timeout_s; }

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }

  void barrier() override {}
  void broadcast(void* buf, size_t bytes, int root) override;
  void all_reduce_sum(float* buf, size_t n) override {}
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

 private:
  std::string name_;
};

}  // namespace moe
