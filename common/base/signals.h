// The stop signals (SIGINT, SIGTERM) of a long-running main(): blocked, then
// taken synchronously, so no handler runs on an arbitrary thread.
//
//   BlockStopSignals();  // first thing in main(), before threads or children
//   ... start threads and child processes (threads inherit the mask;
//       Subprocess resets it in its children) ...
//   while (WaitForStopSignal(absl::Seconds(1)) == 0) { ... periodic work ... }
//
// Used by common/service/server_main (sluice-dispatcher, sluice-worker) and
// `sluice local`.
#ifndef SLUICE_COMMON_BASE_SIGNALS_H_
#define SLUICE_COMMON_BASE_SIGNALS_H_

#include "absl/time/time.h"

namespace sluice {

// Blocks SIGINT and SIGTERM in the calling thread; threads it starts afterwards
// inherit the mask, so the signals stay pending until WaitForStopSignal() takes
// them.
void BlockStopSignals();

// Waits up to `timeout` for a pending SIGINT or SIGTERM and takes it. Returns
// the signal number, or 0 if none arrived in time.
// REQUIRES: BlockStopSignals() was called by this thread or the one that
// started it.
int WaitForStopSignal(absl::Duration timeout);

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_SIGNALS_H_
