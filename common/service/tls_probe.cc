// DiagnoseTls (declared in channel_factory.h, beside WaitForConnected, which calls it): when a
// channel cannot connect, a TCP connection and a TLS handshake of our own (OpenSSL) tell why,
// in words that name the side to fix. gRPC only says "failed to connect"; this probe sees what
// it hides: a plaintext server answering a TLS client (or the reverse), the server's
// certificate chain and name checked against --tls-ca, a CertificateRequest the client cannot
// answer, and the alert a server sends when it refuses the client's certificate.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/service/certificate_checks.h"
#include "common/service/channel_factory.h"

namespace sluice::service {
namespace {

constexpr char kHint[] =
    " (is the server using TLS? is --tls-ca the CA that signed its "
    "certificate?)";

// host and port of "host:port" / "[v6]:port".
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
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
int ConnectTcp(const std::string& host, const std::string& port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  const int timeout_ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
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
                   getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0
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

void OnMessage(int write_p, int /*version*/, int content_type, const void* buf, size_t len,
               SSL* ssl, void* /*arg*/) {
  auto* state = static_cast<ProbeState*>(SSL_get_app_data(ssl));
  if (state == nullptr || write_p) return;
  const auto* bytes = static_cast<const unsigned char*>(buf);
  if (content_type == SSL3_RT_HANDSHAKE && len > 0 && bytes[0] == SSL3_MT_CERTIFICATE_REQUEST) {
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
                          peer ? Asn1TimeToString(X509_get0_notAfter(peer)) : "?", ")");
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return absl::StrCat("the server's certificate is not valid yet (not before ",
                          peer ? Asn1TimeToString(X509_get0_notBefore(peer)) : "?", ")");
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return absl::StrCat("the server's certificate does not name ",
                          o.tls_server_name.empty() ? host : o.tls_server_name,
                          " (add it to the certificate's subjectAltName, or pass "
                          "--tls-server-name with a name it carries)");
    default:
      return absl::StrCat("the server's certificate is not signed by --tls-ca ", o.tls_ca, " (",
                          reason, ")");
  }
}

}  // namespace

absl::Status DiagnoseTls(const std::string& address, const ChannelOptions& options,
                         absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return absl::OkStatus();
  const int fd = ConnectTcp(host, port, timeout);
  if (fd < 0) return absl::OkStatus();  // nothing listens (yet): not a TLS problem

  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE,
                     nullptr);  // judged below, to say why
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof kAlpn);
  SSL_CTX_set_msg_callback(ctx, OnMessage);
  const bool have_cert = !options.tls_cert.empty();
  if (options.tls()) SSL_CTX_load_verify_locations(ctx, options.tls_ca.c_str(), nullptr);
  if (have_cert) {
    SSL_CTX_use_certificate_chain_file(ctx, options.tls_cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, options.tls_key.c_str(), SSL_FILETYPE_PEM);
  }
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx);
  ProbeState state;
  SSL_set_app_data(ssl, &state);
  SSL_set_fd(ssl, fd);
  const std::string name = options.tls_server_name.empty() ? host : options.tls_server_name;
  in6_addr ip;
  const bool is_ip =
      inet_pton(AF_INET, name.c_str(), &ip) == 1 || inet_pton(AF_INET6, name.c_str(), &ip) == 1;
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
      problem = absl::StrCat("cannot connect to ", address,
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
                    : absl::StrCat("the server ended the handshake (", state.alert, ")");
    } else {
      problem =
          "the server does not speak TLS (start it with --tls-cert/--tls-key, "
          "or drop "
          "--tls-ca on this side)";
    }
  } else if (const long verify = SSL_get_verify_result(ssl); verify != X509_V_OK) {
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
    const bool timed_out = read <= 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (read <= 0 && !timed_out && (state.alert_code >= 0 || state.cert_requested)) {
      if (state.cert_requested && !have_cert) {
        problem =
            "the server requires a client certificate (mutual TLS): pass "
            "--tls-cert and "
            "--tls-key";
      } else {
        problem = absl::StrCat("the server refused this client's certificate --tls-cert ",
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
  return absl::UnavailableError(
      absl::StrCat("TLS handshake with ", address, " failed: ", *problem, kHint));
}

}  // namespace sluice::service
