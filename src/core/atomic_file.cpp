#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace moe {

namespace {

void write_pieces(const std::string& path, const std::string& tmp, const std::vector<FilePiece>& pieces,
                  const std::string& what, bool sync) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "{} {}: cannot create '{}': {}", what, path, tmp, std::strerror(errno));
  auto fail = [&](const char* step) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    MOE_FAIL("{} {}: {} of '{}' failed: {}", what, path, step, tmp, err);
  };
  for (const FilePiece& piece : pieces) {
    const char* p = static_cast<const char*>(piece.data);
    uint64_t at = piece.offset, n = piece.bytes;
    while (n > 0) {
      const ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write");
      p += w;
      at += static_cast<uint64_t>(w);
      n -= static_cast<uint64_t>(w);
    }
  }
  if (sync && ::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    MOE_FAIL("{} {}: close of '{}' failed: {}", what, path, tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    MOE_FAIL("{} {}: rename of '{}' failed: {}", what, path, tmp, err);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces, const std::string& what,
                       bool sync) {
  write_pieces(path, path + ".tmp" + std::to_string(::getpid()), pieces, what, sync);
}

void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what) {
  write_pieces(path, path + ".tmp", {FilePiece{0, contents.data(), contents.size()}}, what, true);
}

}  // namespace moe
