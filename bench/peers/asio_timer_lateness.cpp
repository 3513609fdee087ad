// asio_timer_lateness.cpp - periodic timer lateness on standalone Asio, as a
// peer of weft's bench/timer_lateness.c.
//
// One io_context run by --threads threads; --timers asio::steady_timer, each
// on its own strand (asio::make_strand), period --period-us, first deadlines
// spread evenly over one period. Each is re-armed from its handler with
// expires_at(a later deadline of the grid first + k * period), so it does
// not drift. Lateness = CLOCK_MONOTONIC at handler entry minus the deadline
// it fired for. A firing more than a period late then skips the periods
// that passed meanwhile and counts them as missed, as weft's periodic
// timers do (Asio leaves the rule to the program; without it a late timer
// would fire once for each period passed). --busy K strands run ~1 us
// handlers that re-post themselves; --blocked K strands each run one
// handler that sleeps through the measurement. Threads keep the default
// timer slack.
//
// Samples after a 0.2 s warm-up, deadlines within --seconds; nearest-rank
// percentiles. Last line: {"impl":"asio","p50_us":X,"p99_us":X,"max_us":X,
// "samples":N,"missed":M}. --dist FILE appends the distribution's tail to
// FILE as lines "asio LATENESS_US FRACTION" (bench/benchutil.h's
// bench_write_tail). Exit status: 0, 2 on bad flags, 1 on failure.

#include <asio.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <time.h>

namespace {

using strand_type = asio::strand<asio::io_context::executor_type>;
constexpr std::uint64_t warmup_ns = 200000000, lead_ns = 20000000;

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

// steady_clock is CLOCK_MONOTONIC on Linux: the same nanoseconds.
asio::steady_timer::time_point at(std::uint64_t ns) {
  return asio::steady_timer::time_point(
      std::chrono::duration_cast<asio::steady_timer::duration>(
          std::chrono::nanoseconds(ns)));
}

struct options {
  unsigned timers = 1000, threads = 2, busy = 0, blocked = 0;
  std::uint64_t period_ns = 1000000;
  double seconds = 3;
  const char *dist = nullptr;
};

std::atomic<bool> stop{false};
std::uint64_t period, from, to;
std::size_t cap;
std::vector<std::int64_t> samples;
std::vector<std::uint32_t> counts;
std::vector<std::uint64_t> missed;

struct Timer {
  Timer(asio::io_context &ioc, unsigned idx, std::uint64_t f)
      : strand(asio::make_strand(ioc)), timer(strand), i(idx), first(f) {}
  strand_type strand;
  asio::steady_timer timer;
  unsigned i;
  std::uint64_t first, k = 0;

  void arm() {
    timer.expires_at(at(first + k * period));
    timer.async_wait([this](const asio::error_code &ec) { fired(ec); });
  }
  void fired(const asio::error_code &ec) {
    std::uint64_t now = now_ns();
    if (ec)
      return;
    std::uint64_t d = first + k * period;
    std::uint64_t skip = now > d ? (now - d) / period : 0;
    if (d >= from && d < to && counts[i] < cap) {
      samples[i * cap + counts[i]++] = std::int64_t(now - d);
      missed[i] += skip;
    }
    k += skip + 1;
    if (!stop.load(std::memory_order_relaxed))
      arm();
  }
};

void busy(strand_type *s) {
  std::uint64_t end = now_ns() + 1000;
  while (now_ns() < end)
    ;
  if (!stop.load(std::memory_order_relaxed))
    asio::post(*s, [s] { busy(s); });
}

void blocked() {
  while (!stop.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Appends the tail of the n sorted samples to the file at path, in
// bench_write_tail's format.
bool write_tail(const char *path, std::size_t n) {
  std::FILE *f = std::fopen(path, "a");
  if (!f)
    return false;
  for (std::size_t k = 1; k <= n; k += 1 + k / 20)
    std::fprintf(f, "asio %.3f %.6g\n", double(samples[n - k]) / 1e3,
                 double(k) / double(n));
  std::fprintf(f, "asio %.3f 1\n", double(samples[0]) / 1e3);
  return std::fclose(f) == 0;
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: asio_timer_lateness [--timers T] "
                       "[--period-us P] [--seconds S] [--threads N] "
                       "[--busy K] [--blocked K] [--dist FILE]\n");
  std::exit(2);
}

unsigned parse_uint(const char *s, unsigned long lo, unsigned long hi) {
  char *end;
  unsigned long v = std::strtoul(s, &end, 10);
  if (!*s || *end || *s == '-' || v < lo || v > hi)
    usage();
  return unsigned(v);
}

options parse(int argc, char **argv) {
  options o;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc)
      usage();
    const char *a = argv[i], *v = argv[++i];
    if (!std::strcmp(a, "--timers"))
      o.timers = parse_uint(v, 1, 1000000);
    else if (!std::strcmp(a, "--period-us"))
      o.period_ns = parse_uint(v, 10, 10000000) * 1000ull;
    else if (!std::strcmp(a, "--threads"))
      o.threads = parse_uint(v, 1, 1024);
    else if (!std::strcmp(a, "--busy"))
      o.busy = parse_uint(v, 0, 1024);
    else if (!std::strcmp(a, "--blocked"))
      o.blocked = parse_uint(v, 0, 64);
    else if (!std::strcmp(a, "--dist") && *v)
      o.dist = v;
    else if (!std::strcmp(a, "--seconds")) {
      o.seconds = std::strtod(v, nullptr);
      if (!(o.seconds >= 0.1 && o.seconds <= 600))
        usage();
    } else
      usage();
  }
  return o;
}

} // namespace

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  period = o.period_ns;
  std::uint64_t len = std::uint64_t(o.seconds * 1e9);
  cap = len / period + 2;
  if (double(o.timers) * double(cap) > 2e8) {
    std::fprintf(stderr, "asio_timer_lateness: too many samples\n");
    return 2;
  }
  try {
    samples.resize(std::size_t(o.timers) * cap);
    counts.assign(o.timers, 0);
    missed.assign(o.timers, 0);
    asio::io_context ioc(int(o.threads));
    auto guard = asio::make_work_guard(ioc);
    std::vector<std::unique_ptr<Timer>> timers;
    std::vector<std::unique_ptr<strand_type>> workers;
    std::uint64_t t0 = now_ns() + lead_ns;
    from = t0 + warmup_ns;
    to = from + len;
    for (unsigned i = 0; i < o.timers; i++)
      timers.push_back(std::make_unique<Timer>(
          ioc, i, t0 + std::uint64_t(i) * period / o.timers));
    for (unsigned i = 0; i < o.busy + o.blocked; i++) {
      workers.push_back(std::make_unique<strand_type>(asio::make_strand(ioc)));
      strand_type *s = workers.back().get();
      if (i < o.busy)
        asio::post(*s, [s] { busy(s); });
      else
        asio::post(*s, blocked);
    }
    for (auto &t : timers)
      asio::post(t->strand, [p = t.get()] { p->arm(); });
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < o.threads; i++)
      threads.emplace_back([&ioc] { ioc.run(); });
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(to + lead_ns - now_ns()));
    stop.store(true);
    ioc.stop();
    for (auto &t : threads)
      t.join();
    std::size_t n = 0;
    std::uint64_t nmissed = 0;
    for (unsigned i = 0; i < o.timers; i++) {
      nmissed += missed[i];
      std::copy_n(samples.begin() + std::ptrdiff_t(i * cap), counts[i],
                  samples.begin() + std::ptrdiff_t(n));
      n += counts[i];
    }
    if (n == 0) {
      std::fprintf(stderr, "asio_timer_lateness: no samples\n");
      return 1;
    }
    std::sort(samples.begin(), samples.begin() + std::ptrdiff_t(n));
    double p50 = samples[n / 2] / 1e3, p99 = samples[n * 99 / 100] / 1e3,
           mx = samples[n - 1] / 1e3;
    std::printf("asio: p50 %.2f us, p99 %.2f us, max %.2f us, %zu samples\n",
                p50, p99, mx, n);
    if (o.dist && !write_tail(o.dist, n)) {
      std::fprintf(stderr, "asio_timer_lateness: %s: %s\n", o.dist,
                   std::strerror(errno));
      return 1;
    }
    std::printf("{\"impl\":\"asio\",\"p50_us\":%.2f,\"p99_us\":%.2f,"
                "\"max_us\":%.2f,\"samples\":%zu,\"missed\":%llu}\n",
                p50, p99, mx, n, (unsigned long long)nmissed);
    std::fflush(stdout);
    // Timers and strands are torn down with the io_context, which is stopped.
  } catch (const std::exception &e) {
    std::fprintf(stderr, "asio_timer_lateness: %s\n", e.what());
    return 1;
  }
  return 0;
}
