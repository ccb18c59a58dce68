#include "tools/local_cluster/local_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"

namespace sluice::tools {
namespace fs = std::filesystem;

namespace {

void AddSecurityFlags(const LocalClusterOptions& o, std::vector<std::string>* argv) {
  const std::pair<const char*, const std::string*> flags[] = {
      {"--tls-cert", &o.tls_cert},
      {"--tls-key", &o.tls_key},
      {"--tls-ca", &o.tls_ca},
      {"--auth-token-file", &o.auth_token_file}};
  for (const auto& [flag, value] : flags) {
    if (!value->empty()) argv->insert(argv->end(), {flag, *value});
  }
}

}  // namespace

std::string BinDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::InternalError("cannot find a free port: " + error);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to metrics port ", port, ": ", error));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  std::string response;
  bool sent = send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(request.size());
  char buf[65536];
  for (ssize_t n; sent && (n = recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!sent || body == std::string::npos || response.rfind("HTTP/1.", 0) != 0) {
    return absl::UnavailableError(absl::StrCat("no HTTP answer on metrics port ", port));
  }
  return response.substr(body + 4);
}

std::map<std::string, double> SumByLabel(const std::string& exposition, const std::string& metric,
                                         const std::string& label) {
  std::map<std::string, double> sums;
  const std::string key = label + "=\"";
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, metric) || line.empty() || line[0] != '{') continue;
    const size_t at = line.find(key);
    const size_t close = line.rfind('}');
    if (at == absl::string_view::npos || close == absl::string_view::npos) continue;
    const size_t begin = at + key.size();
    const size_t end = line.find('"', begin);
    double value;
    if (end == absl::string_view::npos ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(close + 1)), &value)) {
      continue;
    }
    sums[std::string(line.substr(begin, end - begin))] += value;
  }
  return sums;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterOptions options) {
  if (options.work_dir.empty()) return absl::InvalidArgumentError("LocalCluster needs a work_dir");
  if (options.workers < 0) return absl::InvalidArgumentError("--workers must be >= 0");
  std::error_code ec;
  fs::create_directories(options.work_dir, ec);
  if (ec) return absl::InternalError("cannot create '" + options.work_dir + "': " + ec.message());
  auto cluster = std::unique_ptr<LocalCluster>(new LocalCluster(std::move(options)));
  const LocalClusterOptions& o = cluster->options_;
  ASSIGN_OR_RETURN(cluster->dispatcher_,
                   cluster->LaunchDispatcher(o.dispatcher_host, o.dispatcher_port));
  for (int i = 0; i < o.workers; ++i) RETURN_IF_ERROR(cluster->AddWorker().status());
  return cluster;
}

absl::StatusOr<ServerProcess> LocalCluster::LaunchDispatcher(const std::string& host, int port) {
  const LocalClusterOptions& o = options_;
  const std::string state_dir = (fs::path(o.work_dir) / "dispatcher-state").string();
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  std::vector<std::string> argv = {(fs::path(o.bin_dir) / "sluice-dispatcher").string(),
                                   "--port",
                                   std::to_string(port),
                                   "--work-dir",
                                   state_dir,
                                   "--log-level",
                                   o.log_level,
                                   "--heartbeat-interval",
                                   absl::FormatDuration(o.heartbeat_interval),
                                   "--worker-timeout",
                                   absl::FormatDuration(o.worker_timeout)};
  if (!host.empty()) argv.insert(argv.end(), {"--host", host});
  AddSecurityFlags(o, &argv);
  argv.insert(argv.end(), o.extra_dispatcher_flags.begin(), o.extra_dispatcher_flags.end());
  return Launch("dispatcher", std::move(argv));
}

absl::Status LocalCluster::RestartDispatcher(const std::string& host) {
  const std::string address = dispatcher_.address;
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InternalError("cannot parse the dispatcher's address '" + address + "'");
  }
  dispatcher_.process->Signal(SIGKILL);
  (void)dispatcher_.process->Wait(absl::Seconds(10));
  ASSIGN_OR_RETURN(dispatcher_,
                   LaunchDispatcher(host.empty() ? options_.dispatcher_host : host, port));
  if (host.empty() && dispatcher_.address != address) {
    return absl::InternalError("the restarted dispatcher listens on " + dispatcher_.address +
                               ", not " + address);
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerProcess> LocalCluster::Launch(const std::string& name,
                                                   std::vector<std::string> argv,
                                                   const std::vector<std::string>& extra) {
  argv.insert(argv.end(), extra.begin(), extra.end());
  const std::string address_file = (fs::path(options_.work_dir) / (name + ".address")).string();
  std::error_code ec;
  fs::remove(address_file, ec);
  ServerProcess server;
  ASSIGN_OR_RETURN(server.metrics_port, PickFreePort());
  argv.insert(argv.end(), {"--address-file", address_file, "--metrics-port",
                           std::to_string(server.metrics_port)});
  ASSIGN_OR_RETURN(
      server.process,
      Subprocess::Start(argv, {.log_file = (fs::path(options_.work_dir) / (name + ".log")).string(),
                               .exit_with_parent = true}));
  ASSIGN_OR_RETURN(server.address,
                   WaitForAddressFile(address_file, *server.process, options_.start_timeout));
  return server;
}

absl::StatusOr<int> LocalCluster::AddWorker() {
  std::vector<std::string> argv = {
      (fs::path(options_.bin_dir) / "sluice-worker").string(),
      "--dispatcher",
      options_.dispatcher_target.empty() ? dispatcher_.address : options_.dispatcher_target,
      "--port",
      "0",
      "--log-level",
      options_.log_level,
      "--heartbeat-interval",
      absl::FormatDuration(options_.heartbeat_interval)};
  for (const std::string& root : options_.data_roots)
    argv.insert(argv.end(), {"--data-root", root});
  if (options_.worker_threads > 0) {
    argv.insert(argv.end(), {"--threads", std::to_string(options_.worker_threads)});
  }
  AddSecurityFlags(options_, &argv);
  argv.insert(argv.end(), options_.extra_worker_flags.begin(), options_.extra_worker_flags.end());
  ASSIGN_OR_RETURN(ServerProcess worker,
                   Launch(absl::StrCat("worker-", next_worker_id_++), std::move(argv)));
  workers_.push_back(std::move(worker));
  return static_cast<int>(workers_.size()) - 1;
}

void LocalCluster::SignalDispatcher(int signal) { dispatcher_.process->Signal(signal); }

void LocalCluster::SignalWorker(int i, int signal) { workers_[i].process->Signal(signal); }

std::vector<std::string> LocalCluster::ReapExitedWorkers() {
  std::vector<std::string> exited;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const std::optional<int> code =
        it->process == nullptr ? std::optional<int>() : it->process->Poll();
    if (!code.has_value()) {
      ++it;
      continue;
    }
    exited.push_back(absl::StrCat(it->process->name(), " (pid ", it->process->pid(), ", ",
                                  it->address, ") exited with code ", *code));
    it = workers_.erase(it);
  }
  return exited;
}

std::string LocalCluster::FindExitedChild() {
  auto check = [](ServerProcess& s) -> std::string {
    if (s.process == nullptr) return "";
    const std::optional<int> code = s.process->Poll();
    if (!code.has_value()) return "";
    return absl::StrCat(s.process->name(), " (pid ", s.process->pid(), ") exited with code ", *code,
                        "; log: ", s.process->log_file());
  };
  if (std::string e = check(dispatcher_); !e.empty()) return e;
  for (ServerProcess& w : workers_) {
    if (std::string e = check(w); !e.empty()) return e;
  }
  return "";
}

void LocalCluster::Stop(absl::Duration grace) {
  for (ServerProcess& w : workers_) {
    if (w.process != nullptr) w.process->Signal(SIGTERM);
  }
  for (ServerProcess& w : workers_) {
    if (w.process != nullptr) w.process->Stop(grace);
  }
  if (dispatcher_.process != nullptr) dispatcher_.process->Stop(grace);
}

LocalCluster::~LocalCluster() { Stop(absl::Seconds(5)); }

}  // namespace sluice::tools
