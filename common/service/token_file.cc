// The bearer token file and its gRPC plumbing (token_file.h).
#include "common/service/token_file.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/service/identity.h"

namespace sluice::service {
namespace {

// The bearer token check of a server: every call must carry "authorization: Bearer <token>".
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }  // a stat() and a hash: cheap

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    const auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing bearer token: this server requires --auth-token-file "
                          "(ClientOptions.auth_token_file)");
    }
    absl::StatusOr<std::string> token = token_->Get();
    if (!token.ok()) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the server cannot read its --auth-token-file: ", token.status().message()));
    }
    const std::string presented(it->second.data(), it->second.size());
    if (!TokensEqual(presented, absl::StrCat("Bearer ", *token))) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "wrong bearer token: the --auth-token-file contents differ from the "
                          "server's");
    }
    consumed_auth_metadata->insert({"authorization", presented});
    context->AddProperty(kAllRolesProperty, "1");  // development mode
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenFile> token_;
};

// A client's side of the token: adds it to every call.
class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "sluice-bearer-token"; }

  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<std::string, std::string>* metadata) override {
    absl::StatusOr<std::string> token = token_->Get();
    if (!token.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("--auth-token-file: ", token.status().message()));
    }
    metadata->insert({"authorization", absl::StrCat("Bearer ", *token)});
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenFile> token_;
};

}  // namespace

bool TokensEqual(const std::string& a, const std::string& b) {
  unsigned char da[EVP_MAX_MD_SIZE], db[EVP_MAX_MD_SIZE];
  unsigned int la = 0, lb = 0;
  EVP_Digest(a.data(), a.size(), da, &la, EVP_sha256(), nullptr);
  EVP_Digest(b.data(), b.size(), db, &lb, EVP_sha256(), nullptr);
  return la == lb && CRYPTO_memcmp(da, db, la) == 0;
}

absl::StatusOr<std::shared_ptr<TokenFile>> TokenFile::Create(std::string path) {
  auto token = std::shared_ptr<TokenFile>(new TokenFile(std::move(path)));
  absl::MutexLock lock(&token->mu_);
  if (absl::Status s = token->Reload(); !s.ok()) return s;
  return token;
}

absl::Status TokenFile::Reload() {
  return file_.ReloadIfChanged([this](const std::string& text) {
    const std::string token(absl::StripAsciiWhitespace(text));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth-token-file ", path_, " is empty"));
    }
    mu_.AssertHeld();
    token_ = token;
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> TokenFile::Get() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(); !s.ok()) return s;
  return token_;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeBearerTokenProcessor(
    std::shared_ptr<TokenFile> token) {
  return std::make_shared<BearerTokenProcessor>(std::move(token));
}

std::shared_ptr<grpc::CallCredentials> MakeBearerTokenCredentials(
    std::shared_ptr<TokenFile> token) {
  return grpc::MetadataCredentialsFromPlugin(std::make_unique<BearerTokenPlugin>(std::move(token)));
}

}  // namespace sluice::service
