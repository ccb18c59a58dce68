// sluice_python_reference DISPATCHER SPEC DATA JOB EPOCHS SEED OUT
// Reads one deterministic job through the C++ client and writes, for every
// batch in order, each column's bytes then the global indices (int64,
// little-endian) to OUT. tests/python/test_client.py writes the same stream
// from the Python client and compares the two byte for byte.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "common/pipeline_spec/parse.h"
#include "sluice/client.h"

namespace sluice {
namespace {

absl::Status Run(char** argv) {
  ASSIGN_OR_RETURN(proto::Pipeline pipeline, sluice::pipeline_spec::LoadPipelineSpecFile(argv[2]));
  pipeline.mutable_source()->mutable_dataset()->set_path(argv[3]);
  ASSIGN_OR_RETURN(std::unique_ptr<DataServiceClient> client,
                   DataServiceClient::Create({.dispatcher_address = argv[1]}));
  JobOptions job;
  job.job_name = argv[4];
  job.pipeline = pipeline;
  job.num_epochs = std::strtoull(argv[5], nullptr, 10);
  job.seed = std::strtoull(argv[6], nullptr, 10);
  job.deterministic = true;
  ASSIGN_OR_RETURN(std::unique_ptr<BatchIterator> it, client->Open(job));
  std::ofstream out(argv[7], std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError("cannot write " + std::string(argv[7]));
  while (true) {
    ASSIGN_OR_RETURN(std::optional<Batch> batch, it->GetNext());
    if (!batch) break;
    for (const Column& c : batch->columns) {
      std::string_view bytes = c.bytes();
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    for (uint64_t i : batch->global_indices) {
      const int64_t v = static_cast<int64_t>(i);
      out.write(reinterpret_cast<const char*>(&v), sizeof(v));
    }
  }
  out.close();
  if (!out) return absl::DataLossError("short write to " + std::string(argv[7]));
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DISPATCHER SPEC DATA JOB EPOCHS SEED OUT\n", argv[0]);
    return 2;
  }
  absl::Status status = sluice::Run(argv);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
