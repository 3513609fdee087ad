// asio_startup.cpp - what a whole io_context life costs with many threads,
// as a peer of weft's startup benchmark.
//
// One cycle: an io_context kept alive by a work guard and run by --threads
// threads (default 64); one handler posted to it and waited for (the
// waiting thread sleeps on a condition variable); the guard reset, stop(),
// all threads joined. One untimed cycle first, then --repeat timed ones.
// Reported: wall ms / repeat, and getrusage(RUSAGE_SELF) user + system ms
// / repeat. With --pin the process first of all pins itself to CPU 0.
//
//   asio_startup [--threads 64] [--repeat 20] [--pin]
// Output: a human line, then as the last line one JSON object:
//  {"impl":"asio","ms_per_cycle":X,"cpu_ms_per_cycle":X,"threads":N,
//   "repeat":R,"pinned":0|1}
// Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace {

std::uint64_t cpu_ns() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (static_cast<std::uint64_t>(ru.ru_utime.tv_sec) +
          static_cast<std::uint64_t>(ru.ru_stime.tv_sec)) *
             1000000000u +
         (static_cast<std::uint64_t>(ru.ru_utime.tv_usec) +
          static_cast<std::uint64_t>(ru.ru_stime.tv_usec)) *
             1000u;
}

void cycle(unsigned threads) {
  asio::io_context ioc(static_cast<int>(threads));
  auto guard = asio::make_work_guard(ioc);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned i = 0; i < threads; ++i)
    pool.emplace_back([&ioc] { ioc.run(); });

  std::mutex m;
  std::condition_variable cv;
  bool ran = false;
  asio::post(ioc, [&] {
    std::lock_guard<std::mutex> lk(m);
    ran = true;
    cv.notify_one();
  });
  {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return ran; });
  }
  guard.reset();
  ioc.stop();
  for (auto &t : pool)
    t.join();
}

} // namespace

int main(int argc, char **argv) {
  unsigned threads = 64;
  int repeat = 20;
  bool pin = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--pin"))
      pin = true;
    else {
      std::fprintf(stderr, "usage: asio_startup [--threads N] [--repeat R] "
                           "[--pin]\n");
      return 2;
    }
  }
  if (threads < 1 || threads > 1024 || repeat < 1) {
    std::fprintf(stderr, "asio_startup: --threads 1..1024, --repeat >= 1\n");
    return 2;
  }
  if (pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      std::perror("asio_startup: sched_setaffinity(CPU 0)");
      return 1;
    }
  }
  try {
    cycle(threads); // untimed: first-use costs of the process
    const std::uint64_t c0 = cpu_ns();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeat; ++i)
      cycle(threads);
    const auto t1 = std::chrono::steady_clock::now();
    const std::uint64_t c1 = cpu_ns();
    const double ms =
        std::chrono::duration<double, std::milli>(t1 - t0).count() / repeat;
    const double cpu = static_cast<double>(c1 - c0) / 1e6 / repeat;
    std::printf("asio %u threads, io_context+post+stop+join%s: %.3f ms/cycle, "
                "CPU %.3f ms/cycle\n",
                threads, pin ? " (pinned to CPU 0)" : "", ms, cpu);
    std::printf("{\"impl\":\"asio\",\"ms_per_cycle\":%.4f,"
                "\"cpu_ms_per_cycle\":%.4f,\"threads\":%u,\"repeat\":%d,"
                "\"pinned\":%d}\n",
                ms, cpu, threads, repeat, pin ? 1 : 0);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
