// asio_scale.cpp - what a strand and a timer cost on standalone Asio when a
// program holds a million of them, as a peer of weft's bench/scale.c (same
// protocol; keep the two in step).
//
// One io_context, run by this one thread, does all the work. Memory is the
// process's RSS (/proc/self/statm: resident pages x page size), read before
// and after the objects exist, over their count. Times are steady_clock
// (CLOCK_MONOTONIC), one clock pair per batch, over the operations in it.
//
// (a) Strands, --strands N (default 10^6), for each of the two kinds:
//     asio::strand<asio::io_context::executor_type> (asio::make_strand) and
//     the legacy asio::io_context::strand. Both are copyable values, so they
//     are held by value in a std::vector reserved after the first RSS
//     reading: the vector's N slots are the strands' own memory and count,
//     with whatever each strand allocates (make_strand: a strand_impl behind
//     a shared_ptr, one per strand; io_context::strand: nothing, it points
//     into a fixed pool of 193 implementations in the strand_service).
//     The work runs in handlers on the io_context, 1000 strands per
//     handler; the chunk handler re-posts itself to the io_context (not to
//     a strand). A plain counter counts the posted handlers.
//  held: N times create a strand, post one handler to it and keep it; once
//     all N handlers have run, destroy all N (in chunks too); twice. The
//     first round's (time from the first create until all N handlers have
//     run + time of the destroys) / N is strand_cold_ns: it pays the
//     kernel's first touch of the memory it grows into (slow on a VM); the
//     second's, reusing what the first freed, is strand_ns. strand_bytes:
//     RSS growth over N in the first round, once all N handlers have run
//     (the reading is not timed).
//  churn: N times create a strand, post one handler to it and destroy it at
//     once; strand_churn_ns = time until all N handlers have run / N.
// (b) Timers (asio::steady_timer), for P pending = 10^3, 10^5, 10^6, those
//     not above --timers (default 10^6): a fresh io_context (kept from
//     running out of work by a work guard); a std::vector of P timers
//     reserved after the first RSS reading, each armed with expires_after
//     (a deadline from 1 s to 1 h ahead, from a fixed-seed xorshift64, the
//     same sequence as weft's, continued across the sizes) and async_wait
//     (a handler counting aborted and fired waits). timer_bytes: the RSS
//     growth per timer at the largest P (the vector slot, the wait
//     operation, the timer queue's heap entry). Then rounds, until at least
//     10^6 of each: a window of P/2 consecutive timers (windows walk the
//     array and wrap) is cancelled (timer.cancel() each, then ioc.poll()
//     to run their aborted handlers: running them is part of Asio's cancel,
//     so the poll is inside the cancel's time), then started again
//     (expires_after with a new deadline, async_wait). timer_cancel_ns_1eK
//     and timer_start_ns_1eK: time summed over the windows, per operation.
//     The human line also splits the cancel into the cancel() calls and
//     the poll. At the end all are cancelled and polled, so that every
//     handler has run, and the timers destroyed. A timer whose deadline
//     passes during the run (1 s ahead at the least) fires in a poll; its
//     later cancel finds nothing to cancel and it is started again as the
//     others; the count is printed.
//
// Output: human lines, then as the last line one JSON object:
//  {"impl":"asio","strands":N,"timers":N,"strand_bytes":X,"strand_ns":X,
//   "strand_cold_ns":X,"strand_churn_ns":X,"legacy_strand_bytes":X,
//   "legacy_strand_ns":X,"legacy_strand_cold_ns":X,"legacy_strand_churn_ns":X,"timer_bytes":X,"timer_start_ns_1e3":X,
//   "timer_cancel_ns_1e3":X,"timer_start_ns_1e5":X,"timer_cancel_ns_1e5":X,
//   "timer_start_ns_1e6":X,"timer_cancel_ns_1e6":X}
// --skip-strands / --skip-timers leave out a part's keys (and "strands" /
// "timers"). Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include "peer_args.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <malloc.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock; // CLOCK_MONOTONIC on Linux
using new_strand = asio::strand<asio::io_context::executor_type>;
using legacy_strand = asio::io_context::strand;

constexpr std::uint64_t chunk = 1000;        // operations per handler turn
constexpr std::uint64_t cycle_ops = 1000000; // cancels (and starts) per P

struct options {
  std::uint64_t strands = 1000000;
  std::uint64_t timers = 1000000;
  bool skip_strands = false;
  bool skip_timers = false;
};

void usage(std::FILE *f, const char *argv0) {
  std::fprintf(f,
               "usage: %s [--strands N] [--timers N] [--skip-strands] "
               "[--skip-timers]\n"
               "  --strands N     strands per kind (1..10^8, default "
               "1000000)\n"
               "  --timers N      the largest pending count measured, of "
               "10^3, 10^5, 10^6\n"
               "                  (1000..10^9, default 1000000)\n"
               "  --skip-strands  measure no strands\n"
               "  --skip-timers   measure no timers\n",
               argv0);
}

// Returns 0 to run, 1 after --help, 2 on a bad flag (message printed).
int parse_args(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; ++i) {
    const peer::arg a(i, argv);
    const std::string &name = a.name;
    const bool inline_value = a.inline_value;
    if (!inline_value && (name == "--help" || name == "-h")) {
      usage(stdout, argv[0]);
      return 1;
    }
    if (!inline_value && name == "--skip-strands") {
      o->skip_strands = true;
      continue;
    }
    if (!inline_value && name == "--skip-timers") {
      o->skip_timers = true;
      continue;
    }
    if (name == "--strands" || name == "--timers") {
      const char *v = a.value_of(argc, argv, &i);
      if (name == "--strands" && peer::parse_u64(v, 1, 100000000, &o->strands))
        continue;
      if (name == "--timers" &&
          peer::parse_u64(v, 1000, 1000000000, &o->timers))
        continue;
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

// Hands the allocator's free pages back to the kernel, so that the memory
// an earlier phase freed is not reused, already resident, by the next one
// (which would hide it from that phase's RSS growth).
void trim() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// Resident bytes of this process.
double rss_bytes() {
  std::FILE *f = std::fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  int got = f ? std::fscanf(f, "%ld %ld", &size, &resident) : 0;
  if (f)
    std::fclose(f);
  if (got != 2)
    throw std::runtime_error("cannot read /proc/self/statm");
  return static_cast<double>(resident) *
         static_cast<double>(sysconf(_SC_PAGESIZE));
}

double ns_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

// Between 1 s and 1 h ahead, from a fixed-seed xorshift64 (13, 7, 17): the
// same sequence as weft's bench/scale.c and uv_scale.c draw.
std::uint64_t rng = 0x9E3779B97F4A7C15ull;

std::uint64_t random_deadline_ns() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return 1000000000ull + rng % (3600000000000ull - 1000000000ull);
}

// Runs op(0..n-1) in handlers on ioc, chunk operations per handler, each
// chunk handler re-posting itself to ioc; returns once ioc has run out of
// work (every handler posted meanwhile has run too).
template <class Op>
void run_chunked(asio::io_context &ioc, std::uint64_t n, Op &op) {
  struct driver {
    asio::io_context *ioc;
    Op *op;
    std::uint64_t n, next;
    void operator()() {
      const std::uint64_t end = std::min(next + chunk, n);
      for (std::uint64_t i = next; i < end; ++i)
        (*op)(i);
      next = end;
      if (next < n)
        asio::post(*ioc, *this);
    }
  };
  asio::post(ioc, driver{&ioc, &op, n, 0});
  ioc.run();
  ioc.restart();
}

// The handler posted to each strand.
struct bump {
  std::uint64_t *ran;
  void operator()() const { ++*ran; }
};

new_strand make(asio::io_context &ioc, const new_strand *) {
  return asio::make_strand(ioc);
}

legacy_strand make(asio::io_context &ioc, const legacy_strand *) {
  return legacy_strand(ioc);
}

struct strand_figures {
  double bytes, cold_ns, ns, churn_ns;
};

template <class Strand>
strand_figures measure_strands(std::uint64_t n, const char *what) {
  const Strand *kind = nullptr;
  strand_figures f;
  asio::io_context ioc(1);
  std::uint64_t ran = 0;
  {
    // Untimed: the strand service and the first allocations exist before
    // the first reading.
    Strand s = make(ioc, kind);
    asio::post(s, bump{&ran});
    ioc.run();
    ioc.restart();
  }

  // held: a first round (cold: it also pays the kernel's first touch of
  // the memory it grows into; strand_bytes), then a second that reuses
  // what the first freed (strand_ns), as weft's
  std::vector<Strand> held;
  auto create = [&](std::uint64_t) {
    held.push_back(make(ioc, kind));
    asio::post(held.back(), bump{&ran});
  };
  auto destroy = [&](std::uint64_t) { held.pop_back(); };
  auto round = [&](bool first) {
    ran = 0;
    double rss0 = 0;
    if (first) {
      trim();
      rss0 = rss_bytes();
    }
    held.reserve(n);
    const auto t0 = clock_type::now();
    run_chunked(ioc, n, create);
    const auto t1 = clock_type::now();
    if (ran != n || held.size() != n)
      throw std::runtime_error(std::string(what) + ": held: handlers lost");
    if (first)
      f.bytes = (rss_bytes() - rss0) / static_cast<double>(n);
    const auto t2 = clock_type::now();
    run_chunked(ioc, n, destroy);
    const auto t3 = clock_type::now();
    if (!held.empty())
      throw std::runtime_error(std::string(what) + ": held: not all destroyed");
    return (ns_between(t0, t1) + ns_between(t2, t3)) / static_cast<double>(n);
  };
  f.cold_ns = round(true);
  f.ns = round(false);
  std::vector<Strand>().swap(held);

  // churn
  ran = 0;
  auto churn = [&](std::uint64_t) {
    Strand s = make(ioc, kind);
    asio::post(s, bump{&ran});
  };
  const auto t4 = clock_type::now();
  run_chunked(ioc, n, churn);
  const auto t5 = clock_type::now();
  if (ran != n)
    throw std::runtime_error(std::string(what) + ": churn: handlers lost");
  f.churn_ns = ns_between(t4, t5) / static_cast<double>(n);

  std::printf("asio %s (sizeof %zu): %llu held: %.1f bytes, %.1f ns each "
              "(%.1f ns cold); churn %.1f ns\n",
              what, sizeof(Strand), static_cast<unsigned long long>(n), f.bytes,
              f.ns, f.cold_ns, f.churn_ns);
  std::fflush(stdout);
  return f;
}

// The pending counts measured: 10^3, 10^5, 10^6, those not above --timers.
constexpr std::uint64_t sizes[] = {1000, 100000, 1000000};
constexpr const char *size_names[] = {"1e3", "1e5", "1e6"};
constexpr int nsizes = 3;

struct wait_counts {
  std::uint64_t aborted = 0, fired = 0, failed = 0;
};

struct on_wait {
  wait_counts *c;
  void operator()(const asio::error_code &ec) const {
    if (ec == asio::error::operation_aborted)
      ++c->aborted;
    else if (ec)
      ++c->failed;
    else
      ++c->fired;
  }
};

struct timer_figures {
  double bytes = 0;
  double start_ns[nsizes] = {}, cancel_ns[nsizes] = {};
  int n = 0; // sizes measured
};

void arm(asio::steady_timer &t, wait_counts *c) {
  t.expires_after(std::chrono::nanoseconds(random_deadline_ns()));
  t.async_wait(on_wait{c});
}

timer_figures measure_timers(std::uint64_t max) {
  timer_figures f;
  for (int k = 0; k < nsizes && sizes[k] <= max; ++k) {
    const std::uint64_t p = sizes[k], window = p / 2;
    asio::io_context ioc(1);
    auto guard = asio::make_work_guard(ioc);
    { asio::steady_timer warm(ioc); } // the timer service and its reactor
    wait_counts c;

    trim();
    const double rss0 = rss_bytes();
    std::vector<asio::steady_timer> timers;
    timers.reserve(p);
    for (std::uint64_t i = 0; i < p; ++i) {
      timers.emplace_back(ioc);
      arm(timers.back(), &c);
    }
    const double bytes = (rss_bytes() - rss0) / static_cast<double>(p);

    double cancel_calls = 0, cancel_poll = 0, start = 0;
    std::uint64_t ops = 0, base = 0;
    for (; ops < cycle_ops; ops += window) {
      const auto t0 = clock_type::now();
      for (std::uint64_t i = 0; i < window; ++i)
        timers[(base + i) % p].cancel();
      const auto t1 = clock_type::now();
      ioc.poll();
      const auto t2 = clock_type::now();
      for (std::uint64_t i = 0; i < window; ++i)
        arm(timers[(base + i) % p], &c);
      const auto t3 = clock_type::now();
      cancel_calls += ns_between(t0, t1);
      cancel_poll += ns_between(t1, t2);
      start += ns_between(t2, t3);
      base = (base + window) % p;
    }
    const double per = static_cast<double>(ops);
    f.cancel_ns[k] = (cancel_calls + cancel_poll) / per;
    f.start_ns[k] = start / per;
    f.bytes = bytes;
    f.n = k + 1;

    for (auto &t : timers)
      t.cancel();
    ioc.poll();
    if (c.failed != 0 || c.aborted + c.fired != p + ops)
      throw std::runtime_error("timers: a wait did not complete as expected");
    std::vector<asio::steady_timer>().swap(timers);
    guard.reset();

    std::printf("asio steady_timer (sizeof %zu), %llu pending: %.1f bytes; "
                "start %.1f ns, "
                "cancel %.1f ns (cancel() %.1f + poll %.1f); %llu ops each, "
                "%llu fired\n",
                sizeof(asio::steady_timer), static_cast<unsigned long long>(p),
                bytes, f.start_ns[k], f.cancel_ns[k], cancel_calls / per,
                cancel_poll / per, static_cast<unsigned long long>(ops),
                static_cast<unsigned long long>(c.fired));
    std::fflush(stdout);
  }
  return f;
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
    strand_figures s{}, ls{};
    if (!o.skip_strands) {
      s = measure_strands<new_strand>(o.strands, "make_strand");
      ls = measure_strands<legacy_strand>(o.strands, "io_context::strand");
    }
    timer_figures t;
    if (!o.skip_timers)
      t = measure_timers(o.timers);

    std::printf("{\"impl\":\"asio\"");
    if (!o.skip_strands)
      std::printf(",\"strands\":%llu",
                  static_cast<unsigned long long>(o.strands));
    if (!o.skip_timers)
      std::printf(",\"timers\":%llu",
                  static_cast<unsigned long long>(o.timers));
    if (!o.skip_strands)
      std::printf(",\"strand_bytes\":%.2f,\"strand_ns\":%.2f,"
                  "\"strand_cold_ns\":%.2f,\"strand_churn_ns\":%.2f,"
                  "\"legacy_strand_bytes\":%.2f,\"legacy_strand_ns\":%.2f,"
                  "\"legacy_strand_cold_ns\":%.2f,"
                  "\"legacy_strand_churn_ns\":%.2f",
                  s.bytes, s.ns, s.cold_ns, s.churn_ns, ls.bytes, ls.ns,
                  ls.cold_ns, ls.churn_ns);
    if (!o.skip_timers) {
      std::printf(",\"timer_bytes\":%.2f", t.bytes);
      for (int k = 0; k < t.n; ++k)
        std::printf(",\"timer_start_ns_%s\":%.2f,\"timer_cancel_ns_%s\":%.2f",
                    size_names[k], t.start_ns[k], size_names[k],
                    t.cancel_ns[k]);
    }
    std::printf("}\n");
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
