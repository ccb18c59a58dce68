// sluice consume --dispatcher ADDR --spec FILE.yaml [--data DIR] --job NAME [--epochs E]
//   [--step-time 40ms]
//   [--consumer-index I --num-consumers N] [--deterministic] [--ids-out FILE]
//   [--stop-after-batches N --save-state FILE] [--restore-state FILE]
//   [--dispatcher-lost-timeout 10m]
// A trainer without the training: reads this consumer's share of every epoch through the
// service. --stop-after-batches N --save-state FILE returns N batches, saves the iterator's
// state and exits 0 (a training run checkpointing and stopping); --restore-state FILE
// continues from such a state, in a new process. Ctrl-C or SIGTERM leaves the job as a normal
// end does (its share freed at once) and exits 128 + the signal (InterruptWatcher).
// TLS and token: --tls-ca --tls-cert --tls-key --tls-server-name --auth-token-file
// (docs/security.md), also as SLUICE_TLS_CA, ... like every flag.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/duration_flag.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/base/signals.h"
#include "common/base/status_macros.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "common/service/server_main.h"
#include "data_worker/pipeline/spec.h"
#include "sluice/client.h"
#include "tools/cli/command.h"
#include "tools/cli/progress.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

struct ConsumeFlags {
  std::string dispatcher, spec, data, job, ids_out, save_state, restore_state;
  uint64_t stop_after_batches = 0;  // 0: read to the end
  uint64_t epochs = 1;
  uint64_t seed = 0;
  uint32_t consumer_index = 0;
  uint32_t num_consumers = 1;
  bool deterministic = false;
  bool drop_remainder = false;
  service::ChannelOptions security;  // --tls-* --auth-token-file
  // Sleep after each batch: a training step's stand-in (demand = batch ÷ step).
  absl::Duration step_time = absl::ZeroDuration();
  uint64_t pause_after_batches = 0;  // 0: never
  absl::Duration pause_for = absl::ZeroDuration();
  uint64_t split_size = 0;  // 0: the dispatcher's default
  // int32 on the wire; read wider so that a value out of range is named as such.
  int64_t priority = 0;
  uint32_t min_workers = 0;
  std::string finish;  // empty: the spec's
  std::string sharing = "off";
  std::string cache = "off";
  absl::Duration dispatcher_lost_timeout = ClientOptions().dispatcher_lost_timeout;
  uint64_t shared_memory_mb = ClientOptions().shared_memory_bytes >> 20;
};

std::string SignalName(int signal) { return absl::StrCat("SIG", sigabbrev_np(signal)); }

// Ctrl-C or SIGTERM while consuming: the loop stops after the batch in hand, the iterator
// leaves the job as at a normal end (the dispatcher frees this consumer's share at once, not
// when its lease runs out), and the process exits 128 + the signal. If the loop is blocked
// (no batch comes) for kStopGrace after the signal, the process exits then without leaving.
class InterruptWatcher {
 public:
  static constexpr absl::Duration kStopGrace = absl::Seconds(3);
  // Before any thread starts: the threads inherit the blocked signals.
  InterruptWatcher() {
    BlockStopSignals();
    thread_ = std::thread([this] {
      while (!done_) {
        const int signal = WaitForStopSignal(absl::Milliseconds(100));
        if (signal == 0) continue;
        signal_ = signal;
        const absl::Time deadline = absl::Now() + kStopGrace;
        while (!done_ && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
        if (done_) return;
        std::fprintf(stderr, "sluice consume: %s, and no batch came within %s: exiting\n",
                     SignalName(signal).c_str(), absl::FormatDuration(kStopGrace).c_str());
        std::_Exit(128 + signal);
      }
    });
  }
  ~InterruptWatcher() {
    done_ = true;
    thread_.join();
  }
  // The stop signal taken (SIGINT, SIGTERM), or 0.
  int signal() const { return signal_; }
  // Sleeps `d`, or less if a stop signal comes.
  void SleepFor(absl::Duration d) const {
    const absl::Time end = absl::Now() + d;
    while (signal_ == 0 && absl::Now() < end) {
      absl::SleepFor(std::min(end - absl::Now(), absl::Milliseconds(10)));
    }
  }

 private:
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

absl::Status RunConsume(const ConsumeFlags& flags, const InterruptWatcher& interrupts) {
  if ((flags.pause_after_batches > 0) != (flags.pause_for > absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "--pause-after-batches N and --pause-for DURATION go together (both > 0)");
  }
  ASSIGN_OR_RETURN(proto::Pipeline pipeline,
                   sluice::pipeline_spec::LoadPipelineSpecFile(flags.spec));
  if (!flags.data.empty()) {
    if (!fs::exists(fs::path(flags.data) / record::kManifestName)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--data '%s' is not a Unirecord dataset (no %s); the service reads "
                          "Unirecord: convert "
                          "it first with `sluice record convert --input %s --output DIR`",
                          flags.data, record::kManifestName, flags.data));
    }
    pipeline.mutable_source()->mutable_dataset()->set_path(fs::absolute(flags.data).string());
  }
  if (!flags.finish.empty()) pipeline.set_finish(flags.finish);
  // Validate here too, so a bad spec fails before a job exists, naming the node
  // and field.
  RETURN_IF_ERROR(data_worker::pipeline::Validate(pipeline).status());
  if (flags.consumer_index >= flags.num_consumers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--consumer-index %d must be < --num-consumers %d", flags.consumer_index,
                        flags.num_consumers));
  }

  ASSIGN_OR_RETURN(
      std::unique_ptr<DataServiceClient> client,
      DataServiceClient::Create({.dispatcher_address = flags.dispatcher,
                                 .dispatcher_lost_timeout = flags.dispatcher_lost_timeout,
                                 .shared_memory_bytes = flags.shared_memory_mb << 20,
                                 // The client's warnings (a job that had already finished, a
                                 // heartbeat that failed) on stderr.
                                 .logger = MakeStderrLogger("consume", spdlog::level::warn),
                                 .tls_ca = flags.security.tls_ca,
                                 .tls_cert = flags.security.tls_cert,
                                 .tls_key = flags.security.tls_key,
                                 .auth_token_file = flags.security.auth_token_file,
                                 .tls_server_name = flags.security.tls_server_name}));
  JobOptions job{.job_name = flags.job,
                 .pipeline = pipeline,
                 .seed = flags.seed,
                 .num_epochs = flags.epochs,
                 .num_consumers = flags.num_consumers,
                 .consumer_index = flags.consumer_index,
                 .deterministic = flags.deterministic,
                 .drop_remainder = flags.drop_remainder,
                 .split_size = flags.split_size,
                 .priority = static_cast<int32_t>(flags.priority),  // checked in range
                 .min_workers = flags.min_workers,
                 .sharing = flags.sharing,
                 .cache = flags.cache};
  if (!flags.restore_state.empty()) {
    // FILE[,FILE...]: one state, or the states of every old consumer (another number of
    // consumers mid-epoch).
    const std::vector<std::string> files = absl::StrSplit(flags.restore_state, ',');
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (file.empty() || !in)
        return absl::NotFoundError("--restore-state: cannot read '" + file + "'");
      std::stringstream bytes;
      bytes << in.rdbuf();
      job.restore_states.push_back(bytes.str());
    }
    if (files.size() == 1) {
      job.restore_state = std::move(job.restore_states.front());
      job.restore_states.clear();
    }
  }
  if (flags.stop_after_batches > 0 && flags.save_state.empty()) {
    return absl::InvalidArgumentError("--stop-after-batches needs --save-state FILE");
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<BatchIterator> batches, client->Open(job));
  std::ofstream ids;
  if (!flags.ids_out.empty()) {
    ids.open(flags.ids_out, flags.restore_state.empty() ? std::ios::trunc : std::ios::app);
    if (!ids) return absl::InvalidArgumentError("--ids-out: cannot write '" + flags.ids_out + "'");
  }
  ProgressBar bar("consume", 0);
  uint64_t images = 0, num_batches = 0;
  std::optional<double> first_batch_seconds;
  uint64_t first_batch_images = 0;
  double first_batch_cpu = 0;
  // Time from each batch's return to the next one's (the trainer's wait for data): the ones that
  // cross an epoch boundary apart from the others.
  std::vector<double> waits, epoch_gaps;
  std::optional<std::pair<absl::Time, uint64_t>> previous;  // the last batch: when, its epoch
  while (flags.stop_after_batches == 0 || num_batches < flags.stop_after_batches) {
    if (interrupts.signal() != 0) {
      bar.Done();
      return absl::CancelledError(absl::StrFormat(
          "interrupted (%s) after %llu batches (%llu images); left the job %s",
          SignalName(interrupts.signal()), static_cast<unsigned long long>(num_batches),
          static_cast<unsigned long long>(images), flags.job));
    }
    ASSIGN_OR_RETURN(std::optional<Batch> batch, batches->GetNext());
    if (!batch.has_value()) break;
    const absl::Time now = absl::Now();
    if (previous.has_value()) {
      (batch->epoch != previous->second ? epoch_gaps : waits)
          .push_back(absl::ToDoubleSeconds(now - previous->first));
    }
    if (!first_batch_seconds) {
      first_batch_seconds = absl::ToDoubleSeconds(absl::Now() - start);
      first_batch_images = batch->global_indices.size();
      first_batch_cpu = ProcessCpuSeconds();
    }
    ++num_batches;
    images += batch->global_indices.size();
    if (ids.is_open()) {
      for (uint64_t id : batch->global_indices) ids << id << '\n';
    }
    bar.Update(images);
    if (flags.step_time > absl::ZeroDuration()) interrupts.SleepFor(flags.step_time);
    if (num_batches == flags.pause_after_batches) {
      // The iterator stays open and heartbeats: only reading stops.
      std::printf("pausing reads for %s after %llu batches\n",
                  absl::FormatDuration(flags.pause_for).c_str(),
                  static_cast<unsigned long long>(num_batches));
      std::fflush(stdout);
      interrupts.SleepFor(flags.pause_for);
    }
    previous.emplace(absl::Now(), batch->epoch);
  }
  bar.Done();
  if (!flags.save_state.empty()) {
    ASSIGN_OR_RETURN(std::string state, batches->SaveState());
    if (ids.is_open()) ids.flush();
    RETURN_IF_ERROR(WriteFileAtomically(flags.save_state, state));
    std::printf("saved the iterator state after %llu batches to %s\n",
                static_cast<unsigned long long>(num_batches), flags.save_state.c_str());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "consumed %llu images in %llu batches over %llu epoch(s) in %.2fs; first "
      "batch after %.3fs\n",
      static_cast<unsigned long long>(images), static_cast<unsigned long long>(num_batches),
      static_cast<unsigned long long>(flags.epochs), seconds, first_batch_seconds.value_or(0));
  PrintFromFirstBatch(seconds - first_batch_seconds.value_or(0), images - first_batch_images,
                      ProcessCpuSeconds() - first_batch_cpu);
  if (!epoch_gaps.empty()) {
    // Scripts read this line (bench/epoch_gap.sh): the wait for the first batch of each new
    // epoch, and the median wait for a batch within an epoch.
    std::string gaps;
    for (double g : epoch_gaps) absl::StrAppendFormat(&gaps, " %.4f", g);
    std::sort(waits.begin(), waits.end());
    std::printf("epoch gaps:%s s; median wait within an epoch %.4f s\n", gaps.c_str(),
                waits.empty() ? 0.0 : waits[waits.size() / 2]);
  }
  const uint64_t received = batches->received_bytes();
  std::printf(
      "wire: %.0f bytes/image, %.0f%% through shared memory\n",
      images > 0 ? static_cast<double>(received) / images : 0.0,
      received > 0 ? 100.0 * static_cast<double>(batches->shared_memory_bytes()) / received : 0.0);
  // Last: scripts and tests read this line.
  std::printf("throughput: %.1f images/s\n", seconds > 0 ? images / seconds : 0.0);
  return absl::OkStatus();
}

}  // namespace

void AddConsumeCommand(CLI::App& app) {
  auto flags = std::make_shared<ConsumeFlags>();
  CLI::App* cmd = app.add_subcommand("consume",
                                     "Read this consumer's share of every "
                                     "epoch through the service (a trainer "
                                     "without the training)");
  cmd->add_option("--dispatcher", flags->dispatcher, "Dispatcher host:port")->required();
  cmd->add_option("--spec", flags->spec, "Pipeline YAML or JSON")->required();
  cmd->add_option("--data", flags->data, "Unirecord dataset replacing the spec's source path");
  cmd->add_option("--job", flags->job, "Job name; consumers of one job share it")->required();
  cmd->add_option("--epochs", flags->epochs, "Epochs")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Job seed (order and augmentation)")
      ->capture_default_str();
  cmd->add_option("--consumer-index", flags->consumer_index, "This consumer")
      ->capture_default_str();
  cmd->add_option("--num-consumers", flags->num_consumers, "Consumers (trainer processes)")
      ->capture_default_str();
  cmd->add_flag("--deterministic", flags->deterministic,
                "Release batches in split order: the same sequence whatever "
                "the worker count");
  cmd->add_flag("--drop-remainder", flags->drop_remainder,
                "Unequal shares: drop the tail instead of padding");
  cmd->add_option("--ids-out", flags->ids_out,
                  "Write each element's global record index here (appended "
                  "with --restore-state)");
  cmd->add_option("--stop-after-batches", flags->stop_after_batches,
                  "Exit 0 after returning this many batches (with --save-state)");
  cmd->add_option("--save-state", flags->save_state,
                  "Write the iterator's state here when stopping (see --restore-state)");
  cmd->add_option("--restore-state", flags->restore_state,
                  "Continue from a state --save-state wrote: the rest of the "
                  "epoch, each record once. FILE,FILE,...: the states every old "
                  "consumer saved at the same step; this consumer reads its equal "
                  "share of what they had not returned (any --num-consumers)");
  service::AddClientSecurityFlags(*cmd, &flags->security);
  // SLUICE_DISPATCHER, SLUICE_TLS_CA, ... (handy in a trainer pod).
  service::SetEnvNames(*cmd);
  cmd->add_option("--finish", flags->finish,
                  "Where normalize/hwc2chw/cast before the batch run: auto, "
                  "worker or client (default: the spec's `finish`, auto)");
  cmd->add_option("--priority", flags->priority,
                  "When the worker pool is bounded, a higher priority job "
                  "gets its need first")
      ->check(CLI::Range(int64_t{-2147483648}, int64_t{2147483647}))
      ->capture_default_str();
  cmd->add_option("--sharing", flags->sharing,
                  "auto: share production with the other jobs of the same dataset, "
                  "pipeline, seed and layout that opt in (docs/sharing.md); off: not")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  cmd->add_option("--cache", flags->cache,
                  "auto: the dispatcher caches the pipeline's deterministic prefix from the "
                  "second epoch when its measured cost says reading it back is cheaper "
                  "(docs/cache.md); off: only an explicit cache node caches")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  cmd->add_option("--min-workers", flags->min_workers,
                  "Workers reserved for this job when the pool is bounded (while every job's "
                  "reservation fits the pool; else the largest are dropped)")
      ->check(CLI::Range(0, 2147483647))
      ->capture_default_str();
  cmd->add_option("--split-size", flags->split_size,
                  "Records per split (0: the dispatcher's default, 1024)")
      ->capture_default_str();
  AddDurationOption(*cmd, "--step-time", &flags->step_time,
                    "Sleep this long after each batch, standing in for a "
                    "training step (e.g. 40ms)");
  cmd->add_option("--pause-after-batches", flags->pause_after_batches,
                  "After returning this many batches, read nothing for --pause-for, with the "
                  "iterator open (a trainer in a long evaluation or checkpoint), then go on");
  AddDurationOption(*cmd, "--pause-for", &flags->pause_for,
                    "How long --pause-after-batches stops reading");
  AddDurationOption(*cmd, "--dispatcher-lost-timeout", &flags->dispatcher_lost_timeout,
                    "Keep reading the splits held and retrying the dispatcher "
                    "this long before failing");
  cmd->add_option("--shared-memory-mb", flags->shared_memory_mb,
                  "Shared-memory ring offered to each worker, in MiB: workers on this host "
                  "write batches there instead of sending them through loopback TCP (0: off)")
      ->check(CLI::Range(0, 16384))
      ->capture_default_str();
  cmd->callback([flags] {
    InterruptWatcher interrupts;
    const absl::Status status = RunConsume(*flags, interrupts);
    Finish(status, interrupts.signal() != 0 ? 128 + interrupts.signal() : 1);
  });
}

}  // namespace sluice::cli
