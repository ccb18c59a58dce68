// WatchedFile: a file its owner re-reads only when it changed (mtime, size or inode), the one
// home of the "rotate without a restart" check behind --auth-token-file (token_file.h) and
// --tokens-file (tokens_file.h).
#ifndef SLUICE_COMMON_SERVICE_WATCHED_FILE_H_
#define SLUICE_COMMON_SERVICE_WATCHED_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace sluice::service {

// Not thread-safe: its owner calls it under its own lock.
class WatchedFile {
 public:
  // `flag` names the file in errors ("--tokens-file").
  WatchedFile(std::string path, std::string flag)
      : path_(std::move(path)), flag_(std::move(flag)) {}

  // Calls `install` with the file's text when the file changed since the last successful install
  // (or was never installed). The change counts as seen only when `install` succeeds, so a bad
  // new file keeps failing (fail closed) until it is fixed. NotFound/PermissionDenied naming the
  // flag and path when the file cannot be read; otherwise `install`'s error.
  absl::Status ReloadIfChanged(absl::FunctionRef<absl::Status(const std::string& text)> install);

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const std::string flag_;
  int64_t mtime_ns_ = -1;
  int64_t size_ = -1;
  ino_t inode_ = 0;
};

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_WATCHED_FILE_H_
