// Who is calling, and what they may do: identities and roles (docs/security.md).
//
// A server learns a caller's identity from its transport security, in this order:
//   --tokens-file        the bearer token's line: "token,user,uid,\"group1,group2\""
//                        (Kubernetes' static token file; tokens_file.h)
//   mutual TLS           the client certificate's subject CN is the user, its O fields are
//                        the groups (Kubernetes' x509 convention)
//   --auth-token-file    development mode: the one shared token holds every role
//   nothing (plaintext)  development mode: every caller holds every role
// Groups grant roles:
//   sluice:trainers   register datasets, create jobs, heartbeat them, read their state and
//                     stream their batches (only the caller's own jobs)
//   sluice:workers    register, heartbeat, report and unregister (only its own worker ids)
//   sluice:operators  drain workers, full status, any job's state
// A caller without the role a method needs gets PERMISSION_DENIED naming the role:
//   "alice (groups: sluice:trainers) may not call DrainWorker: it needs the role
//    sluice:operators (a group in --tokens-file or the O of the client certificate)"
#ifndef SLUICE_COMMON_SERVICE_IDENTITY_H_
#define SLUICE_COMMON_SERVICE_IDENTITY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_context.h"

namespace sluice::service {

enum class Role { kTrainer, kWorker, kOperator };

// "sluice:trainers", "sluice:workers", "sluice:operators".
absl::string_view RoleGroup(Role role);

struct Identity {
  std::string user;  // "" for the development identity
  std::vector<std::string> groups;
  // Development modes (no client authentication, or the one --auth-token-file token): the
  // caller holds every role and owns every job.
  bool all_roles = false;

  static Identity Development() { return {.user = "", .all_roles = true}; }

  bool Has(Role role) const;
  // May act on what `owner` created: the owner itself, an operator, or the development
  // identity. An empty `owner` (made in development mode) belongs to operators only.
  bool MayActFor(absl::string_view owner) const;
  // "alice (groups: sluice:trainers)" / "the development identity", for messages.
  std::string Describe() const;
};

// OK if `caller` holds `role`; PERMISSION_DENIED naming the caller, `method` and the role
// otherwise.
absl::Status RequireRole(const Identity& caller, Role role, absl::string_view method);

// The caller of a server call (see the order above). PERMISSION_DENIED when a client
// certificate has no usable CN (empty, or containing '/').
absl::StatusOr<Identity> IdentityOf(const grpc::AuthContext& context);

// The identity in a PEM certificate: CN and O fields. InvalidArgument if it does not parse.
absl::StatusOr<Identity> IdentityOfCertificate(absl::string_view pem);

// Names a user may carry: non-empty, printable, no '/' (job names are scoped "user/name")
// and no ','. InvalidArgument naming `where` otherwise.
absl::Status CheckUserName(absl::string_view user, absl::string_view where);

// Job names are scoped per identity: a job created by user U under the name N is stored as
// "U/N" ("U/~<id>" for an anonymous job, `anonymous_id` being unique), so its owner lives in its
// name and survives restarts with it. The development identity's names are stored as given.
std::string ScopedJobName(const Identity& creator, absl::string_view name,
                          absl::string_view anonymous_id);
// The owner in a stored job name: the text before the first '/', "" when there is none.
std::string JobOwner(absl::string_view stored_name);

// The properties the token processors put into the call's AuthContext.
inline constexpr char kUserProperty[] = "sluice.user";
inline constexpr char kGroupProperty[] = "sluice.group";
inline constexpr char kAllRolesProperty[] = "sluice.all_roles";

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_IDENTITY_H_
