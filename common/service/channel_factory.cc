#include "common/service/channel_factory.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/credentials.h"

namespace sluice::service {
namespace {

constexpr char kHint[] =
    " (is the server using TLS? is --tls-ca the CA that signed its "
    "certificate?)";

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string message =
        absl::StrCat(flag, " ", path, ": cannot read: ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(message)
                         : absl::NotFoundError(message);
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

std::string Asn1Time(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, n);
  BIO_free(bio);
  return text;
}

// Every certificate in a PEM file; InvalidArgument when there is none.
absl::StatusOr<std::vector<X509*>> ReadCertificates(const std::string& pem,
                                                    const std::string& flag,
                                                    const std::string& path) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  std::vector<X509*> certs;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr))
    certs.push_back(cert);
  ERR_clear_error();
  BIO_free(bio);
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": no PEM certificate in it"));
  }
  return certs;
}

void FreeCertificates(std::vector<X509*>& certs) {
  for (X509* c : certs) X509_free(c);
  certs.clear();
}

absl::Status CheckValidNow(X509* cert, const std::string& flag,
                           const std::string& path) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the certificate expired on ",
                     Asn1Time(X509_get0_notAfter(cert))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the certificate is not valid before ",
                     Asn1Time(X509_get0_notBefore(cert))));
  }
  return absl::OkStatus();
}

absl::Status CheckCaFile(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadWholeFile(path, "--tls-ca");
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::vector<X509*>> certs =
      ReadCertificates(*pem, "--tls-ca", path);
  if (!certs.ok()) return certs.status();
  absl::Status status = CheckValidNow(certs->front(), "--tls-ca", path);
  FreeCertificates(*certs);
  return status;
}

// The bearer token check of a server: every call must carry "authorization: Bearer <token>".
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::shared_ptr<TokenFile> token)
      : token_(std::move(token)) {}
  bool IsBlocking() const override {
    return false;
  }  // a stat() and a hash: cheap

  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    const auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "missing bearer token: this server requires --auth-token-file "
          "(ClientOptions.auth_token_file)");
    }
    absl::StatusOr<std::string> token = token_->Get();
    if (!token.ok()) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the server cannot read its --auth-token-file: ",
                       token.status().message()));
    }
    const std::string presented(it->second.data(), it->second.size());
    if (!TokensEqual(presented, absl::StrCat("Bearer ", *token))) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "wrong bearer token: the --auth-token-file contents differ from the "
          "server's");
    }
    consumed_auth_metadata->insert({"authorization", presented});
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenFile> token_;
};

// A client's side of the token: adds it to every call.
class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::shared_ptr<TokenFile> token)
      : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "sluice-bearer-token"; }

  grpc::Status GetMetadata(
      grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
      const grpc::AuthContext& /*channel_auth_context*/,
      std::multimap<std::string, std::string>* metadata) override {
    absl::StatusOr<std::string> token = token_->Get();
    if (!token.ok()) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("--auth-token-file: ", token.status().message()));
    }
    metadata->insert({"authorization", absl::StrCat("Bearer ", *token)});
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenFile> token_;
};

absl::Status CheckChannelOptions(const ChannelOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (!o.tls_cert.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key need --tls-ca (the CA that signed the server's "
        "certificate)");
  }
  if (!o.auth_token_file.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--auth-token-file needs TLS (--tls-ca): a bearer token over plaintext "
        "can be read by "
        "anyone on the network");
  }
  if (!o.tls_server_name.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-server-name needs --tls-ca");
  }
  return absl::OkStatus();
}

// host and port of "host:port" / "[v6]:port".
bool SplitHostPort(const std::string& address, std::string* host,
                   std::string* port) {
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() ||
        address[close + 1] != ':')
      return false;
    *host = address.substr(1, close - 1);
    *port = address.substr(close + 2);
    return true;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return !host->empty() && !port->empty();
}

// A connected TCP socket with send/receive timeouts, or -1.
int ConnectTcp(const std::string& host, const std::string& port,
               absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  const int timeout_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof error;
      rc = poll(&p, 1, timeout_ms) == 1 &&
                   getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
                   error == 0
               ? 0
               : -1;
    }
    if (rc != 0) {
      close(fd);
      fd = -1;
      continue;
    }
    fcntl(fd, F_SETFL, flags);
    timeval tv = absl::ToTimeval(timeout);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  freeaddrinfo(res);
  return fd;
}

struct ProbeState {
  bool cert_requested = false;  // the server sent CertificateRequest
  std::string alert;            // the first alert the server sent, in words
  int alert_code = -1;
};

void OnMessage(int write_p, int /*version*/, int content_type, const void* buf,
               size_t len, SSL* ssl, void* /*arg*/) {
  auto* state = static_cast<ProbeState*>(SSL_get_app_data(ssl));
  if (state == nullptr || write_p) return;
  const auto* bytes = static_cast<const unsigned char*>(buf);
  if (content_type == SSL3_RT_HANDSHAKE && len > 0 &&
      bytes[0] == SSL3_MT_CERTIFICATE_REQUEST) {
    state->cert_requested = true;
  }
  if (content_type == SSL3_RT_ALERT && len >= 2 && state->alert_code < 0) {
    state->alert_code = bytes[1];
    state->alert = SSL_alert_desc_string_long(bytes[1]);
  }
}

std::string CertificateProblem(long verify, X509* peer, const ChannelOptions& o,
                               const std::string& host) {
  const std::string reason = X509_verify_cert_error_string(verify);
  switch (verify) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return absl::StrCat("the server's certificate expired (not after ",
                          peer ? Asn1Time(X509_get0_notAfter(peer)) : "?", ")");
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return absl::StrCat(
          "the server's certificate is not valid yet (not before ",
          peer ? Asn1Time(X509_get0_notBefore(peer)) : "?", ")");
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return absl::StrCat(
          "the server's certificate does not name ",
          o.tls_server_name.empty() ? host : o.tls_server_name,
          " (add it to the certificate's subjectAltName, or pass "
          "--tls-server-name with a name it carries)");
    default:
      return absl::StrCat("the server's certificate is not signed by --tls-ca ",
                          o.tls_ca, " (", reason, ")");
  }
}

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
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("--auth-token-file ", path_, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(message)
                         : absl::NotFoundError(message);
  }
  const int64_t mtime_ns =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime_ns == mtime_ns_ && st.st_size == size_ && st.st_ino == inode_ &&
      !token_.empty())
    return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadWholeFile(path_, "--auth-token-file");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-token-file ", path_, " is empty"));
  }
  token_ = token;
  mtime_ns_ = mtime_ns;
  size_ = st.st_size;
  inode_ = st.st_ino;
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenFile::Get() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(); !s.ok()) return s;
  return token_;
}

absl::Status CheckCertificateFiles(const std::string& cert_file,
                                   const std::string& key_file,
                                   const std::string& flag) {
  absl::StatusOr<std::string> cert_pem = ReadWholeFile(cert_file, flag);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadWholeFile(key_file, "--tls-key");
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::vector<X509*>> certs =
      ReadCertificates(*cert_pem, flag, cert_file);
  if (!certs.ok()) return certs.status();
  absl::Status status = CheckValidNow(certs->front(), flag, cert_file);
  if (status.ok()) {
    BIO* bio =
        BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (key == nullptr) {
      status = absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", key_file, ": no PEM private key in it (",
                       OpenSslError(), ")"));
    } else if (X509_check_private_key(certs->front(), key) != 1) {
      ERR_clear_error();
      status = absl::InvalidArgumentError(absl::StrCat(
          "--tls-key ", key_file, " is not the key of ", flag, " ", cert_file));
    }
    EVP_PKEY_free(key);
  }
  FreeCertificates(*certs);
  return status;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& address, const ChannelOptions& options) {
  if (address.empty())
    return absl::InvalidArgumentError("empty address (want host:port)");
  if (absl::Status s = CheckChannelOptions(options); !s.ok()) return s;
  grpc::ChannelArguments args;
  if (options.max_receive_message_bytes != 0)
    args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  if (!options.tls()) {
    return grpc::CreateCustomChannel(address,
                                     grpc::InsecureChannelCredentials(), args);
  }
  if (absl::Status s = CheckCaFile(options.tls_ca); !s.ok()) return s;
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadWholeFile(options.tls_ca, "--tls-ca");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!options.tls_cert.empty()) {
    if (absl::Status s = CheckCertificateFiles(options.tls_cert,
                                               options.tls_key, "--tls-cert");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> cert =
        ReadWholeFile(options.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadWholeFile(options.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  if (!options.tls_server_name.empty())
    args.SetSslTargetNameOverride(options.tls_server_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::SslCredentials(ssl);
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenFile>> token =
        TokenFile::Create(options.auth_token_file);
    if (!token.ok()) return token.status();
    credentials = grpc::CompositeChannelCredentials(
        credentials,
        grpc::MetadataCredentialsFromPlugin(
            std::make_unique<BearerTokenPlugin>(std::move(*token))));
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
CreateServerCredentials(const ServerSecurityOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (!options.tls()) {
    if (!options.tls_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-ca (mutual TLS) needs --tls-cert and --tls-key (this server's "
          "certificate)");
    }
    if (!options.auth_token_file.empty()) {
      return absl::InvalidArgumentError(
          "--auth-token-file needs --tls-cert and --tls-key: a bearer token "
          "over plaintext can "
          "be read by anyone on the network");
    }
    return grpc::InsecureServerCredentials();
  }
  if (absl::Status s = CheckCertificateFiles(options.tls_cert, options.tls_key,
                                             "--tls-cert");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> cert =
      ReadWholeFile(options.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadWholeFile(options.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_ca.empty()) {
    if (absl::Status s = CheckCaFile(options.tls_ca); !s.ok()) return s;
    absl::StatusOr<std::string> ca = ReadWholeFile(options.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::SslServerCredentials(ssl);
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenFile>> token =
        TokenFile::Create(options.auth_token_file);
    if (!token.ok()) return token.status();
    credentials->SetAuthMetadataProcessor(
        std::make_shared<BearerTokenProcessor>(std::move(*token)));
  }
  return credentials;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  return grpc::InsecureServerCredentials();
}

absl::Status DiagnoseTls(const std::string& address,
                         const ChannelOptions& options,
                         absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return absl::OkStatus();
  const int fd = ConnectTcp(host, port, timeout);
  if (fd < 0)
    return absl::OkStatus();  // nothing listens (yet): not a TLS problem

  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE,
                     nullptr);  // judged below, to say why
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof kAlpn);
  SSL_CTX_set_msg_callback(ctx, OnMessage);
  const bool have_cert = !options.tls_cert.empty();
  if (options.tls())
    SSL_CTX_load_verify_locations(ctx, options.tls_ca.c_str(), nullptr);
  if (have_cert) {
    SSL_CTX_use_certificate_chain_file(ctx, options.tls_cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, options.tls_key.c_str(), SSL_FILETYPE_PEM);
  }
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx);
  ProbeState state;
  SSL_set_app_data(ssl, &state);
  SSL_set_fd(ssl, fd);
  const std::string name =
      options.tls_server_name.empty() ? host : options.tls_server_name;
  in6_addr ip;
  const bool is_ip = inet_pton(AF_INET, name.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, name.c_str(), &ip) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, name.c_str());
    SSL_set1_host(ssl, name.c_str());
  }

  std::optional<std::string> problem;
  const bool handshake = SSL_connect(ssl) == 1;
  if (!options.tls()) {
    // A plaintext client: does the server speak TLS?
    if (handshake || state.alert_code >= 0) {
      problem = absl::StrCat(
          "cannot connect to ", address,
          ": the server uses TLS and this client connects in plaintext (pass "
          "--tls-ca, the CA that signed the server's certificate)");
    }
  } else if (!handshake) {
    if (state.alert_code >= 0) {
      problem = state.cert_requested && !have_cert
                    ? std::string(
                          "the server requires a client certificate (mutual "
                          "TLS): pass "
                          "--tls-cert and --tls-key")
                    : absl::StrCat("the server ended the handshake (",
                                   state.alert, ")");
    } else {
      problem =
          "the server does not speak TLS (start it with --tls-cert/--tls-key, "
          "or drop "
          "--tls-ca on this side)";
    }
  } else if (const long verify = SSL_get_verify_result(ssl);
             verify != X509_V_OK) {
    X509* peer = SSL_get1_peer_certificate(ssl);
    problem = CertificateProblem(verify, peer, options, name);
    X509_free(peer);
  } else {
    // TLS 1.3: the server judges our certificate after our side of the handshake is done; its
    // verdict (an alert) or its HTTP/2 SETTINGS arrive next.
    // gRPC's server may also just close the connection without an alert.
    char byte;
    errno = 0;
    const int read = SSL_read(ssl, &byte, 1);
    const bool timed_out =
        read <= 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (read <= 0 && !timed_out &&
        (state.alert_code >= 0 || state.cert_requested)) {
      if (state.cert_requested && !have_cert) {
        problem =
            "the server requires a client certificate (mutual TLS): pass "
            "--tls-cert and "
            "--tls-key";
      } else {
        problem = absl::StrCat(
            "the server refused this client's certificate --tls-cert ",
            options.tls_cert, " (",
            state.alert.empty() ? "connection closed" : state.alert,
            "; is it signed by the CA the server trusts, and valid now?)");
      }
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  ERR_clear_error();
  if (!problem.has_value()) return absl::OkStatus();
  if (!options.tls()) return absl::UnavailableError(*problem);
  return absl::UnavailableError(absl::StrCat("TLS handshake with ", address,
                                             " failed: ", *problem, kHint));
}

absl::Status WaitForConnected(grpc::Channel& channel,
                              const std::string& address,
                              const ChannelOptions& options,
                              absl::Time deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  absl::Time last_probe = absl::InfinitePast();
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE &&
        absl::Now() - last_probe >= absl::Seconds(1)) {
      // At most one probe a second: a server that is still starting is probed again later.
      last_probe = absl::Now();
      const absl::Duration left = deadline - absl::Now();
      if (left > absl::ZeroDuration()) {
        if (absl::Status why =
                DiagnoseTls(address, options, std::min(left, absl::Seconds(3)));
            !why.ok()) {
          return why;
        }
      }
    }
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return absl::DeadlineExceededError(
          absl::StrCat("no gRPC connection to ", address));
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return absl::OkStatus();
}

}  // namespace sluice::service
