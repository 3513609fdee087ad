// asio_accept_storm.cpp - the storm of examples/accept_storm.c against
// standalone Asio.
//
//   asio_accept_storm [--threads N] [--clients K] [--seconds S]
//
// An io_context run by N threads (default: one per CPU) with one acceptor
// on 127.0.0.1 and an accept always pending, Asio's usual multi-threaded
// server. Every accepted connection gets "hello\n" (async_write), then the
// server closes it. The clients are the same as weft's (demo_client.h).
//
// Prints one JSON line with the same fields as accept_storm.

#include <asio.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <pthread.h>
#include <sched.h>
#include <thread>
#include <vector>

#include "../demo_client.h"

namespace {

constexpr unsigned max_clients = 64; // as accept_storm.c

std::atomic<unsigned long long> accepted{0}, answered{0};

unsigned cpus_allowed() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return 1;
}

void usage() {
  std::fprintf(stderr, "usage: asio_accept_storm [--threads N] [--clients K] "
                       "[--seconds S]\n");
  std::exit(2);
}

} // namespace

int main(int argc, char **argv) {
  unsigned threads = 0, clients = 4;
  double seconds = 2;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc)
      usage();
    if (!std::strcmp(argv[i], "--threads"))
      threads = static_cast<unsigned>(dc_number(argv[i + 1], 0, 1024, usage));
    else if (!std::strcmp(argv[i], "--clients"))
      clients =
          static_cast<unsigned>(dc_number(argv[i + 1], 1, max_clients, usage));
    else if (!std::strcmp(argv[i], "--seconds"))
      seconds = dc_number(argv[i + 1], 0.01, 60, usage);
    else
      usage();
  }
  if (!threads)
    threads = cpus_allowed();

  try {
    asio::io_context ioc(static_cast<int>(threads));
    auto guard = asio::make_work_guard(ioc);
    asio::ip::tcp::acceptor acc(
        ioc, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    std::function<void()> accept = [&] {
      acc.async_accept(
          [&](const asio::error_code &ec, asio::ip::tcp::socket s) {
            if (ec)
              return;
            accepted++;
            auto sock = std::make_shared<asio::ip::tcp::socket>(std::move(s));
            asio::async_write(*sock, asio::buffer(DC_REPLY, DC_REPLY_LEN),
                              [sock](const asio::error_code &wec, std::size_t) {
                                if (!wec)
                                  answered++;
                                asio::error_code ignored;
                                sock->close(ignored);
                              });
            accept();
          });
    };
    accept();
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i)
      pool.emplace_back([&ioc] { ioc.run(); });

    dc_storm storm[max_clients];
    pthread_t tid[max_clients];
    const std::uint64_t t0 = dc_now_ns();
    for (unsigned i = 0; i < clients; ++i) {
      storm[i] = dc_storm{};
      storm[i].port = acc.local_endpoint().port();
      storm[i].end = t0 + static_cast<std::uint64_t>(seconds * 1e9);
      if (pthread_create(&tid[i], nullptr, dc_storm_run, &storm[i]) != 0) {
        std::fprintf(stderr, "asio_accept_storm: pthread_create failed\n");
        return 1;
      }
    }
    unsigned long long ok = 0, failed = 0;
    int first_err = 0;
    for (unsigned i = 0; i < clients; ++i) {
      pthread_join(tid[i], nullptr);
      ok += storm[i].answered;
      failed += storm[i].failed;
      if (!first_err)
        first_err = storm[i].first_err;
    }
    const double elapsed = static_cast<double>(dc_now_ns() - t0) / 1e9;

    // Let the last handlers finish, then stop.
    guard.reset();
    asio::post(ioc, [&acc] {
      asio::error_code ignored;
      acc.close(ignored);
    });
    for (auto &t : pool)
      t.join();

    std::printf("{\"demo\":\"accept_storm\",\"impl\":\"asio\",\"threads\":%u,"
                "\"clients\":%u,\"seconds\":%.2f,\"conns_per_sec\":%.0f,"
                "\"answered\":%llu,\"failed\":%llu,\"first_error\":\"%s\","
                "\"server_accepted\":%llu,\"server_answered\":%llu}\n",
                threads, clients, elapsed, static_cast<double>(ok) / elapsed,
                ok, failed, first_err ? std::strerror(-first_err) : "",
                accepted.load(), answered.load());
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "asio_accept_storm: %s\n", e.what());
    return 1;
  }
}
