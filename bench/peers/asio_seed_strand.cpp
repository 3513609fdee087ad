// asio_seed_strand.cpp - the seed test case of weft, on standalone Asio.
//
// A port, to standalone Asio and C++17, of the test case in docs/cases.md,
// "Asio's shared strand implementations": W independent chains
// of work, each handler creating a NEW Work object with a NEW strand and
// posting its successor there, run by N threads. With --blocking K, K extra
// strands each get one handler that blocks its thread until the measurement
// ends. Nothing about the chains depends on those strands, so an ideal
// runtime loses at most K of N threads; Asio's legacy io_context::strand
// shares a fixed pool of 193 implementations between all strands, so every
// chain sooner or later lands on a blocked implementation and stops.
//
// Differences from the original, all deliberate:
//  - standalone Asio (asio::io_context), not boost::asio::io_service;
//  - the strand kind is selectable: the default is the executor strand
//    asio::strand<asio::io_context::executor_type> (asio::make_strand), and
//    --legacy selects the deprecated asio::io_context::strand, posted as in
//    the original: post(io_context, strand.wrap(handler));
//  - the blocking handlers do not get a thread of their own: all N threads
//    compete, and the blocked ones are lost to everybody;
//  - the blocking handler sleeps in 10 ms slices until the measurement ends
//    (at most max(5 s, S + 1 s)) instead of a fixed sleep(5);
//  - the counter is read at the start and at the end of the measured
//    interval, which starts once the threads run and the blocking handlers
//    have been posted.
//
// Output: a human line, then as the last line one JSON object:
//  {"impl":"asio-strand","threads":8,"seconds":3.00,"blocking":0,"work":8,
//   "handlers":N,"handlers_per_sec":X}
// handlers_per_sec divides by the measured (steady_clock) interval.
// Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

// On separate cache lines, as in weft's port: every handler writes counter
// and reads running.
alignas(64) std::atomic<bool> running{true};
alignas(64) std::atomic<std::uint64_t> counter{0};

using clock_type = std::chrono::steady_clock;

// The longest any blocking handler may hold its thread; set in main().
clock_type::duration block_cap;

using new_strand = asio::strand<asio::io_context::executor_type>;
using legacy_strand = asio::io_context::strand;

// How each strand kind is made and posted to. The legacy kind is posted
// exactly as the original does it: to the strand's io_context, wrapped.
template <class Strand> struct strand_ops;

template <> struct strand_ops<new_strand> {
  static new_strand make(asio::io_context &ioc) {
    return asio::make_strand(ioc);
  }
  static asio::io_context &context(new_strand &s) {
    return s.get_inner_executor().context();
  }
  template <class F> static void post(new_strand &s, F &&f) {
    asio::post(s, std::forward<F>(f));
  }
};

template <> struct strand_ops<legacy_strand> {
  static legacy_strand make(asio::io_context &ioc) {
    return legacy_strand(ioc);
  }
  static asio::io_context &context(legacy_strand &s) { return s.context(); }
  template <class F> static void post(legacy_strand &s, F &&f) {
    asio::post(s.context(), s.wrap(std::forward<F>(f)));
  }
};

template <class Strand> struct Work {
  explicit Work(asio::io_context &ioc)
      : strand_(strand_ops<Strand>::make(ioc)) {}

  static void start_the_work(asio::io_context &ioc) {
    std::shared_ptr<Work> self(new Work(ioc));
    strand_ops<Strand>::post(self->strand_,
                             std::bind(&Work::do_the_work, self));
  }

  static void do_the_work(const std::shared_ptr<Work> &self) {
    counter.fetch_add(1, std::memory_order_relaxed);
    if (running.load(std::memory_order_relaxed))
      start_the_work(strand_ops<Strand>::context(self->strand_));
  }

  Strand strand_;
};

template <class Strand> struct BlockingWork {
  explicit BlockingWork(asio::io_context &ioc)
      : strand_(strand_ops<Strand>::make(ioc)) {}

  static void start_the_work(asio::io_context &ioc) {
    std::shared_ptr<BlockingWork> self(new BlockingWork(ioc));
    strand_ops<Strand>::post(self->strand_,
                             std::bind(&BlockingWork::do_the_work, self));
  }

  static void do_the_work(const std::shared_ptr<BlockingWork> &) {
    const auto until = clock_type::now() + block_cap;
    while (running.load(std::memory_order_relaxed) && clock_type::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  Strand strand_;
};

struct options {
  unsigned threads = 8;
  double seconds = 3.0;
  unsigned blocking = 0;
  std::optional<unsigned> work;
  bool legacy = false;
};

void usage(std::FILE *f, const char *argv0) {
  std::fprintf(f,
               "usage: %s [--threads N] [--seconds S] [--blocking K] "
               "[--work W] [--legacy]\n"
               "  --threads N   threads running io_context::run (1..1024, "
               "default 8)\n"
               "  --seconds S   measured interval in seconds (0 < S <= 3600, "
               "default 3)\n"
               "  --blocking K  extra strands whose one handler blocks its "
               "thread (0..1024, default 0)\n"
               "  --work W      independent work chains (1..1000000, default "
               "N)\n"
               "  --legacy      use the deprecated asio::io_context::strand\n",
               argv0);
}

bool parse_unsigned(const char *s, unsigned long lo, unsigned long hi,
                    unsigned *out) {
  if (s == nullptr || *s == '\0' || *s == '-' || *s == '+')
    return false;
  char *end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  *out = static_cast<unsigned>(v);
  return true;
}

bool parse_seconds(const char *s, double *out) {
  if (s == nullptr || *s == '\0')
    return false;
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v <= 0.0 || v > 3600.0)
    return false;
  *out = v;
  return true;
}

// Returns 0 to run, 1 after --help, 2 on a bad flag (message printed).
int parse_args(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg;
    const char *value = nullptr;
    bool inline_value = false;
    if (auto eq = arg.find('=');
        arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = argv[i] + eq + 1;
      inline_value = true;
    }
    auto need_value = [&]() -> const char * {
      if (inline_value)
        return value;
      if (i + 1 >= argc)
        return nullptr;
      return argv[++i];
    };
    if (name == "--help" || name == "-h") {
      if (inline_value)
        goto bad;
      usage(stdout, argv[0]);
      return 1;
    } else if (name == "--legacy") {
      if (inline_value)
        goto bad;
      o->legacy = true;
    } else if (name == "--threads") {
      const char *v = need_value();
      if (!parse_unsigned(v, 1, 1024, &o->threads)) {
        std::fprintf(stderr,
                     "%s: --threads needs an integer in 1..1024, got '%s'\n",
                     argv[0], v ? v : "");
        return 2;
      }
    } else if (name == "--seconds") {
      const char *v = need_value();
      if (!parse_seconds(v, &o->seconds)) {
        std::fprintf(stderr,
                     "%s: --seconds needs a number in (0, 3600], got '%s'\n",
                     argv[0], v ? v : "");
        return 2;
      }
    } else if (name == "--blocking") {
      const char *v = need_value();
      if (!parse_unsigned(v, 0, 1024, &o->blocking)) {
        std::fprintf(stderr,
                     "%s: --blocking needs an integer in 0..1024, got '%s'\n",
                     argv[0], v ? v : "");
        return 2;
      }
    } else if (name == "--work") {
      const char *v = need_value();
      unsigned w = 0;
      if (!parse_unsigned(v, 1, 1000000, &w)) {
        std::fprintf(stderr,
                     "%s: --work needs an integer in 1..1000000, got '%s'\n",
                     argv[0], v ? v : "");
        return 2;
      }
      o->work = w;
    } else {
      goto bad;
    }
    continue;
  bad:
    std::fprintf(stderr, "%s: unknown or malformed argument '%s'\n", argv[0],
                 argv[i]);
    usage(stderr, argv[0]);
    return 2;
  }
  return 0;
}

template <class Strand> int run(const options &o, const char *impl) {
  const unsigned work = o.work.value_or(o.threads);
  block_cap = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(std::max(5.0, o.seconds + 1.0)));

  asio::io_context ioc;
  auto guard = asio::make_work_guard(ioc);

  for (unsigned i = 0; i < work; ++i)
    Work<Strand>::start_the_work(ioc);

  std::vector<std::thread> workers;
  workers.reserve(o.threads);
  try {
    for (unsigned i = 0; i < o.threads; ++i)
      workers.emplace_back([&ioc] { ioc.run(); });
  } catch (const std::exception &e) {
    std::fprintf(stderr, "cannot start thread %zu: %s\n", workers.size() + 1,
                 e.what());
    running = false;
    guard.reset();
    for (auto &t : workers)
      t.join();
    return 1;
  }

  for (unsigned i = 0; i < o.blocking; ++i)
    BlockingWork<Strand>::start_the_work(ioc);

  const auto t0 = clock_type::now();
  const std::uint64_t c0 = counter.load(std::memory_order_relaxed);
  std::this_thread::sleep_until(
      t0 + std::chrono::duration_cast<clock_type::duration>(
               std::chrono::duration<double>(o.seconds)));
  const std::uint64_t c1 = counter.load(std::memory_order_relaxed);
  const auto t1 = clock_type::now();

  running = false;
  guard.reset();
  for (auto &t : workers)
    t.join();

  const double elapsed = std::chrono::duration<double>(t1 - t0).count();
  const std::uint64_t handlers = c1 - c0;
  const double rate =
      elapsed > 0 ? static_cast<double>(handlers) / elapsed : 0.0;

  std::printf("%s: threads=%u work=%u blocking=%u: %llu handlers in %.3f s "
              "(%.0f handlers/s; %llu in total)\n",
              impl, o.threads, work, o.blocking,
              static_cast<unsigned long long>(handlers), elapsed, rate,
              static_cast<unsigned long long>(counter.load()));
  std::printf(
      "{\"impl\":\"%s\",\"threads\":%u,\"seconds\":%.2f,\"blocking\":%u,"
      "\"work\":%u,\"handlers\":%llu,\"handlers_per_sec\":%.0f}\n",
      impl, o.threads, o.seconds, o.blocking, work,
      static_cast<unsigned long long>(handlers), rate);
  std::fflush(stdout);
  return 0;
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
    if (o.legacy)
      return run<legacy_strand>(o, "asio-legacy-strand");
    return run<new_strand>(o, "asio-strand");
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
