// Files written whole or not at all: a run that fails (or is killed) while writing
// leaves no truncated output that a script could mistake for a result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

// Writes `contents` to `path` through `path`.tmp in the same directory (same file
// system, so the rename is atomic): write, fsync, rename. On any error the temp file is
// removed and moe::Error names `what` (e.g. "--output-json"), the path and errno.
void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what);

// The same for a file made of pieces written at their offsets (gaps read as zeros), from
// memory the caller owns (GB of tensors: no copy into one string). The temp file is
// `path`.tmp<pid>, so two processes writing one path never share it. sync false skips the
// fsync, for files whose readers check them anyway (the weights cache's checksums).
struct FilePiece {
  uint64_t offset;
  const void* data;
  uint64_t bytes;
};
void write_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces, const std::string& what,
                       bool sync = true);

}  // namespace moe
