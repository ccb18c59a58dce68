// Identities and roles (identity.h).
#include "common/service/identity.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"

namespace sluice::service {
namespace {

std::string Property(const grpc::AuthContext& context, const char* name) {
  const std::vector<grpc::string_ref> values = context.FindPropertyValues(name);
  if (values.empty()) return "";
  return std::string(values.front().data(), values.front().size());
}

// The UTF-8 text of every entry `nid` of `name`.
std::vector<std::string> NameEntries(X509_NAME* name, int nid) {
  std::vector<std::string> out;
  for (int i = X509_NAME_get_index_by_NID(name, nid, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(name, nid, i)) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char* utf8 = nullptr;
    const int length = ASN1_STRING_to_UTF8(&utf8, data);
    if (length < 0) continue;
    out.emplace_back(reinterpret_cast<char*>(utf8), length);
    OPENSSL_free(utf8);
  }
  return out;
}

}  // namespace

absl::string_view RoleGroup(Role role) {
  switch (role) {
    case Role::kTrainer:
      return "sluice:trainers";
    case Role::kWorker:
      return "sluice:workers";
    case Role::kOperator:
      return "sluice:operators";
  }
  return "";
}

bool Identity::Has(Role role) const {
  if (all_roles) return true;
  return std::find(groups.begin(), groups.end(), RoleGroup(role)) != groups.end();
}

bool Identity::MayActFor(absl::string_view owner) const {
  if (all_roles || Has(Role::kOperator)) return true;
  return !owner.empty() && owner == user;
}

std::string Identity::Describe() const {
  if (all_roles) return "the development identity";
  return absl::StrCat(user, " (groups: ", groups.empty() ? "none" : absl::StrJoin(groups, ", "),
                      ")");
}

absl::Status RequireRole(const Identity& caller, Role role, absl::string_view method) {
  if (caller.Has(role)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      caller.Describe(), " may not call ", method, ": it needs the role ", RoleGroup(role),
      " (a group in --tokens-file or the O of the client certificate)"));
}

absl::Status CheckUserName(absl::string_view user, absl::string_view where) {
  if (user.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": empty user name"));
  }
  if (user.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": user name longer than 256 bytes"));
  }
  for (const char c : user) {
    if (c == '/' || c == ',' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": user name '", user, "' contains '/', ',' or a control character"));
    }
  }
  return absl::OkStatus();
}

std::string ScopedJobName(const Identity& creator, absl::string_view name,
                          absl::string_view anonymous_id) {
  if (creator.all_roles) return std::string(name);
  if (name.empty()) return absl::StrCat(creator.user, "/~", anonymous_id);
  return absl::StrCat(creator.user, "/", name);
}

std::string JobOwner(absl::string_view stored_name) {
  const size_t slash = stored_name.find('/');
  if (slash == absl::string_view::npos) return "";
  return std::string(stored_name.substr(0, slash));
}

absl::StatusOr<Identity> IdentityOfCertificate(absl::string_view pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError("the client certificate is not a PEM certificate");
  }
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const std::vector<std::string> cn = NameEntries(subject, NID_commonName);
  Identity identity;
  identity.user = cn.empty() ? "" : cn.front();
  identity.groups = NameEntries(subject, NID_organizationName);
  return identity;
}

absl::StatusOr<Identity> IdentityOf(const grpc::AuthContext& context) {
  const std::string user = Property(context, kUserProperty);
  if (!user.empty()) {
    Identity identity{.user = user};
    for (const grpc::string_ref& group : context.FindPropertyValues(kGroupProperty)) {
      identity.groups.emplace_back(group.data(), group.size());
    }
    return identity;
  }
  if (!Property(context, kAllRolesProperty).empty()) return Identity::Development();
  const std::string pem = Property(context, GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return Identity::Development();
  absl::StatusOr<Identity> identity = IdentityOfCertificate(pem);
  if (!identity.ok()) {
    return absl::PermissionDeniedError(identity.status().message());
  }
  if (absl::Status s = CheckUserName(identity->user, "the client certificate's subject CN");
      !s.ok()) {
    return absl::PermissionDeniedError(s.message());
  }
  return identity;
}

}  // namespace sluice::service
