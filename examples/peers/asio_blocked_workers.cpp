// asio_blocked_workers.cpp - the workload of examples/blocked_workers.c on
// standalone Asio: a timer and an echo connection while every thread
// sleeps inside a handler.
//
//   asio_blocked_workers [--threads N] [--seconds S] [--period-ms P]
//
// An io_context run by N threads (default: one per CPU) runs
//  - a periodic steady_timer of P ms (default 10) on a strand, re-armed
//    from its previous expiry (no drift), which notes the time of every
//    tick;
//  - an echo server (an acceptor on 127.0.0.1, async_read_some then
//    async_write) with one client, the same client thread as weft's
//    (demo_client.h).
// After the same warm-up, N handlers that sleep for S seconds (default 2)
// are posted at once: together they hold the N threads. Asio has no
// monitor and no spare thread, so the timer and the echo wait for them.
//
// Prints one JSON line with the same fields as blocked_workers (without the
// stall and handoff counts, which Asio does not have).

#include <asio.hpp>

#include <chrono>
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

constexpr std::uint64_t warmup_ns = 300000000u; // as blocked_workers.c

unsigned cpus_allowed() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return 1;
}

// The timer: its handler runs one at a time (it re-arms itself), so the
// ticks need no lock; they are read after the threads are joined.
struct ticker {
  asio::steady_timer timer;
  std::chrono::milliseconds period;
  std::vector<std::uint64_t> ticks;
  ticker(asio::strand<asio::io_context::executor_type> &s, unsigned ms)
      : timer(s), period(ms) {}
  void arm() {
    timer.expires_at(timer.expiry() + period);
    timer.async_wait([this](const asio::error_code &ec) {
      if (ec)
        return;
      ticks.push_back(dc_now_ns());
      arm();
    });
  }
};

// One echo connection: one read or write in flight.
struct session : std::enable_shared_from_this<session> {
  asio::ip::tcp::socket sock;
  char buf[4096];
  explicit session(asio::ip::tcp::socket s) : sock(std::move(s)) {}
  void read() {
    auto self = shared_from_this();
    sock.async_read_some(asio::buffer(buf),
                         [self](const asio::error_code &ec, std::size_t n) {
                           if (!ec)
                             self->write(n);
                         });
  }
  void write(std::size_t n) {
    auto self = shared_from_this();
    asio::async_write(sock, asio::buffer(buf, n),
                      [self](const asio::error_code &ec, std::size_t) {
                        if (!ec)
                          self->read();
                      });
  }
};

void usage() {
  std::fprintf(stderr, "usage: asio_blocked_workers [--threads N] "
                       "[--seconds S] [--period-ms P]\n");
  std::exit(2);
}

} // namespace

int main(int argc, char **argv) {
  unsigned threads = 0, period_ms = 10;
  double seconds = 2;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc)
      usage();
    if (!std::strcmp(argv[i], "--threads"))
      threads = static_cast<unsigned>(dc_number(argv[i + 1], 0, 1024, usage));
    else if (!std::strcmp(argv[i], "--seconds"))
      seconds = dc_number(argv[i + 1], 0.01, 60, usage);
    else if (!std::strcmp(argv[i], "--period-ms"))
      period_ms = static_cast<unsigned>(dc_number(argv[i + 1], 1, 1000, usage));
    else
      usage();
  }
  if (!threads)
    threads = cpus_allowed();

  try {
    asio::io_context ioc(static_cast<int>(threads));
    auto guard = asio::make_work_guard(ioc);
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i)
      pool.emplace_back([&ioc] { ioc.run(); });

    // The timer, on a strand of its own.
    auto ts = asio::make_strand(ioc);
    ticker tick(ts, period_ms);
    tick.timer.expires_after(std::chrono::milliseconds(0));
    tick.arm();

    // The echo server and its client.
    asio::ip::tcp::acceptor acc(
        ioc, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    std::function<void()> accept = [&] {
      acc.async_accept(
          [&](const asio::error_code &ec, asio::ip::tcp::socket s) {
            if (ec)
              return;
            s.set_option(asio::ip::tcp::no_delay(true));
            std::make_shared<session>(std::move(s))->read();
            accept();
          });
    };
    accept();
    dc_echo echo{};
    echo.port = acc.local_endpoint().port();
    echo.w0 = dc_now_ns() + warmup_ns;
    echo.w1 = echo.w0 + static_cast<std::uint64_t>(seconds * 1e9);
    echo.end = echo.w1 + warmup_ns;
    pthread_t client;
    if (pthread_create(&client, nullptr, dc_echo_run, &echo) != 0) {
      std::fprintf(stderr, "asio_blocked_workers: pthread_create failed\n");
      return 1;
    }

    // The window: one sleeping handler per thread.
    dc_sleep_until(echo.w0);
    const std::uint64_t window_end = echo.w1;
    for (unsigned i = 0; i < threads; ++i)
      asio::post(ioc, [window_end] { dc_sleep_until(window_end); });
    dc_sleep_until(echo.end);
    pthread_join(client, nullptr);
    if (echo.err < 0) {
      std::fprintf(stderr, "asio_blocked_workers: echo client: %s\n",
                   std::strerror(-echo.err));
      return 1;
    }
    const std::uint64_t stopped = dc_now_ns();
    guard.reset();
    ioc.stop();
    for (auto &t : pool)
      t.join();

    // As blocked_workers.c: ticks inside the window, longest silence.
    unsigned in_window = 0;
    std::uint64_t gap = 0, prev = 0;
    const std::size_t n = tick.ticks.size();
    for (std::size_t i = 0; i <= n; ++i) {
      const std::uint64_t cur = i < n ? tick.ticks[i] : stopped;
      if (cur >= echo.w0 && cur <= echo.w1 && i < n)
        in_window++;
      if (prev && prev < echo.w1 && cur > echo.w0 && cur - prev > gap)
        gap = cur - prev;
      prev = cur;
    }
    const std::uint64_t period =
        static_cast<std::uint64_t>(period_ms) * 1000000u;
    std::printf("{\"demo\":\"blocked_workers\",\"impl\":\"asio\","
                "\"threads\":%u,\"seconds\":%.2f,\"period_ms\":%u,"
                "\"ticks\":%u,\"ticks_due\":%llu,\"longest_gap_ms\":%.2f,"
                "\"echoes\":%llu,\"slowest_echo_ms\":%.2f}\n",
                threads, seconds, period_ms, in_window,
                static_cast<unsigned long long>((echo.w1 - echo.w0) / period),
                static_cast<double>(gap) / 1e6,
                static_cast<unsigned long long>(echo.echoes),
                static_cast<double>(echo.slowest_ns) / 1e6);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "asio_blocked_workers: %s\n", e.what());
    return 1;
  }
}
