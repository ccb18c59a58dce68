// --tokens-file (tokens_file.h).
#include "common/service/tokens_file.h"

#include <openssl/evp.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/grpc_security_constants.h"

namespace sluice::service {
namespace {

std::string Digest(absl::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(token.data(), token.size(), digest, &length, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(digest), length);
}

// Splits one CSV line: plain fields, or a quoted field ("" inside stands for ").
absl::StatusOr<std::vector<std::string>> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> fields;
  size_t i = 0;
  while (true) {
    std::string field;
    while (i < line.size() && line[i] == ' ') ++i;  // leading spaces
    if (i < line.size() && line[i] == '"') {
      ++i;
      while (true) {
        if (i >= line.size()) return absl::InvalidArgumentError("unclosed '\"'");
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field += line[i++];
      }
      if (i < line.size() && line[i] != ',') {
        return absl::InvalidArgumentError("text after a closing '\"'");
      }
    } else {
      while (i < line.size() && line[i] != ',') field += line[i++];
    }
    fields.push_back(std::move(field));
    if (i >= line.size()) break;
    ++i;  // the ','
  }
  return fields;
}

// The server side of --tokens-file.
class TokensProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokensProcessor(std::shared_ptr<TokensFile> tokens) : tokens_(std::move(tokens)) {}
  bool IsBlocking() const override { return false; }  // a stat() and a hash

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    const auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      if (context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            "missing bearer token: this server accepts the "
                            "callers of its --tokens-file (present one with "
                            "--auth-token-file / ClientOptions.auth_token_file) "
                            "or a client certificate (mutual TLS)");
      }
      return grpc::Status::OK;  // the certificate names the caller
    }
    const absl::string_view presented(it->second.data(), it->second.size());
    absl::string_view token = presented;
    if (!absl::ConsumePrefix(&token, "Bearer ")) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the authorization header is not 'Bearer <token>'");
    }
    absl::StatusOr<std::optional<Identity>> identity = tokens_->Find(token);
    if (!identity.ok()) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the server cannot read its --tokens-file: ", identity.status().message()));
    }
    if (!identity->has_value()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "unknown bearer token: the --auth-token-file contents "
                          "are not listed in the server's --tokens-file");
    }
    context->AddProperty(kUserProperty, (*identity)->user);
    for (const std::string& group : (*identity)->groups)
      context->AddProperty(kGroupProperty, group);
    consumed_auth_metadata->insert({"authorization", std::string(presented)});
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokensFile> tokens_;
};

}  // namespace

absl::StatusOr<std::map<std::string, Identity>> ParseTokens(absl::string_view text,
                                                            absl::string_view path) {
  std::map<std::string, Identity> tokens;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat("--tokens-file ", path, " line ", line_number);
    absl::StatusOr<std::vector<std::string>> fields = SplitCsvLine(line);
    if (!fields.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", fields.status().message()));
    }
    if (fields->size() < 3 || fields->size() > 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": want token,user,uid[,\"group1,group2\"] (", fields->size(), " fields)"));
    }
    const std::string token(absl::StripAsciiWhitespace((*fields)[0]));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty token"));
    }
    Identity identity{.user = std::string(absl::StripAsciiWhitespace((*fields)[1]))};
    if (absl::Status s = CheckUserName(identity.user, where); !s.ok()) return s;
    if (fields->size() == 4) {
      for (absl::string_view group : absl::StrSplit((*fields)[3], ',')) {
        group = absl::StripAsciiWhitespace(group);
        if (!group.empty()) identity.groups.emplace_back(group);
      }
    }
    if (!tokens.emplace(token, std::move(identity)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a token listed twice"));
    }
  }
  return tokens;
}

absl::StatusOr<std::shared_ptr<TokensFile>> TokensFile::Create(std::string path) {
  auto tokens = std::shared_ptr<TokensFile>(new TokensFile(std::move(path)));
  absl::MutexLock lock(&tokens->mu_);
  if (absl::Status s = tokens->Reload(); !s.ok()) return s;
  if (tokens->by_digest_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens-file ", tokens->path_, " lists no token"));
  }
  return tokens;
}

absl::Status TokensFile::Reload() {
  return file_.ReloadIfChanged([this](const std::string& text) {
    absl::StatusOr<std::map<std::string, Identity>> tokens = ParseTokens(text, path_);
    if (!tokens.ok()) return tokens.status();
    mu_.AssertHeld();
    by_digest_.clear();
    for (auto& [token, identity] : *tokens) by_digest_.emplace(Digest(token), std::move(identity));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<Identity>> TokensFile::Find(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(); !s.ok()) return s;
  const auto it = by_digest_.find(Digest(token));
  if (it == by_digest_.end()) return std::optional<Identity>();
  return std::optional<Identity>(it->second);
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokensProcessor(
    std::shared_ptr<TokensFile> tokens) {
  return std::make_shared<TokensProcessor>(std::move(tokens));
}

}  // namespace sluice::service
