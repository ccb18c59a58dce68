#include "common/base/signals.h"

#include <pthread.h>
#include <signal.h>

namespace sluice {
namespace {

sigset_t StopSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockStopSignals() {
  const sigset_t set = StopSignalSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForStopSignal(absl::Duration timeout) {
  const sigset_t set = StopSignalSet();
  const timespec ts = absl::ToTimespec(timeout);
  const int signal_number = sigtimedwait(&set, nullptr, &ts);
  return signal_number > 0 ? signal_number : 0;
}

}  // namespace sluice
