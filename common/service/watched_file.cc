// A file re-read when it changes (watched_file.h).
#include "common/service/watched_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/service/certificate_checks.h"

namespace sluice::service {

absl::Status WatchedFile::ReloadIfChanged(
    absl::FunctionRef<absl::Status(const std::string& text)> install) {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message = absl::StrCat(flag_, " ", path_, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(message) : absl::NotFoundError(message);
  }
  const int64_t mtime_ns =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime_ns == mtime_ns_ && st.st_size == size_ && st.st_ino == inode_) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFileForFlag(path_, flag_);
  if (!text.ok()) return text.status();
  if (absl::Status s = install(*text); !s.ok()) return s;
  mtime_ns_ = mtime_ns;
  size_ = st.st_size;
  inode_ = st.st_ino;
  return absl::OkStatus();
}

}  // namespace sluice::service
