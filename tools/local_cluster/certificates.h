// Throwaway certificates for a secured local cluster (`sluice local --tls`) and the tests: a CA, a
// certificate for the servers and one for clients, both signed by the CA and naming 127.0.0.1 and
// localhost, an already expired certificate signed by the same CA, and a random bearer token. Under
// mutual TLS without a token the certificates name their holders (common/service/identity.h): the
// server certificate (which workers also present) is in group sluice:workers, the client's in
// sluice:trainers and sluice:operators. Made with Debian's `openssl` command; EC P-256 keys (fast
// to make).
//
//   ASSIGN_OR_RETURN(Certificates certs, MakeCertificates(work_dir + "/tls"));
//   options.tls_cert = certs.server_cert; ...
//
// Not for production: the CA key sits beside the certificates (docs/security.md says how to
// run with real ones).
#ifndef SLUICE_TOOLS_LOCAL_CLUSTER_CERTIFICATES_H_
#define SLUICE_TOOLS_LOCAL_CLUSTER_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice::tools {

struct Certificates {
  std::string ca;  // ca.pem
  std::string server_cert, server_key;
  std::string client_cert, client_key;
  std::string expired_cert, expired_key;  // valid 2020-01-01 .. 2020-01-02
  std::string token;                      // file with a random bearer token
};

// Makes the files in `dir` (created if missing). Internal error with openssl's output when
// a step fails; FailedPrecondition when `openssl` is not installed.
absl::StatusOr<Certificates> MakeCertificates(const std::string& dir);

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_LOCAL_CLUSTER_CERTIFICATES_H_
