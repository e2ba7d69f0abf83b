// A Communicator that forwards every call to a real one and counts the collectives,
// for tests that assert how many a layout runs per step. Sub-communicators made by
// split() count into the same tally, so a model's groups (ep, dp, moe_tp) are covered.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace moe::test {

class CountingComm final : public Communicator {
 public:
  // `calls[op]`: how many times op ran on this rank, over this communicator and its splits.
  using Tally = std::map<std::string, int64_t>;
  // `sent[op]` (optional): the bytes this rank handed to op, for the ops that send one
  // buffer (all_gather_v).
  CountingComm(Communicator& inner, std::shared_ptr<Tally> tally, std::shared_ptr<Tally> sent = nullptr)
      : inner_(inner), tally_(std::move(tally)), sent_(std::move(sent)) {
    set_timeout(inner.timeout());
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  void barrier() override { count("barrier"), inner_.barrier(); }
  void broadcast(void* buf, size_t bytes, int root) override { count("broadcast"), inner_.broadcast(buf, bytes, root); }
  void all_reduce_sum(float* buf, size_t n) override { count("all_reduce"), inner_.all_reduce_sum(buf, n); }
  std::unique_ptr<CommRequest> iall_reduce_sum(float* buf, size_t n) override {
    count("all_reduce");
    return inner_.iall_reduce_sum(buf, n);
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    count("all_gather"), inner_.all_gather(send, bytes, recv);
  }
  void all_gather_v(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes) override {
    if (sent_) (*sent_)["all_gather_v"] += static_cast<int64_t>(send_bytes);
    count("all_gather_v"), inner_.all_gather_v(send, send_bytes, recv, recv_bytes);
  }
  void reduce_scatter_v_sum(const float* send, float* recv, const std::vector<size_t>& counts) override {
    count("reduce_scatter"), inner_.reduce_scatter_v_sum(send, recv, counts);
  }
  void all_to_all_v(const void* send, const std::vector<size_t>& sb, const std::vector<size_t>& so, void* recv,
                    const std::vector<size_t>& rb, const std::vector<size_t>& ro) override {
    count("all_to_all"), inner_.all_to_all_v(send, sb, so, recv, rb, ro);
  }
  std::unique_ptr<CommRequest> iall_to_all_v(const void* send, const std::vector<size_t>& sb,
                                             const std::vector<size_t>& so, void* recv, const std::vector<size_t>& rb,
                                             const std::vector<size_t>& ro) override {
    count("all_to_all");
    return inner_.iall_to_all_v(send, sb, so, recv, rb, ro);
  }
  std::unique_ptr<CommRequest> isend_recv(const std::vector<Message>& sends, const std::vector<Message>& recvs,
                                          int tag) override {
    count("send_recv");
    return inner_.isend_recv(sends, recvs, tag);
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    owned_.push_back(inner_.split(color, key, name));
    return std::make_unique<CountingComm>(*owned_.back(), tally_, sent_);
  }
  [[noreturn]] void abort_all(const std::string& why) override {
    inner_.abort_all(why);
    std::abort();  // not reached: the inner abort_all does not return either
  }

 private:
  void count(const char* op) { ++(*tally_)[op]; }
  Communicator& inner_;
  std::shared_ptr<Tally> tally_, sent_;
  std::vector<std::unique_ptr<Communicator>> owned_;  // the real sub-communicators
};

}  // namespace moe::test
