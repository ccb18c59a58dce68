// tcp_relay --listen PORT --to HOST:PORT: forwards every TCP connection on 127.0.0.1:PORT to
// HOST:PORT, byte for byte, one thread pair per connection. The integration tests put it between
// a client and a worker and SIGKILL it: every connection through it is reset at once, with
// whatever bytes it held lost, as a broken network would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

int Connect(const std::string& host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void Pump(int from, int to) {
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(from, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = write(to, buffer + off, static_cast<size_t>(n - off));
      if (w <= 0) {
        shutdown(from, SHUT_RDWR);
        return;
      }
      off += w;
    }
  }
  shutdown(to, SHUT_RDWR);
  shutdown(from, SHUT_RDWR);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  int listen_port = 0;
  std::string to;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--listen") listen_port = std::atoi(argv[i + 1]);
    if (flag == "--to") to = argv[i + 1];
  }
  const size_t colon = to.rfind(':');
  if (listen_port <= 0 || colon == std::string::npos) {
    std::fprintf(stderr, "usage: tcp_relay --listen PORT --to HOST:PORT\n");
    return 2;
  }
  const std::string host = to.substr(0, colon);
  const int port = std::atoi(to.c_str() + colon + 1);
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(listen_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(server, 64) != 0) {
    std::perror("tcp_relay: bind/listen");
    return 1;
  }
  std::printf("relaying 127.0.0.1:%d -> %s\n", listen_port, to.c_str());
  std::fflush(stdout);
  while (true) {
    const int client = accept(server, nullptr, nullptr);
    if (client < 0) continue;
    const int upstream = Connect(host, port);
    if (upstream < 0) {
      close(client);
      continue;
    }
    std::thread([client, upstream] { Pump(client, upstream); }).detach();
    std::thread([client, upstream] { Pump(upstream, client); }).detach();
  }
}
