#include "common/metrics/metrics.h"

namespace sluice {

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const MetricLabels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const MetricLabels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help, const std::vector<double>& buckets,
                                    const MetricLabels& labels) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      labels, prometheus::Histogram::BucketBoundaries(buckets));
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  bounds.reserve(count);
  for (double b = start; count-- > 0; b *= factor) bounds.push_back(b);
  return bounds;
}

const std::vector<double>& LatencyBuckets() {
  static const auto* buckets = new std::vector<double>(ExponentialBuckets(1e-5, 2.5, 17));
  return *buckets;
}

}  // namespace sluice
