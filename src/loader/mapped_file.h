// A whole file mapped read-only, for the checkpoint readers (safetensors, GGUF): opened,
// checked to be a regular file of at least a minimum size, mapped PROT_READ and
// MAP_PRIVATE, the descriptor closed. Errors name the file as the caller words it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace moe {

// Where a reader's bytes live. Only a file's read-only mapping may have pages dropped with
// madvise(DONTNEED): they refault from the page cache with the same bytes. On a heap
// buffer (the fuzzers' and tests' in-memory files) the same call zeroes whole pages,
// the bytes of whatever else shares them included, so those readers never release.
enum class Backing { kFileMapping, kHeap };

struct MappedFile {
  std::shared_ptr<void> data;  // the mapping; munmap when the last holder lets go
  uint64_t size = 0;           // bytes
};

// `where` starts every error ("safetensors file 'x'"); too_small(size) says what a file
// of `size` < min_bytes lacks (min_bytes >= 1 also keeps mmap away from a 0-byte length).
MappedFile map_file_readonly(const std::string& path, const std::string& where, uint64_t min_bytes,
                             const std::function<std::string(uint64_t size)>& too_small);

}  // namespace moe
