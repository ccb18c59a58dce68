// FakeDns: a DNS server on loopback for tests of name resolution, answering every A query with
// one IPv4 address that the test changes (a peer that comes back elsewhere under the same name)
// and every other query with no record. gRPC dials it with a target that names the server:
// "dns://127.0.0.1:<port()>/<any name>:<port>".
#ifndef SLUICE_TESTS_TESTING_FAKE_DNS_H_
#define SLUICE_TESTS_TESTING_FAKE_DNS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace sluice::testing {

class FakeDns {
 public:
  // Answers A queries with `ipv4` (dotted quad).
  explicit FakeDns(const std::string& ipv4) : address_(ipv4) {
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDns() {
    stop_ = true;
    thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  FakeDns(const FakeDns&) = delete;
  FakeDns& operator=(const FakeDns&) = delete;

  int port() const { return port_; }  // 0 if it could not listen
  // Where the name points from now on.
  void Point(const std::string& ipv4) {
    absl::MutexLock lock(&mu_);
    address_ = ipv4;
  }

 private:
  void Serve() {
    unsigned char query[512];
    while (!stop_ && fd_ >= 0) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 50) <= 0) continue;
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      const ssize_t n =
          recvfrom(fd_, query, sizeof(query), 0, reinterpret_cast<sockaddr*>(&peer), &len);
      if (n < 12) continue;
      // The question: labels up to a 0 byte, then type and class.
      size_t end = 12;
      while (end < static_cast<size_t>(n) && query[end] != 0) end += query[end] + 1;
      if (end + 5 > static_cast<size_t>(n)) continue;
      const size_t question_end = end + 5;
      const bool a_record = query[end + 1] == 0 && query[end + 2] == 1;
      unsigned char reply[512];
      std::memcpy(reply, query, question_end);
      reply[2] = 0x81;  // a response, recursion desired and available, no error
      reply[3] = 0x80;
      reply[4] = 0, reply[5] = 1;                 // one question
      reply[6] = 0, reply[7] = a_record ? 1 : 0;  // answers
      std::memset(reply + 8, 0, 4);               // no authority or additional records
      size_t size = question_end;
      if (a_record) {
        in_addr ip{};
        {
          absl::MutexLock lock(&mu_);
          inet_pton(AF_INET, address_.c_str(), &ip);
        }
        const unsigned char answer[] = {0xc0, 0x0c,        // the name: a pointer to the question's
                                        0,    1,    0, 1,  // type A, class IN
                                        0,    0,    0, 0,  // TTL 0
                                        0,    4};          // 4 bytes of address
        std::memcpy(reply + size, answer, sizeof(answer));
        size += sizeof(answer);
        std::memcpy(reply + size, &ip, 4);
        size += 4;
      }
      sendto(fd_, reply, size, 0, reinterpret_cast<sockaddr*>(&peer), len);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_FAKE_DNS_H_
