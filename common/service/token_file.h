// The bearer token: a file both sides read, and how it travels. The client adds
// "authorization: Bearer <token>" to every call (MakeBearerTokenCredentials); the server
// compares it in constant time (MakeBearerTokenProcessor). Both re-read their TokenFile when it
// changes, so a token rotates without a restart (write the new file on both sides).
// channel_factory.h wires both in from ChannelOptions/ServerSecurityOptions::auth_token_file,
// and only over TLS; docs/security.md describes the whole scheme.
#ifndef SLUICE_COMMON_SERVICE_TOKEN_FILE_H_
#define SLUICE_COMMON_SERVICE_TOKEN_FILE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/service/watched_file.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/credentials.h"

namespace sluice::service {

// A bearer token read from a file, re-read when the file changes (mtime, size or inode), so
// rotating it needs no restart. Thread-safe.
class TokenFile {
 public:
  // Reads the file once: NotFound/PermissionDenied when unreadable, InvalidArgument when empty.
  static absl::StatusOr<std::shared_ptr<TokenFile>> Create(std::string path);

  // The current token (surrounding whitespace stripped). If the file changed and the new one
  // cannot be read or is empty, the error; the caller refuses the call.
  absl::StatusOr<std::string> Get() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  explicit TokenFile(std::string path) : path_(path), file_(std::move(path), "--auth-token-file") {}
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  WatchedFile file_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// Constant-time equality (time independent of where the strings differ and of their
// lengths): compares SHA-256 digests.
bool TokensEqual(const std::string& a, const std::string& b);

// The server's check: every call must carry "authorization: Bearer <token>"; UNAUTHENTICATED
// "missing bearer token" / "wrong bearer token" otherwise, UNAVAILABLE when the server cannot
// read its own token file.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeBearerTokenProcessor(
    std::shared_ptr<TokenFile> token);

// The client's side: adds the token to every call (UNAUTHENTICATED naming --auth-token-file
// when the file cannot be read).
std::shared_ptr<grpc::CallCredentials> MakeBearerTokenCredentials(std::shared_ptr<TokenFile> token);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_TOKEN_FILE_H_
