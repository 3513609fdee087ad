// asio_idle_cpu - an idle io_context (kept alive by a work guard) run by N
// threads: CPU ms per second, the peer of build/bench/idle_cpu.
#include <asio.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/resource.h>
#include <thread>
#include <vector>

static double cpu_ms() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 +
         ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3;
}

int main(int argc, char **argv) {
  unsigned threads = 2;
  double seconds = 3;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = (unsigned)std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: asio_idle_cpu [--threads N] [--seconds S]\n");
      return 2;
    }
  }
  asio::io_context ioc;
  auto guard = asio::make_work_guard(ioc);
  std::vector<std::thread> ts;
  for (unsigned i = 0; i < threads; i++)
    ts.emplace_back([&] { ioc.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  double c0 = cpu_ms();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  double c1 = cpu_ms();
  guard.reset();
  ioc.stop();
  for (auto &t : ts)
    t.join();
  double v = (c1 - c0) / seconds;
  std::printf("asio idle: %.3f CPU ms/s\n", v);
  std::printf("{\"impl\":\"asio\",\"threads\":%u,\"cpu_ms_per_sec\":%.3f}\n",
              threads, v);
  return 0;
}
