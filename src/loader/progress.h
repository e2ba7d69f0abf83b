// Progress of a long load, on stderr: a redrawn bar when stderr is a terminal, else
// one plain line per 10 % (logs and CI stay readable), and at finish() the bytes, the
// elapsed time and the rate (GB/s). Loads under `min_bytes` print nothing. advance() is
// thread-safe; the bytes given are the bytes read so far.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moe {

class Progress {
 public:
  // `enabled` false: prints nothing (e.g. on every rank but 0).
  Progress(std::string label, uint64_t total_bytes, bool enabled = true, uint64_t min_bytes = 256ull << 20);
  ~Progress();  // finishes the bar line
  void advance(uint64_t bytes);
  void finish();

  // Forces the mode (tests): true = terminal bar, false = plain lines.
  void set_terminal(bool tty) { tty_ = tty; }

 private:
  void draw(uint64_t done, bool final);

  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool enabled_ = true, tty_ = false, finished_ = false;
  int last_decile_ = 0, last_percent_ = -1;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
};

}  // namespace moe
