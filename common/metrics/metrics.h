// Thin helpers over prometheus-cpp. Components build their metrics once, in
// their constructor, from the `prometheus::Registry&` in their Options, and
// keep the returned references: the hot path then touches only an atomic.
//
//   prometheus::Counter& served =
//       AddCounter(registry, "sluice_worker_elements_total",
//                  "Elements served to consumers.");
//   served.Increment();
//
// Names follow sluice_<component>_<what>_<unit>; counters end in _total. Adding
// the same name twice with the same labels returns the same metric.
#ifndef SLUICE_COMMON_METRICS_METRICS_H_
#define SLUICE_COMMON_METRICS_METRICS_H_

#include <map>
#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace sluice {

using MetricLabels = std::map<std::string, std::string>;

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const MetricLabels& labels = {});
prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const MetricLabels& labels = {});
prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help, const std::vector<double>& buckets,
                                    const MetricLabels& labels = {});

// `count` bucket bounds start, start*factor, start*factor^2, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Latency buckets from 10 µs to ~40 s, for per-op and per-RPC histograms.
const std::vector<double>& LatencyBuckets();

}  // namespace sluice

#endif  // SLUICE_COMMON_METRICS_METRICS_H_
