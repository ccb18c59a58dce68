// transport_bench: how fast batches cross loopback through sluice's data plane
// (the raw GetBatches stream of batch frames, one write in flight, the column
// slice referencing the sender's buffer, the receiver decoding the frame and
// owning the column: service/batch_codec.h) next to a plain TCP socket copy of
// the same bytes into a fresh buffer per batch, in one run. Prints MB/s, the
// ratio, and checks that both received every byte.
//
//   build/bin/transport_bench                   (uint8 64x224x224x3 batches)
//   build/bin/transport_bench --batch-mb 38.5   (the float32 batches)
//   NO_GATHER=1 build/bin/transport_bench       (attribution: the client skips
//                                                its copy into owned memory)
//   READ_CHUNK_KB=4096 / FRAME_KB=4096          (gRPC read chunk, HTTP/2 frame)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/service/batch_codec.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker_service.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Streams `batches` frames of one pre-built batch through sluice's codec
// (service::EncodeBatch: a header slice and a column slice that references the
// buffer), on the raw GetBatches method, one write in flight, as the worker does.
class Service final : public sluice::proto::WorkerService::WithRawCallbackMethod_GetBatches<
                          sluice::proto::WorkerService::CallbackService> {
 public:
  Service(size_t bytes, int batches) : batches_(batches) {
    auto buffer = std::make_shared<std::string>(bytes, '\x5a');
    const int64_t shape[] = {1, static_cast<int64_t>(bytes)};
    batch_.header.add_global_indices(0);
    (void)sluice::service::AppendColumn(
        "image", sluice::record::DType::kUint8, shape,
        {reinterpret_cast<const uint8_t*>(buffer->data()), bytes, buffer}, &batch_);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetBatches(grpc::CallbackServerContext*,
                                                         const grpc::ByteBuffer*) override {
    class Writer : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      Writer(const sluice::service::WireBatch& batch, int n) : batch_(batch), left_(n) { Next(); }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (left_-- == 0) return Finish(grpc::Status::OK);
        frame_ = sluice::service::EncodeBatch(batch_);
        StartWrite(&frame_);
      }
      const sluice::service::WireBatch& batch_;
      grpc::ByteBuffer frame_;
      int left_;
    };
    return new Writer(batch_, batches_);
  }

 private:
  sluice::service::WireBatch batch_;
  const int batches_;
};

// The client's side, as BatchIteratorImpl does it: decode the frame and make
// the column memory the trainer owns (service::Gather: the received slice, or
// one copy into a new buffer).
// NO_GATHER=1 (attribution): skip the copy into owned memory.
const bool kNoGather = std::getenv("NO_GATHER") != nullptr;

double GrpcMegabytesPerSecond(size_t bytes, int batches, size_t* copied) {
  Service service(bytes, batches);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  if (const char* kb = std::getenv("READ_CHUNK_KB")) {
    args.SetInt("grpc.experimental.tcp_min_read_chunk_size", std::atoi(kb) * 1024);
    args.SetInt("grpc.experimental.tcp_max_read_chunk_size", std::atoi(kb) * 1024);
  }
  if (const char* kb = std::getenv("FRAME_KB")) {
    args.SetInt("grpc.http2.max_frame_size", std::atoi(kb) * 1024);
  }
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext context;
  sluice::proto::GetBatchesRequest request;
  const auto start = Clock::now();
  auto reader = sluice::service::OpenBatchStream(channel.get(), &context, request);
  grpc::ByteBuffer frame;
  size_t received = 0;
  *copied = 0;
  while (reader->Read(&frame)) {
    auto batch = sluice::service::DecodeBatch(&frame);
    if (!batch.ok()) {
      std::fprintf(stderr, "bad frame: %s\n", std::string(batch.status().message()).c_str());
      break;
    }
    if (kNoGather) {  // attribution only: the bytes arrived, nobody owns them
      for (const auto& piece : batch->pieces[0]) received += piece.size();
      continue;
    }
    const sluice::service::ColumnBytes column = sluice::service::Gather(*batch, 0, /*alignment=*/1);
    if (column.owner != batch->slices) *copied += 1;
    received += column.size;
  }
  const grpc::Status status = reader->Finish();
  const double seconds = Seconds(start);
  server->Shutdown();
  if (!status.ok() || received != bytes * batches) {
    std::fprintf(stderr, "grpc stream failed (%zu of %zu bytes): %s\n", received, bytes * batches,
                 status.error_message().c_str());
    return 0;
  }
  return received / 1e6 / seconds;
}

double TcpMegabytesPerSecond(size_t bytes, int batches) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  listen(listener, 1);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread sender([&] {
    const int fd = accept(listener, nullptr, nullptr);
    const std::string buffer(bytes, '\x5a');
    for (int b = 0; b < batches; ++b) {
      for (size_t sent = 0; sent < bytes;) {
        const ssize_t n = send(fd, buffer.data() + sent, bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += n;
      }
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const auto start = Clock::now();
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  // Each batch lands in a fresh buffer the receiver owns (as the client's
  // batches do), freed when the next one is full.
  size_t received = 0;
  std::unique_ptr<uint8_t[]> buffer;
  for (bool more = true; more;) {
    buffer = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    size_t got = 0;
    while (got < bytes) {
      const ssize_t n = recv(fd, buffer.get() + got, bytes - got, 0);
      if (n <= 0) {
        more = false;
        break;
      }
      got += n;
    }
    received += got;
  }
  const double seconds = Seconds(start);
  close(fd);
  sender.join();
  close(listener);
  if (received != bytes * batches) {
    std::fprintf(stderr, "tcp copy received %zu of %zu bytes\n", received, bytes * batches);
    return 0;
  }
  return received / 1e6 / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gRPC batch streaming vs a plain TCP copy on loopback"};
  double batch_mb = 9.633792;  // 64 x 224 x 224 x 3 uint8
  int batches = 40;
  int reps = 3;
  app.add_option("--batch-mb", batch_mb, "Batch size in MB")->capture_default_str();
  app.add_option("--batches", batches, "Batches per run")->capture_default_str();
  app.add_option("--reps", reps, "Runs; the median is reported")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = static_cast<size_t>(batch_mb * 1e6);
  std::vector<double> grpc_rates, tcp_rates;
  size_t copied = 0;
  for (int r = 0; r < reps; ++r) {
    tcp_rates.push_back(TcpMegabytesPerSecond(bytes, batches));
    grpc_rates.push_back(GrpcMegabytesPerSecond(bytes, batches, &copied));
  }
  std::sort(grpc_rates.begin(), grpc_rates.end());
  std::sort(tcp_rates.begin(), tcp_rates.end());
  const double grpc = grpc_rates[reps / 2], tcp = tcp_rates[reps / 2];
  std::printf("batch %.2f MB x %d (%zu bytes each way, checked), median of %d\n", batch_mb, batches,
              bytes * batches, reps);
  std::printf("tcp socket copy   %8.0f MB/s\n", tcp);
  std::printf("grpc GetBatches   %8.0f MB/s  (%.0f batches/s)\n", grpc, grpc / batch_mb);
  std::printf("grpc batches copied once into owned memory: %zu of %d\n", copied, batches);
  std::printf("ratio grpc/tcp    %8.2f  (goal >= 0.8)\n", tcp > 0 ? grpc / tcp : 0.0);
  return 0;
}
