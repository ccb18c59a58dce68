#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/protocol.h"
#include "common/service/retry_policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;

TEST(ToGrpcStatus, MapsEveryCodeOneToOne) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), "m");
    EXPECT_EQ(static_cast<int>(ToGrpcStatus(s).error_code()), code);
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(s)), s);
  }
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("bad")).error_message(), "bad");
}

TEST(WireMessage, KeepsAMessageThatFits) {
  const std::string fits(6000, 'a');
  EXPECT_EQ(WireMessage(fits), fits);
  // Percent-encoded bytes count three: 2000 newlines are 6000 bytes on the wire.
  const std::string newlines(2000, '\n');
  EXPECT_EQ(WireMessage(newlines), newlines);
}

TEST(WireMessage, CutsTheMiddleOfALongOneKeepingItsStartAndEnd) {
  const std::string message = "record 3: " + std::string(10000, 'x') + " end";
  // 10014 bytes: the first 1500 and the last 4000 stay.
  EXPECT_EQ(WireMessage(message), "record 3: " + std::string(1490, 'x') +
                                      "\n... (4514 bytes cut) ...\n" + std::string(3996, 'x') +
                                      " end");
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError(message)).error_message(), WireMessage(message));
}

TEST(WireMessage, CutsBetweenUtf8CharactersCountingTheirEncoding) {
  // "é" is 2 bytes, 6 on the wire: the head holds 250 of them (1500 wire bytes), the tail
  // 666 (3996); the cut moves to the characters' boundaries.
  std::string message;
  for (int i = 0; i < 3000; ++i) message += "\xc3\xa9";
  const std::string got = WireMessage(message);
  std::string head, tail;
  for (int i = 0; i < 250; ++i) head += "\xc3\xa9";
  for (int i = 0; i < 666; ++i) tail += "\xc3\xa9";
  EXPECT_EQ(got, head + "\n... (4168 bytes cut) ...\n" + tail);
}

TEST(FromGrpcStatus, PrefixesTheMessageAndKeepsTheCode) {
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::DATA_LOSS, "record 7"), "worker 127.0.0.1:5");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "worker 127.0.0.1:5: record 7");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "x").ok());
}

TEST(IsRetryable, FollowsTheTableForUnaryCallsAndStreams) {
  using C = absl::StatusCode;
  // code, unary, stream: the table in retry_policy.h, written out by hand.
  const struct {
    C code;
    bool unary;
    bool stream;
  } table[] = {
      {C::kUnavailable, true, true},
      {C::kDeadlineExceeded, true, true},
      {C::kAborted, true, true},
      {C::kCancelled, true, true},
      {C::kNotFound, false, true},
      {C::kInternal, false, false},
      {C::kDataLoss, false, false},
      {C::kInvalidArgument, false, false},
      {C::kPermissionDenied, false, false},
      {C::kResourceExhausted, false, false},
      {C::kFailedPrecondition, false, false},
      {C::kUnimplemented, false, false},
  };
  for (const auto& row : table) {
    EXPECT_EQ(IsRetryable(row.code), row.unary) << absl::StatusCodeToString(row.code);
    EXPECT_EQ(IsRetryable(row.code, CallKind::kBatchStream), row.stream)
        << absl::StatusCodeToString(row.code);
  }
  EXPECT_TRUE(IsUnreachable(C::kUnavailable));
  EXPECT_TRUE(IsUnreachable(C::kDeadlineExceeded));
  EXPECT_FALSE(IsUnreachable(C::kAborted));
  EXPECT_EQ(UnreachableCodes(), (std::vector<C>{C::kUnavailable, C::kDeadlineExceeded}));
}

TEST(PeerCallError, WordsUnreachableUnimplementedAndVerdictsForTheUser) {
  const absl::Status away =
      PeerCallError(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline"),
                    "sluice dispatcher", "10.0.0.5:7070", "GetStatus");
  EXPECT_EQ(away, absl::UnavailableError("cannot reach the sluice dispatcher at "
                                         "10.0.0.5:7070: GetStatus: deadline"));
  const absl::Status other = PeerCallError(absl::UnimplementedError("no such method"),
                                           "sluice dispatcher", "10.0.0.5:7070", "WorkerRegister");
  EXPECT_EQ(other, absl::FailedPreconditionError("the gRPC server at 10.0.0.5:7070 is not a sluice "
                                                 "dispatcher (WorkerRegister is unimplemented)"));
  const absl::Status verdict =
      PeerCallError(grpc::Status(grpc::StatusCode::NOT_FOUND, "job 7 not found"),
                    "sluice dispatcher", "d:1", "ClientHeartbeat");
  EXPECT_EQ(verdict,
            absl::NotFoundError("sluice dispatcher at d:1: ClientHeartbeat: job 7 not found"));
  EXPECT_TRUE(PeerCallError(grpc::Status::OK, "x", "y", "z").ok());
}

TEST(CheckProtocolVersion, NamesBothVersionsAndWhoIsBehind) {
  EXPECT_TRUE(CheckProtocolVersion(kProtocolVersion, "client", "worker").ok());
  const absl::Status newer = CheckProtocolVersion(kProtocolVersion + 1, "client", "worker");
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(newer.message(), HasSubstr("upgrade the worker"));
  const absl::Status older = CheckProtocolVersion(0, "client", "dispatcher");
  EXPECT_THAT(older.message(), HasSubstr("client protocol version 0, dispatcher"));
  EXPECT_THAT(older.message(), HasSubstr("upgrade the client"));
}

TEST(CreateChannel, RefusesAnEmptyAddress) {
  EXPECT_EQ(CreateChannel("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CreateChannel("127.0.0.1:1").ok());
}

}  // namespace
}  // namespace sluice::service
