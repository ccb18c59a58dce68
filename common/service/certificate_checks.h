// The PEM files of transport security, checked before anything listens or connects: a
// certificate and its key (--tls-cert/--tls-key), a CA (--tls-ca). A mistake is then reported at
// start-up as InvalidArgument naming the flag and the file (NotFound/PermissionDenied when the
// file cannot be read), not later as a failed handshake. channel_factory.h runs these checks
// in CreateChannel and CreateServerCredentials.
#ifndef SLUICE_COMMON_SERVICE_CERTIFICATE_CHECKS_H_
#define SLUICE_COMMON_SERVICE_CERTIFICATE_CHECKS_H_

#include <openssl/asn1.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::service {

// The whole of file `path`, given by `flag`. NotFound or PermissionDenied naming both when it
// cannot be read.
absl::StatusOr<std::string> ReadFileForFlag(const std::string& path, const std::string& flag);

// Checks a certificate file and its key before anything listens or connects: readable PEM,
// key matches, valid now. `flag` names them in errors ("--tls-cert").
absl::Status CheckCertificateFiles(const std::string& cert_file, const std::string& key_file,
                                   const std::string& flag);

// Checks a --tls-ca file: readable, holds a PEM certificate, the first one valid now.
absl::Status CheckCaFile(const std::string& path);

// `time` as OpenSSL prints it ("Jan  2 00:00:00 2020 GMT"), for messages.
std::string Asn1TimeToString(const ASN1_TIME* time);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_CERTIFICATE_CHECKS_H_
