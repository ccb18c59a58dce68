// transport_bench: how fast batches cross loopback through sluice's data plane
// (a gRPC server-streaming WorkerService.GetBatches, one write in flight, one
// column buffer per batch) next to a plain TCP socket copy of the same bytes,
// in one run. Prints MB/s and the ratio.
//
//   build/bin/transport_bench --batch-mb 38.5 --batches 40
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "grpcpp/grpcpp.h"
#include "proto/worker_service.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Streams `batches` copies of one pre-built batch: the cost measured is gRPC's,
// not ours.
class Service final : public sluice::proto::WorkerService::CallbackService {
 public:
  Service(size_t bytes, int batches) : batches_(batches) {
    auto* column = batch_.add_columns();
    column->set_name("image");
    column->set_dtype(sluice::proto::TENSOR_DTYPE_FLOAT32);
    column->mutable_data()->assign(bytes, '\x5a');
  }

  grpc::ServerWriteReactor<sluice::proto::Batch>* GetBatches(
      grpc::CallbackServerContext*,
      const sluice::proto::GetBatchesRequest*) override {
    class Writer : public grpc::ServerWriteReactor<sluice::proto::Batch> {
     public:
      Writer(const sluice::proto::Batch& batch, int n)
          : batch_(batch), left_(n) {
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok)
          return Finish(
              grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (left_-- == 0) return Finish(grpc::Status::OK);
        StartWrite(&batch_);
      }
      const sluice::proto::Batch& batch_;
      int left_;
    };
    return new Writer(batch_, batches_);
  }

 private:
  sluice::proto::Batch batch_;
  const int batches_;
};

double GrpcMegabytesPerSecond(size_t bytes, int batches) {
  Service service(bytes, batches);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto stub = sluice::proto::WorkerService::NewStub(
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  sluice::proto::GetBatchesRequest request;
  const auto start = Clock::now();
  auto reader = stub->GetBatches(&context, request);
  sluice::proto::Batch batch;
  size_t received = 0;
  while (reader->Read(&batch)) received += batch.columns(0).data().size();
  const grpc::Status status = reader->Finish();
  const double seconds = Seconds(start);
  server->Shutdown();
  if (!status.ok() || received != bytes * batches) {
    std::fprintf(stderr, "grpc stream failed: %s\n",
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
        const ssize_t n =
            send(fd, buffer.data() + sent, bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += n;
      }
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const auto start = Clock::now();
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  std::string buffer(bytes,
                     '\0');  // the receiver owns each batch, as the client does
  size_t received = 0;
  for (ssize_t n; (n = recv(fd, buffer.data() + received % bytes,
                            bytes - received % bytes, 0)) > 0;) {
    received += n;
  }
  const double seconds = Seconds(start);
  close(fd);
  sender.join();
  close(listener);
  return received / 1e6 / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gRPC batch streaming vs a plain TCP copy on loopback"};
  double batch_mb = 38.5;  // 64 x 3 x 224 x 224 float32
  int batches = 40;
  int reps = 3;
  app.add_option("--batch-mb", batch_mb, "Batch size in MB")
      ->capture_default_str();
  app.add_option("--batches", batches, "Batches per run")
      ->capture_default_str();
  app.add_option("--reps", reps, "Runs; the median is reported")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = static_cast<size_t>(batch_mb * 1e6);
  std::vector<double> grpc_rates, tcp_rates;
  for (int r = 0; r < reps; ++r) {
    tcp_rates.push_back(TcpMegabytesPerSecond(bytes, batches));
    grpc_rates.push_back(GrpcMegabytesPerSecond(bytes, batches));
  }
  std::sort(grpc_rates.begin(), grpc_rates.end());
  std::sort(tcp_rates.begin(), tcp_rates.end());
  const double grpc = grpc_rates[reps / 2], tcp = tcp_rates[reps / 2];
  std::printf("batch %.1f MB x %d, median of %d\n", batch_mb, batches, reps);
  std::printf("tcp socket copy   %8.0f MB/s\n", tcp);
  std::printf("grpc GetBatches   %8.0f MB/s  (%.0f batches/s)\n", grpc,
              grpc / batch_mb);
  std::printf("ratio grpc/tcp    %8.2f\n", tcp > 0 ? grpc / tcp : 0.0);
  return 0;
}
