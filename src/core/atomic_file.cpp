#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace moe {

void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "{} {}: cannot create '{}': {}", what, path, tmp, std::strerror(errno));
  auto fail = [&](const char* step) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    MOE_FAIL("{} {}: {} of '{}' failed: {}", what, path, step, tmp, err);
  };
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
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

}  // namespace moe
