#include "loader/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace moe {

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled, uint64_t min_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      enabled_(enabled && total_bytes >= min_bytes && total_bytes > 0),
      tty_(::isatty(STDERR_FILENO) == 1),
      t0_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += bytes;
  if (done_ > total_) done_ = total_;
  draw(done_, false);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  draw(done_, true);
}

void Progress::draw(uint64_t done, bool final) {
  const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const int percent = static_cast<int>(frac * 100.0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double gbs = s > 0 ? static_cast<double>(done) / s / 1e9 : 0.0;
  if (tty_) {
    if (percent == last_percent_ && !final) return;
    last_percent_ = percent;
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth);
    fmt::print(stderr, "\r{} [{}{}] {:3d}% {:.2f}/{:.2f} GB {:.2f} GB/s{}", label_, std::string(fill, '#'),
               std::string(kWidth - fill, '.'), percent, done / 1e9, total_ / 1e9, gbs,
               final ? fmt::format(" in {:.2f} s\n", s) : "");
    std::fflush(stderr);
    return;
  }
  const int decile = percent / 10;
  while (last_decile_ < decile) {
    ++last_decile_;
    fmt::print(stderr, "{}: {}% ({:.2f} of {:.2f} GB, {:.2f} GB/s)\n", label_, last_decile_ * 10,
               done / 1e9, total_ / 1e9, gbs);
  }
  // The summary a user compares with `cat` of the files: bytes, time, rate.
  if (final) fmt::print(stderr, "{}: done, {:.2f} GB in {:.2f} s ({:.2f} GB/s)\n", label_, done / 1e9, s, gbs);
}

}  // namespace moe
