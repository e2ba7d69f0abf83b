#include "loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace moe {

MappedFile map_file_readonly(const std::string& path, const std::string& where, uint64_t min_bytes,
                             const std::function<std::string(uint64_t size)>& too_small) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "{}: cannot open: {}", where, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    MOE_FAIL("{}: cannot stat: {}", where, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MOE_FAIL("{}: expected a regular file", where);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < std::max<uint64_t>(min_bytes, 1)) {
    ::close(fd);
    MOE_FAIL("{}: {}", where, too_small(size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string mmap_err = base == MAP_FAILED ? std::strerror(errno) : "";
  ::close(fd);
  MOE_CHECK(base != MAP_FAILED, "{}: mmap of {} bytes failed: {}", where, size, mmap_err);
  return {std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); }), size};
}

}  // namespace moe
