#include "common/service/server_main.h"

#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/base/process.h"
#include "common/base/signals.h"
#include "common/base/version.h"
#include "common/metrics/metrics.h"
#include "grpcpp/health_check_service_interface.h"

namespace sluice::service {
namespace {

bool IsWildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]" || host.empty();
}

// "host:port" with IPv6 hosts bracketed.
std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

void SetEnvNamesOf(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    if (name == "help" || name == "help-all" || name == "version") continue;
    option->envname(EnvName("--" + name));
  }
  for (CLI::App* sub : app.get_subcommands({})) SetEnvNamesOf(*sub);
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || absl::StartsWith(host, "127.");
}

absl::Status CheckListenSecurity(const ServerFlags& flags, std::string* warning) {
  warning->clear();
  if (IsLoopbackHost(flags.host)) return absl::OkStatus();
  const ServerSecurityOptions& s = flags.security;
  const bool authenticated =
      s.tls() && (!s.tls_ca.empty() || !s.tokens_file.empty() || !s.auth_token_file.empty());
  if (authenticated) return absl::OkStatus();
  const std::string what =
      absl::StrCat("--host ", flags.host, " is reachable from other machines and this port ",
                   s.tls() ? "authenticates no caller" : "is plaintext and unauthenticated",
                   ": anyone who can reach it may read and change every job");
  if (!flags.allow_insecure) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ". Give --tls-cert/--tls-key with --tokens-file (or --tls-ca), "
                     "listen on 127.0.0.1, or accept the risk with --allow-insecure "
                     "(SLUICE_ALLOW_INSECURE=1)"));
  }
  *warning = absl::StrCat(what, " (--allow-insecure)");
  return absl::OkStatus();
}

std::string EnvName(const std::string& long_name) {
  std::string name(absl::StripPrefix(long_name, "--"));
  absl::AsciiStrToUpper(&name);
  absl::StrReplaceAll({{"-", "_"}}, &name);
  return "SLUICE_" + name;
}

void SetEnvNames(CLI::App& app) { SetEnvNamesOf(app); }

absl::Status ParseHostPort(const std::string& text, const std::string& flag, std::string* host,
                           int* port) {
  *port = -1;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "': unclosed '['"));
    }
    *host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " '", text, "': want HOST, HOST:PORT or [V6]:PORT"));
      }
      port_text = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    const size_t colon = text.find(':');
    *host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  } else {
    *host = text;  // a name, an IPv4 address or a bare IPv6 address
  }
  if (host->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "': empty host"));
  }
  if (!port_text.empty() || (text.size() > 0 && text.back() == ':')) {
    int value = 0;
    if (!absl::SimpleAtoi(port_text, &value) || value < 0 || value > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " '", text, "': the port must be a number in 0..65535"));
    }
    *port = value;
  }
  return absl::OkStatus();
}

void AddServerFlags(CLI::App& app, ServerFlags* flags) {
  app.add_option("--host", flags->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", flags->port, "gRPC port; 0 = any free port")->capture_default_str();
  app.add_flag("--allow-insecure", flags->allow_insecure,
               "Allow a non-loopback --host without TLS and client "
               "authentication (logs a warning)");
  app.add_option("--address-file", flags->address_file,
                 "Write host:port here (atomically) once listening");
  app.add_option("--metrics-port", flags->metrics_port,
                 "Prometheus /metrics port; 0 = any (printed), -1 = off")
      ->capture_default_str();
  app.add_option("--metrics-address", flags->metrics_address,
                 "Address /metrics binds: HOST (0.0.0.0 in pods so Prometheus "
                 "can scrape) or "
                 "HOST:PORT (overrides --metrics-port)")
      ->capture_default_str();
  app.add_option("--log-level", flags->log_level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log-format", flags->log_format,
                 "text (for people) or json (one object per line, for log collectors)")
      ->capture_default_str();
  app.add_option("--tls-cert", flags->security.tls_cert,
                 "PEM certificate: serve TLS (with --tls-key); also this process's client "
                 "certificate");
  app.add_option("--tls-key", flags->security.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", flags->security.tls_ca,
                 "PEM CA: require and verify client certificates signed by it "
                 "(mutual TLS); "
                 "also verifies the servers this process calls");
  app.add_option("--auth-token-file", flags->security.auth_token_file,
                 "File with the bearer token every call must carry (re-read "
                 "when it changes; "
                 "needs TLS). Development mode: the one token holds every "
                 "role. With --tokens-file, only the token this process "
                 "presents when it calls another");
  app.add_option("--tokens-file", flags->security.tokens_file,
                 "Callers accepted, one 'token,user,uid[,\"group1,group2\"]' "
                 "a line (Kubernetes static token file; groups "
                 "sluice:trainers, sluice:workers, sluice:operators grant "
                 "roles; re-read when it changes; needs TLS)");
}

void AddClientSecurityFlags(CLI::App& app, ChannelOptions* options) {
  app.add_option("--tls-ca", options->tls_ca,
                 "PEM CA that signed the servers' certificates: connect with TLS");
  app.add_option("--tls-cert", options->tls_cert,
                 "PEM client certificate, for servers that require mutual TLS");
  app.add_option("--tls-key", options->tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", options->tls_server_name,
                 "Name the servers' certificates carry, when it is not the "
                 "address's host");
  app.add_option("--auth-token-file", options->auth_token_file,
                 "File with the bearer token to present on every call (needs --tls-ca)");
}

void AddVersionFlag(CLI::App& app, std::string_view program) {
  app.set_version_flag("--version", VersionLine(program),
                       "Print the version and git revision, then exit");
}

ServerMain::ServerMain(std::string name, ServerFlags flags)
    : name_(std::move(name)), flags_(std::move(flags)) {}

ServerMain::~ServerMain() {
  if (server_ != nullptr) Shutdown(absl::ZeroDuration());
}

absl::StatusOr<std::unique_ptr<ServerMain>> ServerMain::Create(std::string name,
                                                               ServerFlags flags) {
  auto main = std::unique_ptr<ServerMain>(new ServerMain(std::move(name), std::move(flags)));
  const ServerFlags& f = main->flags_;
  BlockStopSignals();

  absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(f.log_level);
  if (!level.ok()) return level.status();
  absl::StatusOr<LogFormat> format = ParseLogFormat(f.log_format);
  if (!format.ok()) return format.status();
  main->logger_ = MakeStderrLogger(main->name_, *level, *format);

  std::string warning;
  if (absl::Status s = CheckListenSecurity(f, &warning); !s.ok()) return s;
  if (!warning.empty()) main->logger_->warn("{}", warning);

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      CreateServerCredentials(f.security);
  if (!credentials.ok()) return credentials.status();
  main->credentials_ = std::move(*credentials);

  main->registry_ = std::make_shared<prometheus::Registry>();
  AddGauge(*main->registry_, "sluice_build_info",
           "1, labelled with the version and git revision of this binary.",
           {{"version", Version()}, {"revision", Revision()}})
      .Set(1);
  main->grpc_metrics_ = std::make_unique<GrpcServerMetrics>(*main->registry_, main->name_);
  std::string metrics_host;
  int metrics_port = f.metrics_port;
  int address_port = -1;
  if (absl::Status s =
          ParseHostPort(f.metrics_address, "--metrics-address", &metrics_host, &address_port);
      !s.ok()) {
    return s;
  }
  if (address_port >= 0) metrics_port = address_port;
  if (metrics_port >= 0) {
    const std::string bind = JoinHostPort(metrics_host, metrics_port);
    try {
      // Slow and half-open clients must not block the scrapes autoscaling reads: more
      // threads than prometheus-cpp's 2, and a read/write timeout that frees them.
      main->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
          "listening_ports", bind, "num_threads", "8", "request_timeout_ms", "5000"});
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("--metrics-address/--metrics-port ", bind, ": cannot listen: ", e.what()));
    }
    main->exposer_->RegisterCollectable(main->registry_);
    const std::vector<int> ports = main->exposer_->GetListeningPorts();
    main->metrics_port_ = ports.empty() ? metrics_port : ports.front();
    main->metrics_host_ = IsWildcard(metrics_host) ? "127.0.0.1" : metrics_host;
    std::cout << "metrics on " << JoinHostPort(main->metrics_host_, main->metrics_port_)
              << std::endl;
  }
  return main;
}

absl::Status ServerMain::Start(grpc::ServerBuilder& builder) {
  grpc::EnableDefaultHealthCheckService(true);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<GrpcMetricsInterceptorFactory>(grpc_metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  const std::string listen = JoinHostPort(flags_.host, flags_.port);
  builder.AddListeningPort(listen, credentials_, &bound_port_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || bound_port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (in use? try --port 0; a host this machine has?)"));
  }
  SetServing(true);
  address_ = JoinHostPort(IsWildcard(flags_.host) ? "127.0.0.1" : flags_.host, bound_port_);
  bind_address_ = JoinHostPort(flags_.host, bound_port_);
  if (!flags_.address_file.empty()) {
    if (absl::Status s = WriteFileAtomically(flags_.address_file, address_ + "\n"); !s.ok()) {
      Shutdown(absl::ZeroDuration());
      return absl::InternalError(
          absl::StrCat("--address-file ", flags_.address_file, ": cannot write: ", s.message()));
    }
  }
  std::cout << "listening on " << address_ << std::endl;
  return absl::OkStatus();
}

void ServerMain::SetServing(bool serving) {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

bool ServerMain::WaitForSignal(absl::Duration timeout) {
  const int signal_number = WaitForStopSignal(timeout);
  if (signal_number > 0) {
    logger_->info("signal {} received", signal_number);
    return true;
  }
  return false;
}

void ServerMain::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  server_.reset();
}

}  // namespace sluice::service
