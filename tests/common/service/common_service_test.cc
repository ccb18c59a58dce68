#include <string>

#include "absl/status/status.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/protocol.h"
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
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("bad")).error_message(),
            "bad");
}

TEST(FromGrpcStatus, PrefixesTheMessageAndKeepsTheCode) {
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::DATA_LOSS, "record 7"),
                     "worker 127.0.0.1:5");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "worker 127.0.0.1:5: record 7");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "x").ok());
}

TEST(IsRetryable, OnlyTransientCodes) {
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(IsRetryable(absl::StatusCode::kInternal));
  EXPECT_FALSE(IsRetryable(absl::StatusCode::kDataLoss));
  EXPECT_FALSE(IsRetryable(absl::StatusCode::kInvalidArgument));
}

TEST(CheckProtocolVersion, NamesBothVersionsAndWhoIsBehind) {
  EXPECT_TRUE(CheckProtocolVersion(kProtocolVersion, "client", "worker").ok());
  const absl::Status newer =
      CheckProtocolVersion(kProtocolVersion + 1, "client", "worker");
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(newer.message(), HasSubstr("upgrade the worker"));
  const absl::Status older = CheckProtocolVersion(0, "client", "dispatcher");
  EXPECT_THAT(older.message(),
              HasSubstr("client protocol version 0, dispatcher"));
  EXPECT_THAT(older.message(), HasSubstr("upgrade the client"));
}

TEST(CreateChannel, RefusesAnEmptyAddress) {
  EXPECT_EQ(CreateChannel("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CreateChannel("127.0.0.1:1").ok());
}

}  // namespace
}  // namespace sluice::service
