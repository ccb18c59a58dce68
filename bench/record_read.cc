// record_read_bench: how fast Unirecord serves random records, next to the
// sequential read() speed of the same bytes, and how long a 1M-record index
// takes to load. Run through bench/record_read.sh; figures go to
// docs/BENCHMARKS.md ("Record reads").
//
// What is measured (warm page cache: every file is read once before timing):
//   view        ShardReader::ReadView(i) for every record, i in a random
//               permutation (sharding.h): checksum verified, a view into the
//               shard's memory map, no copy: the library's fastest verified
//               read. With T threads, thread t takes permutation positions
//               t, t+T, ...
//   encoded     ShardReader::ReadEncoded(i), same order: verified, copied into
//               a new std::string per record.
//   sequential  pread() of the shard's data section in 1 MiB chunks into one
//               reused buffer; with T threads each takes a contiguous 1/T.
//               No verification. The peer both random modes are compared to.
//   1st pass    diagnostic: ReadView as above, but on a Dataset opened just
//               before the pass, so the pass also pays the page faults that
//               populate the shard's memory map (what the first epoch of a
//               freshly opened dataset costs; later epochs run as "view").
//   index load  ShardReader::Open on a 1,000,000-record shard, with and
//               without an indexed int64 column: in a fresh process each time
//               (this binary re-executed with --open-once, as a worker opens a
//               shard), and repeated in one process; and the floor: a fresh
//               mmap of the shard plus record::Checksum over its index bytes.
// MB/s are 10^6 bytes per second of record bytes delivered. Each figure is the
// median of --reps runs; the modes are interleaved within each run so a burst
// of load on a shared machine hits all of them alike.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/random.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/record/dataset.h"
#include "common/record/schema.h"
#include "common/record/shard.h"
#include "common/record/sharding.h"

namespace sluice::bench {
namespace {

namespace fs = std::filesystem;
using record::Dataset;
using record::DatasetWriter;
using record::DType;
using record::Schema;
using record::ShardReader;
using record::Tensor;

constexpr size_t kChunk = 1 << 20;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Size(uint64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

// Runs fn(t) on `threads` threads and returns the wall time in seconds.
double RunThreads(int threads, const std::function<void(int)>& fn) {
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
  for (auto& th : pool) th.join();
  return SecondsSince(start);
}

[[noreturn]] void Die(const absl::Status& status) {
  std::fprintf(stderr, "record_read_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

// Writes a one-column (bytes) dataset of `count` records of `record_bytes`
// pseudo-random bytes each, plus an indexed int64 label if `with_label`.
// Returns the time spent.
absl::StatusOr<double> WriteBytesDataset(const std::string& dir, uint64_t record_bytes,
                                         uint64_t count, bool with_label) {
  Schema schema{{{.name = "data", .dtype = DType::kBytes}}};
  if (with_label) {
    schema.columns.push_back({.name = "label", .dtype = DType::kInt64, .indexed = true});
  }
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<DatasetWriter> writer,
                   DatasetWriter::Create(dir, schema, DatasetWriter::Options{}));
  std::string payload(record_bytes, '\0');
  Rng rng(MixSeed({record_bytes, count}));
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t v = rng.NextU64();
    std::memcpy(&payload[i], &v, 8);
  }
  std::vector<Tensor> values(with_label ? 2 : 1);
  for (uint64_t i = 0; i < count; ++i) {
    // Make every record distinct without regenerating it.
    std::memcpy(payload.data(), &i, std::min<size_t>(8, payload.size()));
    values[0] = Tensor::Bytes(payload);
    if (with_label) values[1] = Tensor::Int64(static_cast<int64_t>(i % 1000));
    RETURN_IF_ERROR(writer->Add(values));
  }
  RETURN_IF_ERROR(writer->Finish().status());
  return SecondsSince(start);
}

// Reads every file in `dir` once so later reads come from the page cache.
void WarmCache(const std::string& dir) {
  std::vector<char> buf(kChunk);
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    }
  }
}

// One opened dataset of fixed-size records: its shard readers plus raw file
// descriptors for the sequential peer.
struct Subject {
  uint64_t record_bytes = 0;  // payload bytes per record
  std::unique_ptr<Dataset> dataset;
  std::vector<int> fds;  // one per shard
  // (shard, local index) per global index.
  std::vector<std::pair<uint32_t, uint64_t>> where;
  uint64_t data_bytes = 0;  // sum of encoded record sizes

  ~Subject() {
    for (int fd : fds) close(fd);
  }
};

std::unique_ptr<Subject> OpenSubject(const std::string& dir, uint64_t record_bytes) {
  auto s = std::make_unique<Subject>();
  s->record_bytes = record_bytes;
  auto dataset = Dataset::Open(dir);
  if (!dataset.ok()) Die(dataset.status());
  s->dataset = *std::move(dataset);
  for (size_t k = 0; k < s->dataset->num_shards(); ++k) {
    const ShardReader& shard = s->dataset->shard(k);
    const int fd = open(shard.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(absl::InternalError("cannot open " + shard.path()));
    s->fds.push_back(fd);
    for (uint64_t i = 0; i < shard.record_count(); ++i) {
      s->where.push_back({static_cast<uint32_t>(k), i});
      s->data_bytes += shard.index()[i].size;
    }
  }
  return s;
}

void PreadOrDie(int fd, char* buf, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = pread(fd, buf, n, static_cast<off_t>(offset));
    if (got <= 0) Die(absl::InternalError("pread failed"));
    buf += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// kFirstView runs as kView, on a freshly opened Subject.
enum class Mode { kSequential, kView, kEncoded, kFirstView };
constexpr Mode kModes[] = {Mode::kSequential, Mode::kView, Mode::kEncoded, Mode::kFirstView};

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kSequential:
      return "sequential";
    case Mode::kView:
      return "view";
    case Mode::kEncoded:
      return "encoded";
    case Mode::kFirstView:
      return "view_first_pass";
  }
  return "?";
}

// One timed pass over all records of `s`; returns MB/s.
double Pass(const Subject& s, Mode mode, int threads, const std::vector<uint64_t>& perm) {
  std::vector<uint64_t> sink(threads, 0);
  double seconds = 0;
  if (mode == Mode::kSequential) {
    seconds = RunThreads(threads, [&](int t) {
      uint64_t acc = 0;  // per thread, written to sink[t] once
      std::vector<char> buf(kChunk);
      for (size_t k = 0; k < s.fds.size(); ++k) {
        const auto& index = s.dataset->shard(k).index();
        const uint64_t begin = index.front().offset;
        const uint64_t end = index.back().offset + index.back().size;
        const uint64_t part = (end - begin + threads - 1) / threads;
        const uint64_t lo = std::min(end, begin + part * t);
        const uint64_t hi = std::min(end, lo + part);
        for (uint64_t off = lo; off < hi; off += kChunk) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, hi - off));
          PreadOrDie(s.fds[k], buf.data(), n, off);
          acc += static_cast<unsigned char>(buf[n - 1]);
        }
      }
      sink[t] = acc;
    });
  } else {
    seconds = RunThreads(threads, [&](int t) {
      uint64_t acc = 0;
      for (size_t j = t; j < perm.size(); j += threads) {
        const auto [k, local] = s.where[perm[j]];
        const ShardReader& shard = s.dataset->shard(k);
        switch (mode) {
          case Mode::kView:
          case Mode::kFirstView: {
            auto view = shard.ReadView(local);
            if (!view.ok()) Die(view.status());
            acc += static_cast<unsigned char>(view->back());
            break;
          }
          case Mode::kEncoded: {
            auto encoded = shard.ReadEncoded(local);
            if (!encoded.ok()) Die(encoded.status());
            acc += static_cast<unsigned char>(encoded->back());
            break;
          }
          default:
            break;
        }
      }
      sink[t] = acc;
    });
  }
  uint64_t total = 0;
  for (uint64_t v : sink) total += v;
  if (total == 0xdeadbeef) std::printf(" ");  // keep `sink` alive
  return static_cast<double>(s.data_bytes) / seconds / 1e6;
}

// Times one ShardReader::Open of `path` in a new process (this binary with
// --open-once) and returns its milliseconds.
double OpenInFreshProcess(const std::string& path) {
  int fds[2];
  if (pipe(fds) != 0) Die(absl::InternalError("pipe"));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string flag = "--open-once";
  std::string arg = path;
  char* argv[] = {self.data(), flag.data(), arg.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, environ) != 0) {
    Die(absl::InternalError("cannot spawn " + self));
  }
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die(absl::InternalError("--open-once " + path + " failed: " + out));
  }
  return std::stod(out);
}

// The child side of OpenInFreshProcess.
int OpenOnce(const std::string& path) {
  const auto start = Clock::now();
  auto reader = ShardReader::Open(path);
  const double ms = SecondsSince(start) * 1e3;
  if (!reader.ok()) {
    std::printf("%s\n", reader.status().ToString().c_str());
    return 1;
  }
  std::printf("%.3f\n", ms);
  return 0;
}

struct IndexLoad {
  std::string name;
  uint64_t file_bytes = 0;
  uint64_t index_bytes = 0;
  double write_seconds = 0;
  std::vector<double> fresh_ms;  // Open in a new process
  std::vector<double> open_ms;   // repeated Open in this process
  std::vector<double> floor_ms;  // fresh mmap + Checksum of the index bytes
};

IndexLoad MeasureIndexLoad(const std::string& dir, const std::string& name, uint64_t records,
                           bool with_label, int reps) {
  IndexLoad r;
  r.name = name;
  auto written = WriteBytesDataset(dir, /*record_bytes=*/1, records, with_label);
  if (!written.ok()) Die(written.status());
  r.write_seconds = *written;
  const std::string path = (fs::path(dir) / "shard-00000.urec").string();
  WarmCache(dir);
  for (int i = 0; i < reps; ++i) r.fresh_ms.push_back(OpenInFreshProcess(path));
  for (int i = 0; i < reps + 1; ++i) {
    const auto start = Clock::now();
    auto reader = ShardReader::Open(path);
    const double ms = SecondsSince(start) * 1e3;
    if (!reader.ok()) Die(reader.status());
    if ((*reader)->record_count() != records) {
      Die(absl::InternalError("wrong record count"));
    }
    r.file_bytes = (*reader)->file_size();
    const auto& index = (*reader)->index();
    const uint64_t index_offset = index.back().offset + index.back().size;
    r.index_bytes = r.file_bytes - index_offset - record::kFooterSize;
    if (i > 0) r.open_ms.push_back(ms);  // the first run is a warm-up

    // Floor: what Open cannot avoid — map the file, fault in and hash the
    // index bytes.
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(absl::InternalError("cannot open " + path));
    const auto floor_start = Clock::now();
    void* map = mmap(nullptr, r.file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) Die(absl::InternalError("cannot mmap " + path));
    const uint64_t sum = record::Checksum(
        std::string_view(static_cast<const char*>(map) + index_offset, r.index_bytes));
    const double floor_ms = SecondsSince(floor_start) * 1e3;
    munmap(map, r.file_bytes);
    close(fd);
    if (sum != (*reader)->index_checksum()) {
      Die(absl::DataLossError("index checksum"));
    }
    if (i > 0) r.floor_ms.push_back(floor_ms);
  }
  return r;
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--open-once") {
    return OpenOnce(argv[2]);
  }
  CLI::App app{
      "Unirecord random-read and index-load benchmark (see "
      "docs/BENCHMARKS.md)"};
  std::string dir_flag;
  uint64_t mib = 256;
  int reps = 5;
  uint64_t index_records = 1'000'000;
  std::string csv;
  bool keep = false;
  app.add_option("--dir", dir_flag,
                 "Scratch folder for the datasets (default: a new folder in "
                 "$TMPDIR or /tmp, removed at exit)");
  app.add_option("--mib", mib, "Size of each record-size dataset, MiB")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "Timed runs per figure (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--index-records", index_records, "Records in the index-load shards")
      ->check(CLI::PositiveNumber);
  app.add_option("--csv", csv, "Also write every figure to this CSV file");
  app.add_flag("--keep", keep, "Keep the scratch folder");
  CLI11_PARSE(app, argc, argv);

  std::string dir = dir_flag;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/sluice-record-read-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      Die(absl::InternalError("cannot create a scratch folder"));
    }
    dir = tmpl;
  }
  std::printf("scratch folder: %s\n", dir.c_str());

  const std::vector<uint64_t> record_sizes = {4 << 10, 64 << 10, 512 << 10};
  const std::vector<int> thread_counts = {1, 2};
  // results[(record_bytes, threads, mode)] = MB/s per rep
  std::map<std::tuple<uint64_t, int, Mode>, std::vector<double>> results;

  for (uint64_t rb : record_sizes) {
    const std::string sub = (fs::path(dir) / absl::StrCat("r", rb)).string();
    const uint64_t count = (mib << 20) / rb;
    auto written = WriteBytesDataset(sub, rb, count, /*with_label=*/false);
    if (!written.ok()) Die(written.status());
    std::printf("wrote %llu x %s records (%s) in %.1f s\n", static_cast<unsigned long long>(count),
                Size(rb).c_str(), Size(mib << 20).c_str(), *written);
    std::fflush(stdout);
    WarmCache(sub);
    auto subject = OpenSubject(sub, rb);
    for (int rep = 0; rep < reps; ++rep) {
      const std::vector<uint64_t> perm = record::Permutation(count, /*seed=*/1, /*epoch=*/rep);
      for (int threads : thread_counts) {
        for (Mode mode : kModes) {
          double mbs = 0;
          if (mode == Mode::kFirstView) {
            auto fresh = OpenSubject(sub, rb);  // a new memory map
            mbs = Pass(*fresh, mode, threads, perm);
          } else {
            mbs = Pass(*subject, mode, threads, perm);
          }
          results[{rb, threads, mode}].push_back(mbs);
        }
      }
    }
    subject.reset();
    fs::remove_all(sub);  // keep the page cache and /tmp small
  }

  std::vector<IndexLoad> loads;
  loads.push_back(MeasureIndexLoad((fs::path(dir) / "index").string(), "1 bytes column",
                                   index_records,
                                   /*with_label=*/false, /*reps=*/9));
  loads.push_back(MeasureIndexLoad((fs::path(dir) / "index_label").string(),
                                   "bytes + indexed int64 label", index_records,
                                   /*with_label=*/true, /*reps=*/9));

  // ---- Report.
  std::printf(
      "\nRandom record reads vs sequential read(), warm page cache, %s per "
      "record size, median of %d runs (MB/s = 10^6 B/s)\n\n",
      Size(mib << 20).c_str(), reps);
  std::printf("%-8s %7s %12s %12s %12s %8s %8s | %10s\n", "record", "threads", "random", "random",
              "sequential", "ratio", "ratio", "ReadView");
  std::printf("%-8s %7s %12s %12s %12s %8s %8s | %10s\n", "", "", "ReadView", "ReadEncoded",
              "1MiB read()", "view/seq", "enc/seq", "1st pass");
  auto median = [&](uint64_t rb, int t, Mode m) { return Median(results[{rb, t, m}]); };
  for (uint64_t rb : record_sizes) {
    for (int t : thread_counts) {
      const double view = median(rb, t, Mode::kView);
      const double enc = median(rb, t, Mode::kEncoded);
      const double seq = median(rb, t, Mode::kSequential);
      std::printf("%-8s %7d %12.0f %12.0f %12.0f %7.0f%% %7.0f%% | %10.0f\n", Size(rb).c_str(), t,
                  view, enc, seq, 100 * view / seq, 100 * enc / seq,
                  median(rb, t, Mode::kFirstView));
    }
  }

  std::printf(
      "\nShardReader::Open of a %llu-record shard, warm page cache, median of "
      "%zu runs\n\n",
      static_cast<unsigned long long>(index_records), loads[0].open_ms.size());
  std::printf("%-28s %8s %9s %11s %11s %11s | %12s %7s\n", "shard", "file MiB", "index MiB",
              "fresh proc", "same proc", "fresh max", "mmap+xxh3", "write");
  for (const IndexLoad& l : loads) {
    std::printf("%-28s %8.1f %9.1f %8.1f ms %8.1f ms %8.1f ms | %9.1f ms %5.1f s\n", l.name.c_str(),
                l.file_bytes / 1048576.0, l.index_bytes / 1048576.0, Median(l.fresh_ms),
                Median(l.open_ms), *std::max_element(l.fresh_ms.begin(), l.fresh_ms.end()),
                Median(l.floor_ms), l.write_seconds);
  }

  std::printf("\n");
  for (uint64_t rb : record_sizes) {
    if (rb < (64 << 10)) continue;
    for (int t : thread_counts) {
      const double ratio = median(rb, t, Mode::kView) / median(rb, t, Mode::kSequential);
      std::printf(
          "%s goal: random (ReadView) >= 80%% of sequential, %s records, %d "
          "thread%s: %.0f%%\n",
          ratio >= 0.8 ? "PASS" : "MISS", Size(rb).c_str(), t, t > 1 ? "s" : "", 100 * ratio);
    }
  }
  for (const IndexLoad& l : loads) {
    const double ms = Median(l.fresh_ms);
    std::printf(
        "%s goal: %llu-record index load < 100 ms (%s, fresh process): %.1f "
        "ms\n",
        ms < 100 ? "PASS" : "MISS", static_cast<unsigned long long>(index_records), l.name.c_str(),
        ms);
  }

  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "kind,record_bytes,threads,mode,median,unit\n";
    for (uint64_t rb : record_sizes) {
      for (int t : thread_counts) {
        for (Mode m : kModes) {
          out << "read," << rb << "," << t << "," << ModeName(m) << "," << median(rb, t, m)
              << ",MB/s\n";
        }
      }
    }
    for (const IndexLoad& l : loads) {
      out << "index_fresh,0,1," << l.name << "," << Median(l.fresh_ms) << ",ms\n";
      out << "index_open,0,1," << l.name << "," << Median(l.open_ms) << ",ms\n";
      out << "index_floor,0,1," << l.name << "," << Median(l.floor_ms) << ",ms\n";
    }
  }
  if (!keep) {
    if (dir_flag.empty()) {
      fs::remove_all(dir);
    } else {
      fs::remove_all(fs::path(dir) / "index");
      fs::remove_all(fs::path(dir) / "index_label");
    }
  }
  return 0;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) { return sluice::bench::Main(argc, argv); }
