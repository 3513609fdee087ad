// asio_http_hello - a minimal HTTP/1.1 "Hello, World!" server on standalone
// Asio: the peer of weft's examples/http_hello in bench/net.
//
// Layout: one io_context per thread (concurrency hint 1, so Asio takes no
// locks), each with its own acceptor on the same address bound with
// SO_REUSEPORT: the kernel spreads new connections over the threads, and a
// connection lives on the thread that accepted it. This is Asio's
// io_context-per-core layout, its fastest for many short independent
// connections (one shared io_context would share a reactor and its lock).
//
// Each connection reads into its buffer, answers every complete request in
// it ("\r\n\r\n"-terminated; pipelined requests are answered together in
// one gathered write), then reads again. A request with "Connection: close"
// gets "Connection: close" in its response and the connection is closed
// once that response is sent. Requests with bodies are not supported. A
// session, its buffer included, fits in 1 KiB with make_shared's control
// block (glibc's per-thread cache of small blocks); a head that outgrows
// the buffer moves to a kBufSize block, as in examples/http_hello.c and
// nginx.
//
// Usage: asio_http_hello [--port P] [--threads N]  (port 0: pick one)
// Prints "listening on PORT" once every acceptor listens; SIGINT or SIGTERM
// stops it (exit status 0). Exit status 2 on bad flags, 1 on failure.
#include <asio.hpp>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <pthread.h>
#include <string_view>
#include <sys/socket.h>
#include <thread>
#include <vector>

namespace {

using asio::ip::tcp;

constexpr std::string_view kKeepAlive = "HTTP/1.1 200 OK\r\n"
                                        "Content-Length: 13\r\n"
                                        "Content-Type: text/plain\r\n"
                                        "\r\n"
                                        "Hello, World!";
constexpr std::string_view kClose = "HTTP/1.1 200 OK\r\n"
                                    "Content-Length: 13\r\n"
                                    "Content-Type: text/plain\r\n"
                                    "Connection: close\r\n"
                                    "\r\n"
                                    "Hello, World!";
constexpr std::size_t kBufSize = 16384; // a request's head must fit in it
constexpr std::size_t kSmallSize = 768; // the buffer inside a Session
constexpr std::size_t kMaxBatch = 64;   // responses in one write

using reuse_port =
    asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); i++)
    if (std::tolower((unsigned char)a[i]) != std::tolower((unsigned char)b[i]))
      return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// Whether a request head (request line and headers, without the final empty
// line) has a Connection header with the token "close".
bool wants_close(std::string_view head) {
  std::size_t eol = head.find("\r\n");
  while (eol != std::string_view::npos) {
    head.remove_prefix(eol + 2);
    eol = head.find("\r\n");
    std::string_view line = head.substr(0, eol);
    std::size_t colon = line.find(':');
    if (colon == std::string_view::npos ||
        !ieq(trim(line.substr(0, colon)), "connection"))
      continue;
    std::string_view v = line.substr(colon + 1);
    while (!v.empty()) {
      std::size_t comma = v.find(',');
      if (ieq(trim(v.substr(0, comma)), "close"))
        return true;
      if (comma == std::string_view::npos)
        break;
      v.remove_prefix(comma + 1);
    }
  }
  return false;
}

class Session : public std::enable_shared_from_this<Session> {
public:
  explicit Session(tcp::socket s) : sock_(std::move(s)) {}

  void start() {
    asio::error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    read();
  }

private:
  void read() {
    if (len_ == cap_) {
      if (cap_ == kBufSize) // a request head larger than the buffer
        return close();
      big_.reset(new (std::nothrow) char[kBufSize]);
      if (!big_)
        return close();
      std::memcpy(big_.get(), buf_, len_);
      buf_ = big_.get();
      cap_ = kBufSize;
    }
    auto self = shared_from_this();
    sock_.async_read_some(
        asio::buffer(buf_ + len_, cap_ - len_),
        [this, self](const asio::error_code &ec, std::size_t n) {
          if (ec)
            return close();
          len_ += n;
          respond();
        });
  }

  // Answers the complete requests in buf_ (up to kMaxBatch at a time).
  void respond() {
    std::vector<asio::const_buffer> out;
    std::string_view in(buf_, len_);
    std::size_t used = 0;
    bool close_after = false;
    while (out.size() < kMaxBatch) {
      std::size_t end = in.find("\r\n\r\n", used);
      if (end == std::string_view::npos)
        break;
      close_after = wants_close(in.substr(used, end - used));
      used = end + 4;
      if (close_after) {
        out.push_back(asio::buffer(kClose.data(), kClose.size()));
        break;
      }
      out.push_back(asio::buffer(kKeepAlive.data(), kKeepAlive.size()));
    }
    if (out.empty())
      return read();
    std::memmove(buf_, buf_ + used, len_ - used);
    len_ -= used;
    auto self = shared_from_this();
    asio::async_write(
        sock_, out,
        [this, self, close_after](const asio::error_code &ec, std::size_t) {
          if (ec || close_after)
            return close();
          respond();
        });
  }

  void close() {
    asio::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  tcp::socket sock_;
  std::size_t len_ = 0;
  std::size_t cap_ = kSmallSize; // or kBufSize once buf_ is big_
  char *buf_ = small_;
  std::unique_ptr<char[]> big_;
  char small_[kSmallSize];
};
static_assert(sizeof(Session) <= 1000, "Session outgrew 1 KiB");

class Server {
public:
  Server() : ioc_(1), acc_(ioc_) {}

  // Opens the acceptor on 127.0.0.1:port with SO_REUSEPORT.
  bool listen(unsigned short port, unsigned short *bound) {
    asio::error_code ec;
    tcp::endpoint ep(asio::ip::make_address_v4("127.0.0.1"), port);
    acc_.open(ep.protocol(), ec);
    if (!ec)
      acc_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec)
      acc_.set_option(reuse_port(true), ec);
    if (!ec)
      acc_.bind(ep, ec);
    if (!ec)
      acc_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      std::fprintf(stderr, "asio_http_hello: listen on 127.0.0.1:%u: %s\n",
                   port, ec.message().c_str());
      return false;
    }
    *bound = acc_.local_endpoint().port();
    accept();
    return true;
  }

  void run() {
    thread_ = std::thread([this] { ioc_.run(); });
  }

  void stop() { ioc_.stop(); }
  void join() { thread_.join(); }

private:
  void accept() {
    acc_.async_accept([this](const asio::error_code &ec, tcp::socket s) {
      if (!ec)
        std::make_shared<Session>(std::move(s))->start();
      else if (ec == asio::error::operation_aborted)
        return;
      accept();
    });
  }

  asio::io_context ioc_;
  tcp::acceptor acc_;
  std::thread thread_;
};

} // namespace

int main(int argc, char **argv) {
  unsigned port = 0, threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--port") && i + 1 < argc)
      port = (unsigned)std::strtoul(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = (unsigned)std::strtoul(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: asio_http_hello [--port P] [--threads N]\n");
      return 2;
    }
  }
  if (port > 65535 || threads < 1 || threads > 1024) {
    std::fprintf(stderr, "asio_http_hello: bad --port or --threads\n");
    return 2;
  }

  // SIGINT and SIGTERM are taken with sigwait below, never by a handler:
  // blocked here, before any thread starts, so every thread inherits that.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // Port 0: the first acceptor picks the port, the others bind to it.
  std::vector<std::unique_ptr<Server>> servers;
  unsigned short p = (unsigned short)port;
  for (unsigned i = 0; i < threads; i++) {
    servers.push_back(std::make_unique<Server>());
    if (!servers.back()->listen(p, &p))
      return 1;
  }
  for (auto &s : servers)
    s->run();
  std::printf("listening on %u\n", p);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  for (auto &s : servers)
    s->stop();
  for (auto &s : servers)
    s->join();
  return 0;
}
