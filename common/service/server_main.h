// What the main() of every sluice server (sluice-dispatcher, sluice-worker) shares: the common
// flags (each also read from an environment variable), shutdown signals, logging, the
// Prometheus exposer, transport security, the gRPC health service, the address file.
//
//   ServerFlags flags{.host = "0.0.0.0", .port = 7070};
//   CLI::App app{"sluice-dispatcher: ..."};
//   AddServerFlags(app, &flags);
//   ... program flags ...
//   SetEnvNames(app);                  // --metrics-address ← $SLUICE_METRICS_ADDRESS
//   CLI11_PARSE(app, argc, argv);
//   ASSIGN_OR_RETURN(auto server, ServerMain::Create("dispatcher", flags));   // blocks signals
//   ... build the impl with server->logger(), server->registry() ...
//   grpc::ServerBuilder builder; builder.RegisterService(&service);
//   RETURN_IF_ERROR(server->Start(builder));   // prints "listening on HOST:PORT"
//   while (!server->WaitForSignal(absl::Seconds(1))) {}
//   server->Shutdown(absl::Milliseconds(500));
//
// Metrics every server exports: sluice_build_info{version,revision} (1), and the request
// metrics of grpc_metrics.h (sluice_grpc_server_*, sluice_<name>_errors_total{code}).
//
// Lines on stdout (tests and scripts parse them):
//   metrics on HOST:PORT        once /metrics serves (with --metrics-port >= 0)
//   listening on HOST:PORT      once gRPC serves; HOST:PORT also goes to --address-file
// HOST is --host, except that a wildcard (0.0.0.0, ::) is shown as 127.0.0.1 (an address to
// connect to); the log line names the address actually bound (bind_address()).
//
// Secure by default: --host is loopback unless set. A non-loopback --host without TLS and client
// authentication is refused (InvalidArgument naming --allow-insecure) unless --allow-insecure.
//
// Thread-safety: one owner thread (main).
#ifndef SLUICE_COMMON_SERVICE_SERVER_MAIN_H_
#define SLUICE_COMMON_SERVICE_SERVER_MAIN_H_

#include <memory>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_metrics.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace sluice::service {

struct ServerFlags {
  std::string host = "127.0.0.1";  // --host: gRPC listening address
  int port = 0;                    // --port: 0 = any free port
  std::string address_file;        // --address-file
  int metrics_port = -1;           // --metrics-port: 0 = any, -1 = off
  // --metrics-address HOST or HOST:PORT (the port then overrides --metrics-port). Pods use
  // 0.0.0.0 so Prometheus can scrape them.
  std::string metrics_address = "127.0.0.1";
  std::string log_level = "info";   // --log-level
  std::string log_format = "text";  // --log-format text|json
  ServerSecurityOptions security;   // --tls-cert --tls-key --tls-ca --auth-token-file --tokens-file
  // --allow-insecure (SLUICE_ALLOW_INSECURE): listen on a non-loopback --host without TLS and
  // client authentication (--tokens-file, --auth-token-file or --tls-ca); logs a warning.
  bool allow_insecure = false;
};

// Registers the flags above on `app`; `flags` holds their defaults and receives the values.
void AddServerFlags(CLI::App& app, ServerFlags* flags);

// Registers --tls-ca --tls-cert --tls-key --tls-server-name --auth-token-file for a program
// (or subcommand) that is only a client.
void AddClientSecurityFlags(CLI::App& app, ChannelOptions* options);

// --version: prints "PROGRAM 0.1.0 (revision c5dfcc8)" (common/base/version.h) and exits 0.
void AddVersionFlag(CLI::App& app, std::string_view program);

// Makes every long option of `app` (and of its subcommands) also settable from the
// environment: --advertise-address ← SLUICE_ADVERTISE_ADDRESS. A flag on the command line wins.
// Call after all options are added, before parsing.
void SetEnvNames(CLI::App& app);

// "--metrics-address" → "SLUICE_METRICS_ADDRESS".
std::string EnvName(const std::string& long_name);

// Splits "HOST", "HOST:PORT", "[V6]:PORT" or a bare IPv6 address. *port = -1 when absent.
// InvalidArgument naming `flag` for a bad port.
absl::Status ParseHostPort(const std::string& text, const std::string& flag, std::string* host,
                           int* port);

class ServerMain {
 public:
  // Blocks SIGTERM/SIGINT in the calling thread (common/base/signals.h), so every thread started
  // later inherits the mask and only WaitForSignal sees them: call it before anything starts a
  // thread. Makes the logger, the registry, the server credentials and, if asked, the exposer
  // (prints the metrics line). InvalidArgument naming the flag for a bad value; Unavailable when
  // the metrics port cannot be bound.
  static absl::StatusOr<std::unique_ptr<ServerMain>> Create(std::string name, ServerFlags flags);
  ~ServerMain();

  const std::shared_ptr<spdlog::logger>& logger() const { return logger_; }
  prometheus::Registry& registry() { return *registry_; }
  const ServerFlags& flags() const { return flags_; }
  int metrics_port() const { return metrics_port_; }
  // The metrics host as bound (for messages).
  const std::string& metrics_host() const { return metrics_host_; }

  // Adds the listening port (--host:--port, with the credentials), the grpc.health.v1 service
  // (SERVING), starts the server, writes --address-file and prints "listening on HOST:PORT".
  // Unavailable "cannot listen on ..." when the port cannot be bound; Internal when the
  // address file cannot be written (the server is shut down again).
  absl::Status Start(grpc::ServerBuilder& builder);
  grpc::Server* server() const { return server_.get(); }
  int bound_port() const { return bound_port_; }
  const std::string& address() const { return address_; }  // HOST:PORT as printed
  // --host:PORT as bound ("0.0.0.0:7070"), for logs.
  const std::string& bind_address() const { return bind_address_; }

  // grpc.health.v1 status of every service ("" included). REQUIRES: Start() succeeded.
  void SetServing(bool serving);

  // Waits up to `timeout` for SIGTERM/SIGINT; true if one arrived.
  bool WaitForSignal(absl::Duration timeout);

  // Shuts the gRPC server down, cancelling calls still running after `grace`, and waits.
  void Shutdown(absl::Duration grace);

 private:
  ServerMain(std::string name, ServerFlags flags);

  const std::string name_;
  const ServerFlags flags_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<prometheus::Registry> registry_;
  // Request metrics of every call (grpc_metrics.h), registered in registry_.
  std::unique_ptr<GrpcServerMetrics> grpc_metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<grpc::Server> server_;
  std::string metrics_host_;
  int metrics_port_ = -1;
  int bound_port_ = 0;
  std::string address_;
  std::string bind_address_;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);

// The --allow-insecure rule: InvalidArgument when `flags` listen on a non-loopback host without
// TLS and client authentication and --allow-insecure is not set; sets *warning (empty
// otherwise) when it is set and the port is insecure.
absl::Status CheckListenSecurity(const ServerFlags& flags, std::string* warning);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_SERVER_MAIN_H_
