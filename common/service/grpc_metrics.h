// Request metrics of a gRPC server, by method and status code, from a server interceptor (so no
// service has to count its own calls):
//
//   sluice_grpc_server_started_total{grpc_service, grpc_method}            calls started
//   sluice_grpc_server_handled_total{grpc_service, grpc_method, grpc_code} calls ended, by code
//   sluice_grpc_server_handling_seconds{grpc_service, grpc_method}         start to status sent
//                                                                          (a stream: its life)
//   sluice_<program>_errors_total{code}                                    calls that ended with
//                                                                          any code but OK and
//                                                                          CANCELLED (the caller
//                                                                          hung up)
//
// grpc_service is the full service name ("sluice.proto.WorkerService"), grpc_method the method
// ("GetBatches"), code the canonical name ("UNAVAILABLE"). Cardinality: methods x codes seen.
//
//   std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
//   f.push_back(std::make_unique<GrpcMetricsInterceptorFactory>(registry, "worker"));
//   builder.experimental().SetInterceptorCreators(std::move(f));
//
// Thread-safety: the factory and its metrics are used from every gRPC thread; the metric
// families are built once, the per-label children on first use under a mutex.
#ifndef SLUICE_COMMON_SERVICE_GRPC_METRICS_H_
#define SLUICE_COMMON_SERVICE_GRPC_METRICS_H_

#include <map>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace sluice::service {

// "UNAVAILABLE" for grpc::StatusCode::UNAVAILABLE.
const char* GrpcCodeName(grpc::StatusCode code);

class GrpcServerMetrics {
 public:
  // `program`: "dispatcher" or "worker" (the errors counter is sluice_<program>_errors_total).
  GrpcServerMetrics(prometheus::Registry& registry, const std::string& program);

  void Started(const std::string& service, const std::string& method);
  void Handled(const std::string& service, const std::string& method, grpc::StatusCode code,
               double seconds);

 private:
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Family<prometheus::Counter>& errors_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> started_children_
      ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, int>, prometheus::Counter*> handled_children_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Histogram*> seconds_children_
      ABSL_GUARDED_BY(mu_);
  std::map<int, prometheus::Counter*> errors_children_ ABSL_GUARDED_BY(mu_);
};

class GrpcMetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` must outlive the server.
  explicit GrpcMetricsInterceptorFactory(GrpcServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  GrpcServerMetrics* const metrics_;
};

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_GRPC_METRICS_H_
