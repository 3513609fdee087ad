// asio_first_timer.cpp - how late the very first timer of a fresh process
// fires on standalone Asio, as a peer of weft's first_timer benchmark.
//
// One measurement per process (build/bench/first_timer runs it once per
// run, each a fresh process): an io_context kept alive by a work guard and
// run by --threads threads (started first, as weft_rt_create starts its
// workers), then at once a strand (asio::make_strand) and a steady_timer of
// --ms on it. Lateness = steady_clock::now() at the handler's first
// instruction minus the timer's expiry().
//
// The process sets PR_SET_TIMERSLACK to 1 ns before starting its threads
// (they inherit it), as weft's threads and first_timer's kernel floor do,
// so the default 50 us slack is not what is compared. (Asio on Linux sleeps
// on a timerfd, which is not subject to slack anyway.)
//
//   asio_first_timer [--ms M] [--threads N] [--child]
// (--child is accepted and ignored: every run is already one process.)
// Output: a human line, then as the last line one JSON object:
//  {"impl":"asio","late_us":X,"ms":M,"threads":N}
// Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include <sched.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock; // CLOCK_MONOTONIC on Linux

unsigned cpus_allowed() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return 1;
}

void usage() {
  std::fprintf(stderr,
               "usage: asio_first_timer [--ms M] [--threads N] [--child]\n");
}

} // namespace

int main(int argc, char **argv) {
  unsigned ms = 5, threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ms") && i + 1 < argc)
      ms = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--child"))
      continue;
    else {
      usage();
      return 2;
    }
  }
  if (!threads)
    threads = cpus_allowed();
  if (ms < 1 || ms > 10000 || threads > 1024) {
    std::fprintf(stderr, "asio_first_timer: --ms 1..10000, --threads "
                         "1..1024\n");
    return 2;
  }
  try {
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    asio::io_context ioc(static_cast<int>(threads));
    auto guard = asio::make_work_guard(ioc);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned i = 0; i < threads; ++i)
      pool.emplace_back([&ioc] { ioc.run(); });

    auto strand = asio::make_strand(ioc);
    asio::steady_timer timer(ioc);
    std::promise<double> late;
    timer.expires_after(std::chrono::milliseconds(ms));
    timer.async_wait(asio::bind_executor(
        strand, [&timer, &late](const asio::error_code &ec) {
          const auto now = clock_type::now(); // first: the measurement
          if (ec) {
            late.set_exception(std::make_exception_ptr(asio::system_error(ec)));
            return;
          }
          late.set_value(
              std::chrono::duration<double, std::micro>(now - timer.expiry())
                  .count());
        }));
    const double us = late.get_future().get();

    guard.reset();
    ioc.stop();
    for (auto &t : pool)
      t.join();
    std::printf("asio first %u ms steady_timer on a strand: %.1f us late "
                "(%u threads)\n",
                ms, us, threads);
    std::printf("{\"impl\":\"asio\",\"late_us\":%.3f,\"ms\":%u,"
                "\"threads\":%u}\n",
                us, ms, threads);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
