// asio_udp_echo.cpp - a UDP echo server on standalone Asio: the peer of
// weft's examples/udp_echo in bench/udp_echo.
//
// One io_context run by one thread, one socket (as weft's example: one
// socket, one worker). Each datagram is received with async_receive_from
// (Asio tries the receive at once before waiting for readiness) and
// answered with a non-blocking send_to straight from the receive buffer,
// the quickest reply Asio allows; a reply the socket buffer cannot take
// is dropped, as UDP may.
//
// Usage: asio_udp_echo [--port P]  (port 0: pick one)
// Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit status 0).
#include <asio.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

class echo {
public:
  echo(asio::io_context &ioc, unsigned short port)
      : sock_(ioc, asio::ip::udp::endpoint(asio::ip::make_address("127.0.0.1"),
                                           port)) {
    sock_.non_blocking(true);
  }
  unsigned short port() const { return sock_.local_endpoint().port(); }
  void start() {
    sock_.async_receive_from(
        asio::buffer(buf_), from_, [this](std::error_code ec, std::size_t n) {
          if (!sock_.is_open())
            return; // closed by the signal

          if (!ec) {
            std::error_code sec;
            sock_.send_to(asio::buffer(buf_, n), from_, 0, sec);
          }
          start();
        });
  }
  void close() { sock_.close(); }

private:
  asio::ip::udp::socket sock_;
  asio::ip::udp::endpoint from_;
  char buf_[65536];
};

} // namespace

int main(int argc, char **argv) {
  unsigned short port = 0;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && !std::strcmp(argv[i], "--port")) {
      port = (unsigned short)std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: asio_udp_echo [--port P]\n");
      return 2;
    }
  }
  asio::io_context ioc(1);
  echo e(ioc, port);
  asio::signal_set sigs(ioc, SIGINT, SIGTERM);
  sigs.async_wait([&](std::error_code, int) { e.close(); });
  e.start();
  std::printf("listening on %u\n", e.port());
  std::fflush(stdout);
  ioc.run();
  return 0;
}
