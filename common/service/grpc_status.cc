#include "common/service/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace sluice::service {
namespace {

// Bytes a message byte takes in the grpc-message header, which
// percent-encodes all but printable ASCII.
int WireBytes(char c) { return c >= 0x20 && c < 0x7f && c != '%' ? 1 : 3; }

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

}  // namespace

std::string WireMessage(absl::string_view message) {
  size_t wire = 0;
  for (char c : message) wire += WireBytes(c);
  if (wire <= kMaxWireMessageBytes) return std::string(message);
  // The start (who failed, on which record) and the end (a traceback's last
  // lines, the exception), cut between UTF-8 characters.
  size_t head = 0;
  for (size_t w = 0; head < message.size() && w + WireBytes(message[head]) <= kWireHeadBytes;) {
    w += WireBytes(message[head++]);
  }
  while (head > 0 && IsUtf8Continuation(message[head])) --head;
  size_t tail = message.size();
  for (size_t w = 0; tail > head && w + WireBytes(message[tail - 1]) <= kWireTailBytes;) {
    w += WireBytes(message[--tail]);
  }
  while (tail < message.size() && IsUtf8Continuation(message[tail])) ++tail;
  return absl::StrCat(message.substr(0, head), "\n... (", tail - head, " bytes cut) ...\n",
                      message.substr(tail));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), WireMessage(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace sluice::service
