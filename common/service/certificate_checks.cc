// PEM certificate, key and CA checks (certificate_checks.h), with OpenSSL.
#include "common/service/certificate_checks.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice::service {
namespace {

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

// Every certificate in a PEM file; InvalidArgument when there is none.
absl::StatusOr<std::vector<X509*>> ReadCertificates(const std::string& pem, const std::string& flag,
                                                    const std::string& path) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  std::vector<X509*> certs;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) certs.push_back(cert);
  ERR_clear_error();
  BIO_free(bio);
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": no PEM certificate in it"));
  }
  return certs;
}

void FreeCertificates(std::vector<X509*>& certs) {
  for (X509* c : certs) X509_free(c);
  certs.clear();
}

absl::Status CheckValidNow(X509* cert, const std::string& flag, const std::string& path) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the certificate expired on ",
                                                   Asn1TimeToString(X509_get0_notAfter(cert))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path,
                                                   ": the certificate is not valid before ",
                                                   Asn1TimeToString(X509_get0_notBefore(cert))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileForFlag(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string message = absl::StrCat(flag, " ", path, ": cannot read: ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(message) : absl::NotFoundError(message);
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Asn1TimeToString(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, n);
  BIO_free(bio);
  return text;
}

absl::Status CheckCaFile(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFileForFlag(path, "--tls-ca");
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::vector<X509*>> certs = ReadCertificates(*pem, "--tls-ca", path);
  if (!certs.ok()) return certs.status();
  absl::Status status = CheckValidNow(certs->front(), "--tls-ca", path);
  FreeCertificates(*certs);
  return status;
}

absl::Status CheckCertificateFiles(const std::string& cert_file, const std::string& key_file,
                                   const std::string& flag) {
  absl::StatusOr<std::string> cert_pem = ReadFileForFlag(cert_file, flag);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFileForFlag(key_file, "--tls-key");
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::vector<X509*>> certs = ReadCertificates(*cert_pem, flag, cert_file);
  if (!certs.ok()) return certs.status();
  absl::Status status = CheckValidNow(certs->front(), flag, cert_file);
  if (status.ok()) {
    BIO* bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (key == nullptr) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "--tls-key ", key_file, ": no PEM private key in it (", OpenSslError(), ")"));
    } else if (X509_check_private_key(certs->front(), key) != 1) {
      ERR_clear_error();
      status = absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", key_file, " is not the key of ", flag, " ", cert_file));
    }
    EVP_PKEY_free(key);
  }
  FreeCertificates(*certs);
  return status;
}

}  // namespace sluice::service
