#include "common/service/grpc_metrics.h"

#include <chrono>

#include "common/metrics/metrics.h"

namespace sluice::service {
namespace {

// "/sluice.proto.WorkerService/GetBatches" -> {"sluice.proto.WorkerService", "GetBatches"}.
std::pair<std::string, std::string> SplitMethod(const char* full) {
  std::string name = full == nullptr ? "" : full;
  if (!name.empty() && name[0] == '/') name.erase(0, 1);
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return {"unknown", name.empty() ? "unknown" : name};
  return {name.substr(0, slash), name.substr(slash + 1)};
}

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(GrpcServerMetrics* metrics, const char* method)
      : metrics_(metrics), start_(std::chrono::steady_clock::now()) {
    std::tie(service_, method_) = SplitMethod(method);
    metrics_->Started(service_, method_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      metrics_->Handled(service_, method_, methods->GetSendStatus().error_code(), elapsed.count());
    }
    methods->Proceed();
  }

 private:
  GrpcServerMetrics* const metrics_;
  const std::chrono::steady_clock::time_point start_;
  std::string service_;
  std::string method_;
};

}  // namespace

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

GrpcServerMetrics::GrpcServerMetrics(prometheus::Registry& registry, const std::string& program)
    : started_(prometheus::BuildCounter()
                   .Name("sluice_grpc_server_started_total")
                   .Help("gRPC calls started on this server, by service and method.")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("sluice_grpc_server_handled_total")
                   .Help("gRPC calls this server ended, by service, method and status code.")
                   .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("sluice_grpc_server_handling_seconds")
                   .Help("Seconds from a call's start to its status (a stream: its lifetime).")
                   .Register(registry)),
      errors_(prometheus::BuildCounter()
                  .Name("sluice_" + program + "_errors_total")
                  .Help("Calls this " + program +
                        " answered with an error, by status code (grpc_code of "
                        "sluice_grpc_server_handled_total summed over methods, less OK "
                        "and CANCELLED: the caller hung up).")
                  .Register(registry)) {}

void GrpcServerMetrics::Started(const std::string& service, const std::string& method) {
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    prometheus::Counter*& child = started_children_[{service, method}];
    if (child == nullptr) {
      child = &started_.Add({{"grpc_service", service}, {"grpc_method", method}});
    }
    counter = child;
  }
  counter->Increment();
}

void GrpcServerMetrics::Handled(const std::string& service, const std::string& method,
                                grpc::StatusCode code, double seconds) {
  prometheus::Counter* handled;
  prometheus::Histogram* histogram;
  prometheus::Counter* error = nullptr;
  {
    absl::MutexLock lock(&mu_);
    prometheus::Counter*& h = handled_children_[{service, method, static_cast<int>(code)}];
    if (h == nullptr) {
      h = &handled_.Add(
          {{"grpc_service", service}, {"grpc_method", method}, {"grpc_code", GrpcCodeName(code)}});
    }
    handled = h;
    prometheus::Histogram*& s = seconds_children_[{service, method}];
    if (s == nullptr) {
      s = &seconds_.Add({{"grpc_service", service}, {"grpc_method", method}}, LatencyBuckets());
    }
    histogram = s;
    // CANCELLED is the caller hanging up (a trainer closing its stream), not an error here.
    if (code != grpc::StatusCode::OK && code != grpc::StatusCode::CANCELLED) {
      prometheus::Counter*& e = errors_children_[static_cast<int>(code)];
      if (e == nullptr) e = &errors_.Add({{"code", GrpcCodeName(code)}});
      error = e;
    }
  }
  handled->Increment();
  histogram->Observe(seconds);
  if (error != nullptr) error->Increment();
}

grpc::experimental::Interceptor* GrpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new MetricsInterceptor(metrics_, info->method());
}

}  // namespace sluice::service
