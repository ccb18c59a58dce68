// Identities, roles and the --tokens-file (common/service/identity.h, tokens_file.h).
#include "common/service/identity.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/service/certificate_checks.h"
#include "common/service/tokens_file.h"
#include "common/service/watched_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/certificates.h"

namespace sluice::service {
namespace {

using ::sluice::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(ParseTokens, ReadsKubernetesStaticTokenLines) {
  auto tokens = ParseTokens(
      "# comment\n"
      "t-alice,alice,1001,\"sluice:trainers\"\n"
      "\n"
      "t-ops,ops,3001,\"sluice:operators,sluice:trainers\"\n"
      "t-w,worker,2001,sluice:workers\n"
      "t-none,nobody,4001\n",
      "tokens.csv");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 4u);
  EXPECT_EQ(tokens->at("t-alice").user, "alice");
  EXPECT_THAT(tokens->at("t-alice").groups, ElementsAre("sluice:trainers"));
  EXPECT_THAT(tokens->at("t-ops").groups, ElementsAre("sluice:operators", "sluice:trainers"));
  EXPECT_THAT(tokens->at("t-w").groups, ElementsAre("sluice:workers"));
  EXPECT_TRUE(tokens->at("t-none").groups.empty());
  EXPECT_FALSE(tokens->at("t-none").all_roles);
}

TEST(ParseTokens, NamesTheBadLine) {
  auto s = ParseTokens("a,alice,1\nb,bob\n", "f.csv").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tokens-file f.csv line 2: want token,user,uid"));
  s = ParseTokens("a,alice,1\na,bob,2\n", "f.csv").status();
  EXPECT_THAT(s.message(), HasSubstr("line 2: a token listed twice"));
  s = ParseTokens("a,ev/il,1\n", "f.csv").status();
  EXPECT_THAT(s.message(), HasSubstr("line 1: user name 'ev/il' contains '/'"));
  s = ParseTokens("a,alice,1,\"sluice:trainers\n", "f.csv").status();
  EXPECT_THAT(s.message(), HasSubstr("line 1: unclosed '\"'"));
  s = ParseTokens(",alice,1\n", "f.csv").status();
  EXPECT_THAT(s.message(), HasSubstr("line 1: empty token"));
}

TEST(TokensFile, FindsTokensAndRereadsTheChangedFile) {
  TempDir dir;
  const std::string path = dir.Join("tokens.csv");
  Write(path, "t1,alice,1,sluice:trainers\n");
  auto tokens = TokensFile::Create(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto found = (*tokens)->Find("t1");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->user, "alice");
  EXPECT_FALSE((*tokens)->Find("t2")->has_value());

  Write(path + ".new", "t2,bob,2,sluice:trainers\nt3,carol,3\n");
  std::filesystem::rename(path + ".new", path);      // a new inode
  EXPECT_FALSE((*tokens)->Find("t1")->has_value());  // revoked
  EXPECT_EQ((*tokens)->Find("t2")->value().user, "bob");

  Write(path + ".new", "broken\n");
  std::filesystem::rename(path + ".new", path);
  auto broken = (*tokens)->Find("t2");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr("line 1"));
}

TEST(WatchedFile, InstallsOnlyChangesAndKeepsFailingOnABadFileUntilFixed) {
  TempDir dir;
  const std::string path = dir.Join("watched");
  WatchedFile file(path, "--some-file");
  const absl::Status missing =
      file.ReloadIfChanged([](const std::string&) { return absl::OkStatus(); });
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("--some-file " + path));

  std::vector<std::string> installed;
  auto install = [&](const std::string& text) {
    if (text == "bad") return absl::InvalidArgumentError("bad text");
    installed.push_back(text);
    return absl::OkStatus();
  };
  Write(path, "one");
  ASSERT_TRUE(file.ReloadIfChanged(install).ok());
  ASSERT_TRUE(file.ReloadIfChanged(install).ok());  // unchanged: not read again
  EXPECT_THAT(installed, ElementsAre("one"));

  Write(path + ".new", "bad");
  std::filesystem::rename(path + ".new", path);  // a new inode
  EXPECT_EQ(file.ReloadIfChanged(install).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.ReloadIfChanged(install).code(),  // still bad: read again, refused
            absl::StatusCode::kInvalidArgument);

  Write(path + ".new", "three");
  std::filesystem::rename(path + ".new", path);
  ASSERT_TRUE(file.ReloadIfChanged(install).ok());
  EXPECT_THAT(installed, ElementsAre("one", "three"));
}

TEST(TokensFile, RefusesMissingAndEmptyFiles) {
  TempDir dir;
  EXPECT_EQ(TokensFile::Create(dir.Join("missing")).status().code(), absl::StatusCode::kNotFound);
  Write(dir.Join("empty"), "# nobody\n");
  const absl::Status s = TokensFile::Create(dir.Join("empty")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lists no token"));
}

TEST(Identity, RolesComeFromGroups) {
  const Identity trainer{.user = "alice", .groups = {"sluice:trainers"}};
  EXPECT_TRUE(trainer.Has(Role::kTrainer));
  EXPECT_FALSE(trainer.Has(Role::kWorker));
  EXPECT_FALSE(trainer.Has(Role::kOperator));
  EXPECT_TRUE(trainer.MayActFor("alice"));
  EXPECT_FALSE(trainer.MayActFor("bob"));
  EXPECT_FALSE(trainer.MayActFor(""));
  const Identity ops{.user = "ops", .groups = {"sluice:operators"}};
  EXPECT_TRUE(ops.MayActFor("bob"));
  EXPECT_TRUE(Identity::Development().Has(Role::kWorker));
  EXPECT_TRUE(Identity::Development().MayActFor(""));
}

TEST(RequireRole, NamesTheCallerTheMethodAndTheRole) {
  const Identity trainer{.user = "alice", .groups = {"sluice:trainers"}};
  const absl::Status s = RequireRole(trainer, Role::kOperator, "DrainWorker");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "alice (groups: sluice:trainers) may not call DrainWorker: it "
            "needs the role sluice:operators (a group in --tokens-file or the "
            "O of the client certificate)");
  EXPECT_TRUE(RequireRole(trainer, Role::kTrainer, "GetOrCreateJob").ok());
}

TEST(JobNames, AreScopedPerIdentity) {
  const Identity alice{.user = "alice", .groups = {"sluice:trainers"}};
  EXPECT_EQ(ScopedJobName(alice, "train", "7-0"), "alice/train");
  EXPECT_EQ(ScopedJobName(alice, "bob/train", "7-0"), "alice/bob/train");
  EXPECT_EQ(ScopedJobName(alice, "", "7-0"), "alice/~7-0");
  EXPECT_EQ(ScopedJobName(Identity::Development(), "train", "7-0"), "train");
  EXPECT_EQ(JobOwner("alice/bob/train"), "alice");
  EXPECT_EQ(JobOwner("train"), "");
}

TEST(IdentityOfCertificate, CnIsTheUserAndOFieldsTheGroups) {
  TempDir dir;
  auto certs = tools::MakeCertificates(dir.Join("tls"));
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto pem = ReadFileForFlag(certs->client_cert, "--tls-cert");
  ASSERT_TRUE(pem.ok());
  auto identity = IdentityOfCertificate(*pem);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->user, "sluice client");
  EXPECT_THAT(identity->groups, ElementsAre("sluice:trainers", "sluice:operators"));
  EXPECT_FALSE(identity->all_roles);
  pem = ReadFileForFlag(certs->server_cert, "--tls-cert");
  identity = IdentityOfCertificate(*pem);
  ASSERT_TRUE(identity.ok());
  EXPECT_THAT(identity->groups, ElementsAre("sluice:workers"));
  EXPECT_EQ(IdentityOfCertificate("not pem").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::service
