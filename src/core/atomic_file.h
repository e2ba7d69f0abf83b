// Files written whole or not at all: a run that fails (or is killed) while writing
// leaves no truncated output that a script could mistake for a result.
#pragma once

#include <string>

namespace moe {

// Writes `contents` to `path` through `path`.tmp in the same directory (same file
// system, so the rename is atomic): write, fsync, rename. On any error the temp file is
// removed and moe::Error names `what` (e.g. "--output-json"), the path and errno.
void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what);

}  // namespace moe
