// --tokens-file: the callers a server accepts, each with its own bearer token, user and
// groups, in the format of Kubernetes' static token file. One caller a line:
//
//   token,user,uid[,"group1,group2"]
//
//   s3cr3t-alice,alice,1001,"sluice:trainers"
//   s3cr3t-worker,worker,2001,sluice:workers
//   s3cr3t-ops,ops,3001,"sluice:operators,sluice:trainers"
//
// Blank lines and lines starting with '#' are skipped; the groups field is quoted when it holds
// more than one group. The file is re-read when it changes (mtime, size or inode), so callers
// are added or revoked without a restart; a file that no longer parses makes every call
// UNAVAILABLE naming the line until it is fixed. The server's processor (MakeTokensProcessor)
// puts the caller's user and groups into the call's AuthContext, where IdentityOf (identity.h)
// finds them. Under mutual TLS a call without a token is left to the client certificate.
#ifndef SLUICE_COMMON_SERVICE_TOKENS_FILE_H_
#define SLUICE_COMMON_SERVICE_TOKENS_FILE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/service/identity.h"
#include "common/service/watched_file.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace sluice::service {

// token -> identity, parsed from the text of a tokens file. InvalidArgument naming `path` and
// the line for a malformed line, a bad user name or a duplicate token.
absl::StatusOr<std::map<std::string, Identity>> ParseTokens(absl::string_view text,
                                                            absl::string_view path);

// A --tokens-file, re-read when it changes. Thread-safe.
class TokensFile {
 public:
  // Reads the file once: NotFound/PermissionDenied when unreadable, InvalidArgument when it
  // does not parse or lists no token.
  static absl::StatusOr<std::shared_ptr<TokensFile>> Create(std::string path);

  // The identity holding `token`, nullopt for an unknown token; the error when the file
  // changed and cannot be read or parsed.
  absl::StatusOr<std::optional<Identity>> Find(absl::string_view token) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  explicit TokensFile(std::string path) : path_(path), file_(std::move(path), "--tokens-file") {}
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  WatchedFile file_ ABSL_GUARDED_BY(mu_);
  // Keyed by the SHA-256 of the token, so a lookup's timing says nothing about the tokens.
  std::map<std::string, Identity> by_digest_ ABSL_GUARDED_BY(mu_);
};

// The server's check with --tokens-file: a call carrying "authorization: Bearer <token>" must
// name a listed token (UNAUTHENTICATED "unknown bearer token" otherwise) and gets its identity;
// a call without one is refused (UNAUTHENTICATED "missing bearer token") unless it came with a
// verified client certificate (mutual TLS), whose CN and O then name the caller.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokensProcessor(
    std::shared_ptr<TokensFile> tokens);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_TOKENS_FILE_H_
