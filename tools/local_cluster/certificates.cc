#include "tools/local_cluster/certificates.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/process.h"

namespace sluice::tools {
namespace {

namespace fs = std::filesystem;

// Run by /bin/sh in the target folder. `openssl x509 -days` cannot go into the past, so the
// expired certificate comes from `openssl ca`, which takes explicit dates.
constexpr char kScript[] = R"sh(set -e
ossl() { openssl "$@" 2>>openssl.log; }
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
ossl req -x509 $key -keyout ca.key -out ca.pem -days 30 -subj "/CN=sluice throwaway CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > ext.cnf
serial=1
for name in server client; do
  serial=$((serial + 1))
  # O fields are groups (docs/security.md): the workers present the server certificate.
  groups="/O=sluice:workers"
  [ $name = client ] && groups="/O=sluice:trainers/O=sluice:operators"
  ossl req $key -keyout $name.key -out $name.csr -subj "$groups/CN=sluice $name"
  ossl x509 -req -in $name.csr -CA ca.pem -CAkey ca.key -set_serial $serial -days 30 \
    -extfile ext.cnf -out $name.pem
done
rm -rf ca.db && mkdir ca.db && : > ca.db/index.txt && echo 10 > ca.db/serial
cat > ca.cnf <<CNF
[ca]
default_ca = throwaway
[throwaway]
database = ca.db/index.txt
serial = ca.db/serial
new_certs_dir = ca.db
default_md = sha256
policy = any
x509_extensions = ext
[any]
commonName = supplied
[ext]
subjectAltName = IP:127.0.0.1,DNS:localhost
extendedKeyUsage = serverAuth,clientAuth
CNF
ossl req $key -keyout expired.key -out expired.csr -subj "/CN=sluice expired"
ossl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr -out expired.pem \
  -startdate 20200101000000Z -enddate 20200102000000Z -notext
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > token
chmod 600 *.key token
)sh";

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

}  // namespace

absl::StatusOr<Certificates> MakeCertificates(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const fs::path folder = fs::absolute(dir);
  if (!fs::exists("/usr/bin/openssl")) {
    return absl::FailedPreconditionError(
        "the `openssl` command is needed to make throwaway certificates "
        "(apt-get install "
        "openssl)");
  }
  const std::string log = (folder / "openssl.log").string();
  absl::StatusOr<std::unique_ptr<Subprocess>> shell =
      Subprocess::Start({"/bin/sh", "-c", absl::StrCat("cd '", folder.string(), "' && ", kScript)},
                        {.log_file = (folder / "make.log").string()});
  if (!shell.ok()) return shell.status();
  absl::StatusOr<int> code = (*shell)->Wait(absl::Minutes(2));
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(absl::StrCat("making certificates in ", folder.string(),
                                            " failed (exit ", *code, "): ", Tail(log)));
  }
  auto at = [&](const char* name) { return (folder / name).string(); };
  return Certificates{.ca = at("ca.pem"),
                      .server_cert = at("server.pem"),
                      .server_key = at("server.key"),
                      .client_cert = at("client.pem"),
                      .client_key = at("client.key"),
                      .expired_cert = at("expired.pem"),
                      .expired_key = at("expired.key"),
                      .token = at("token")};
}

}  // namespace sluice::tools
