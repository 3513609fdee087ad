// asio_post.cpp - the cost of a post on standalone Asio, as a peer of weft's
// post benchmarks.
//
// (a) post+run on one thread: one io_context run by one thread, one strand
//     (asio::make_strand); a handler re-posts itself to that strand until it
//     has run --iterations times. Reported: wall time / iterations, in ns.
// (c) two chains on two threads: one io_context run by two threads, two
//     strands, each with a handler re-posting itself --iterations times, as
//     in (a). Reported: wall time until both are done / iterations, in ns
//     (pair_run_ns; (a)'s figure if the threads do not slow each other).
// (b) waking a parked io_context: one thread runs an io_context kept alive by
//     a work guard and otherwise idle; a foreign thread, --samples times,
//     sleeps --sleep-us (default 200 us, so the runner is asleep), takes a
//     monotonic timestamp and posts a handler (to a strand of that
//     io_context, as weft_post posts to a strand) that takes its own
//     timestamp. Latency = the difference. Reported: p50 and p99 in us
//     (nearest rank).
//
// Output: human lines, then as the last line one JSON object:
//  {"impl":"asio","post_run_ns":X,"pair_run_ns":X,"wake_p50_us":X,
//   "wake_p99_us":X,"iterations":N,"samples":M}
// Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include "peer_args.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock; // CLOCK_MONOTONIC on Linux
using strand_type = asio::strand<asio::io_context::executor_type>;

struct options {
  std::uint64_t iterations = 10000000;
  unsigned samples = 2000;
  unsigned sleep_us = 200;
};

void usage(std::FILE *f, const char *argv0) {
  std::fprintf(f,
               "usage: %s [--iterations N] [--samples M] [--sleep-us U]\n"
               "  --iterations N  same-thread post+run iterations "
               "(1..10^12, default 10000000)\n"
               "  --samples M     cross-thread wake samples (1..10^7, default "
               "2000)\n"
               "  --sleep-us U    pause before each wake sample, us "
               "(0..1000000, default 200)\n",
               argv0);
}

// Returns 0 to run, 1 after --help, 2 on a bad flag (message printed).
int parse_args(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; ++i) {
    const peer::arg a(i, argv);
    const std::string &name = a.name;
    const bool inline_value = a.inline_value;
    const char *v = nullptr;
    if (name == "--help" || name == "-h") {
      if (!inline_value) {
        usage(stdout, argv[0]);
        return 1;
      }
    } else if (name == "--iterations" || name == "--samples" ||
               name == "--sleep-us") {
      v = a.value_of(argc, argv, &i);
      std::uint64_t x = 0;
      if (name == "--iterations" &&
          peer::parse_u64(v, 1, 1000000000000ULL, &x)) {
        o->iterations = x;
        continue;
      }
      if (name == "--samples" && peer::parse_u64(v, 1, 10000000, &x)) {
        o->samples = static_cast<unsigned>(x);
        continue;
      }
      if (name == "--sleep-us" && peer::parse_u64(v, 0, 1000000, &x)) {
        o->sleep_us = static_cast<unsigned>(x);
        continue;
      }
      std::fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], v ? v : "",
                   name.c_str());
      usage(stderr, argv[0]);
      return 2;
    }
    std::fprintf(stderr, "%s: unknown or malformed argument '%s'\n", argv[0],
                 argv[i]);
    usage(stderr, argv[0]);
    return 2;
  }
  return 0;
}

// (a) A handler that re-posts itself to its strand until `left` reaches 0.
struct repost {
  strand_type *strand;
  std::uint64_t *left;
  void operator()() const {
    if (--*left != 0)
      asio::post(*strand, *this);
  }
};

double post_run_ns(std::uint64_t iterations) {
  asio::io_context ioc;
  strand_type strand = asio::make_strand(ioc);
  std::uint64_t left = iterations;

  // One untimed warm-up round so the first allocations and the run loop's
  // one-time set-up are not charged to the measurement.
  {
    std::uint64_t warm = std::min<std::uint64_t>(iterations, 10000);
    asio::post(strand, repost{&strand, &warm});
    ioc.run();
    ioc.restart();
  }

  const auto t0 = clock_type::now();
  asio::post(strand, repost{&strand, &left});
  ioc.run();
  const auto t1 = clock_type::now();
  if (left != 0)
    throw std::runtime_error("post+run: the chain stopped early");
  return std::chrono::duration<double, std::nano>(t1 - t0).count() /
         static_cast<double>(iterations);
}

// (c) Two strands' chains on an io_context run by two threads.
double pair_run_ns(std::uint64_t iterations) {
  asio::io_context ioc(2);
  strand_type strand[2] = {asio::make_strand(ioc), asio::make_strand(ioc)};
  struct alignas(64) count { // a line each: two threads write them
    std::uint64_t n;
  } left[2];
  auto round = [&](std::uint64_t n) {
    for (int i = 0; i < 2; ++i) {
      left[i].n = n;
      asio::post(strand[i], repost{&strand[i], &left[i].n});
    }
    std::thread other([&ioc] { ioc.run(); });
    ioc.run();
    other.join();
    ioc.restart();
  };
  round(std::min<std::uint64_t>(iterations, 10000)); // untimed warm-up
  const auto t0 = clock_type::now();
  round(iterations);
  const auto t1 = clock_type::now();
  if (left[0].n != 0 || left[1].n != 0)
    throw std::runtime_error("pair: a chain stopped early");
  return std::chrono::duration<double, std::nano>(t1 - t0).count() /
         static_cast<double>(iterations);
}

// (b) Cross-thread wake latency, in microseconds, one entry per sample.
std::vector<double> wake_latencies(unsigned samples, unsigned sleep_us) {
  asio::io_context ioc;
  auto guard = asio::make_work_guard(ioc);
  strand_type strand = asio::make_strand(ioc);
  std::thread runner([&ioc] { ioc.run(); });

  std::vector<double> lat;
  lat.reserve(samples);
  clock_type::time_point ran_at;
  std::atomic<bool> done{false};

  // A few untimed samples first: thread start-up, first allocations.
  const unsigned warmup = std::min(samples, 20u);
  for (unsigned i = 0; i < warmup + samples; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    done.store(false, std::memory_order_relaxed);
    const auto posted_at = clock_type::now();
    asio::post(strand, [&ran_at, &done] {
      ran_at = clock_type::now();
      done.store(true, std::memory_order_release);
    });
    while (!done.load(std::memory_order_acquire))
      std::this_thread::yield();
    if (i >= warmup)
      lat.push_back(
          std::chrono::duration<double, std::micro>(ran_at - posted_at)
              .count());
  }

  guard.reset();
  runner.join();
  return lat;
}

// Nearest-rank percentile of a sorted, non-empty vector; p in (0, 1].
double percentile(const std::vector<double> &sorted, double p) {
  std::size_t rank = static_cast<std::size_t>(
      std::ceil(p * static_cast<double>(sorted.size())));
  if (rank == 0)
    rank = 1;
  return sorted[std::min(rank, sorted.size()) - 1];
}

} // namespace

int main(int argc, char **argv) {
  options o;
  switch (parse_args(argc, argv, &o)) {
  case 0:
    break;
  case 1:
    return 0;
  default:
    return 2;
  }
  try {
    const double ns = post_run_ns(o.iterations);
    std::printf("asio post+run, same thread, one strand: %.1f ns "
                "(%llu iterations)\n",
                ns, static_cast<unsigned long long>(o.iterations));
    std::fflush(stdout);
    const double pair = pair_run_ns(o.iterations);
    std::printf("asio two chains on two threads, two strands: %.1f ns\n", pair);
    std::fflush(stdout);

    std::vector<double> lat = wake_latencies(o.samples, o.sleep_us);
    std::sort(lat.begin(), lat.end());
    const double p50 = percentile(lat, 0.50);
    const double p99 = percentile(lat, 0.99);
    std::printf("asio wake of a parked io_context: p50 %.1f us, p99 %.1f us, "
                "max %.1f us (%u samples, %u us apart)\n",
                p50, p99, lat.back(), o.samples, o.sleep_us);
    std::printf("{\"impl\":\"asio\",\"post_run_ns\":%.1f,\"pair_run_ns\":%.1f,"
                "\"wake_p50_us\":%.2f,\"wake_p99_us\":%.2f,\"iterations\":%llu,"
                "\"samples\":%u}\n",
                ns, pair, p50, p99,
                static_cast<unsigned long long>(o.iterations), o.samples);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
