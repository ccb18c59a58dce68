#include "dispatcher/autoscale_signals.h"

namespace sluice::dispatcher {

void BusyCounter::Report(uint64_t elements, double busy_seconds) {
  if (elements < elements_total || busy_seconds < busy_seconds_total) window_set = false;
  elements_total = elements;
  busy_seconds_total = busy_seconds;
  if (!window_set) {
    window_set = true;
    window_elements = elements_total;
    window_busy = busy_seconds_total;
  }
}

void BusyCounter::Measure() {
  const double busy = busy_seconds_total - window_busy;
  if (!window_set || busy < 0.05) return;
  elements_per_busy_second = static_cast<double>(elements_total - window_elements) / busy;
  window_elements = elements_total;
  window_busy = busy_seconds_total;
}

}  // namespace sluice::dispatcher
