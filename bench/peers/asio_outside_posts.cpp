// asio_outside_posts.cpp - many threads outside an io_context posting into
// it at once, on standalone Asio, as a peer of weft's outside_posts.
//
// One io_context (concurrency hint W) kept alive by a work guard and run
// by --workers W threads (default 2; weft's benchmark passes the number of
// workers its runtime used). --threads T other threads (default 64) wait
// at a barrier and, released together, each post --posts P handlers
// (default 62500) with asio::post(ioc, handler). Each handler adds one to
// its poster's counter (one per poster, in a 64-byte line of its own; a
// fetch_add, release so that the main thread's acquire load sees the
// samples). One post in every --every K (default 64) is a sample: the
// poster writes a CLOCK_MONOTONIC timestamp into a record allocated before
// the run and passes its address; the handler's first instruction takes
// its own. A poster keeps at most --inflight N / T (N default 65536 in all)
// of its posts posted and not yet run; at that bound it yields the CPU
// (sched_yield) until half of them have run. Then the same total with one
// poster (T = 1, P = T * P), on a new io_context with W threads.
//
// Reported (the same figures as weft's, see bench/outside_posts.c):
// posts_per_sec (T * P over the time from the barrier's release to the
// last handler), delay_p50_us, delay_p99_us, delay_max_us (nearest rank
// over the samples), poster_p50_ms (median over the posters of release to
// their last post's return), switches (voluntary context switches of every
// thread but main's over the run: a futex wait on the io_context's mutex,
// a runner waiting for work); for one poster posts_per_sec_1,
// delay_p50_us_1, delay_p99_us_1, switches_1.
//
// A watchdog ends the program (exit 1) with what it knows on stderr if a
// variant has not finished 60 s after it began.
//
// Output: human lines, then as the last line one JSON object:
//  {"impl":"asio","threads":T,"workers":W,"posts":T*P,"posts_per_sec":X,
//   "delay_p50_us":X,"delay_p99_us":X,"delay_max_us":X,"poster_p50_ms":X,
//   "posts_per_sec_1":X,"delay_p50_us_1":X,"delay_p99_us_1":X,
//   "switches":N,"switches_1":N}
// Exit status: 0, 2 on bad flags, 1 on any other failure.

#include <asio.hpp>

#include "peer_args.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::uint64_t watchdog_ns = 60ull * 1000000000ull;

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

struct options {
  std::uint64_t workers = 2;
  std::uint64_t threads = 64;
  std::uint64_t posts = 62500;
  std::uint64_t every = 64;
  std::uint64_t inflight = 65536;
};

// One poster's counter: written by the handlers, read by its poster and by
// the main thread. A line each.
struct alignas(64) line {
  std::atomic<std::uint64_t> ran{0};
  std::atomic<std::uint64_t> done_ns{0}; // when ran reached target
  std::uint64_t target = 0;
};

struct sample {
  std::uint64_t posted_ns = 0;
  std::uint64_t ran_ns = 0;
  line *ln = nullptr;
};

struct result {
  double posts_per_sec, p50_us, p99_us, max_us, poster_p50_ms, switches;
};

// What the watchdog reports.
std::atomic<line *> cur_lines{nullptr};
std::atomic<std::uint64_t> cur_threads{0}, cur_total{0}, cur_finished{0};
std::atomic<std::uint64_t> phase_start_ns{0};
std::atomic<bool> all_done{false};

void count_one(line *l) {
  std::uint64_t n = l->ran.fetch_add(1, std::memory_order_release);
  if (n + 1 == l->target)
    l->done_ns.store(now_ns(), std::memory_order_release);
}

void watchdog() {
  while (!all_done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::uint64_t start = phase_start_ns.load();
    if (start == 0 || now_ns() - start < watchdog_ns)
      continue;
    std::fprintf(stderr, "asio_outside_posts: watchdog: a variant is not "
                         "done 60 s after it began\n");
    if (line *ls = cur_lines.load()) {
      std::uint64_t ran = 0, t = cur_threads.load();
      for (std::uint64_t i = 0; i < t; ++i)
        ran += ls[i].ran.load();
      std::fprintf(stderr,
                   "asio_outside_posts: %llu posters, %llu finished "
                   "posting, %llu of %llu handlers ran\n",
                   static_cast<unsigned long long>(t),
                   static_cast<unsigned long long>(cur_finished.load()),
                   static_cast<unsigned long long>(ran),
                   static_cast<unsigned long long>(cur_total.load()));
    }
    _exit(1);
  }
}

// Voluntary context switches (a thread blocked: a futex wait on a lock, a
// runner waiting for work) of the process, less the calling thread's.
long others_switches() {
  rusage all, self;
  getrusage(RUSAGE_SELF, &all);
  getrusage(RUSAGE_THREAD, &self);
  return all.ru_nvcsw - self.ru_nvcsw;
}

void sleep_us(long us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// Nearest rank of a sorted, non-empty vector; p in (0, 1].
std::uint64_t rank(const std::vector<std::uint64_t> &v, double p) {
  double x = p * static_cast<double>(v.size());
  std::size_t k = static_cast<std::size_t>(x);
  if (static_cast<double>(k) < x)
    ++k;
  k = std::max<std::size_t>(k, 1);
  return v[std::min(k, v.size()) - 1];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

result measure(unsigned workers, unsigned threads, std::uint64_t per_thread,
               unsigned every, std::uint64_t inflight) {
  phase_start_ns.store(now_ns());
  asio::io_context ioc(static_cast<int>(workers));
  auto guard = asio::make_work_guard(ioc);
  std::vector<std::thread> runners;
  for (unsigned i = 0; i < workers; ++i)
    runners.emplace_back([&ioc] { ioc.run(); });

  const std::uint64_t window = inflight / threads;
  const std::size_t per = (per_thread + every - 1) / every;
  std::unique_ptr<line[]> lines(new line[threads]);
  std::vector<sample> samples(per * threads);
  for (unsigned i = 0; i < threads; ++i) {
    lines[i].target = per_thread;
    for (std::size_t j = 0; j < per; ++j)
      samples[per * i + j].ln = &lines[i];
  }
  std::vector<std::uint64_t> finished(threads * 8); // a line each
  cur_threads.store(threads);
  cur_total.store(per_thread * threads);
  cur_finished.store(0);
  cur_lines.store(lines.get());

  // Warm-up, untimed: as many posts as may be in flight, from this thread
  // (also outside the io_context).
  std::atomic<std::uint64_t> warm{0};
  for (std::uint64_t i = 0; i < inflight; ++i)
    asio::post(ioc, [&warm] { warm.fetch_add(1, std::memory_order_relaxed); });
  while (warm.load() < inflight)
    sleep_us(200);

  pthread_barrier_t go;
  pthread_barrier_init(&go, nullptr, threads + 1);
  std::atomic<unsigned> ready{0};
  std::vector<std::thread> posters;
  for (unsigned t = 0; t < threads; ++t)
    posters.emplace_back([&, t] {
      line *l = &lines[t];
      sample *s = &samples[per * t];
      unsigned left = 1; // the first post is a sample
      ready.fetch_add(1);
      pthread_barrier_wait(&go);
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        // Reads the line the handlers write: only every 16th post.
        if (i % 16 == 0 && i - l->ran.load(std::memory_order_relaxed) >= window)
          while (i - l->ran.load(std::memory_order_relaxed) > window / 2)
            sched_yield();
        if (--left == 0) {
          left = every;
          sample *cur = s++;
          cur->posted_ns = now_ns();
          asio::post(ioc, [cur] {
            std::uint64_t at = now_ns();
            cur->ran_ns = at;
            count_one(cur->ln);
          });
        } else {
          asio::post(ioc, [l] { count_one(l); });
        }
      }
      finished[t * 8] = now_ns();
      cur_finished.fetch_add(1);
    });
  while (ready.load() < threads)
    sleep_us(100);
  const long sw0 = others_switches();
  const std::uint64_t t0 = now_ns(); // every poster waits: this releases them
  pthread_barrier_wait(&go);

  std::uint64_t end = 0;
  for (unsigned i = 0; i < threads; ++i) {
    std::uint64_t d;
    while ((d = lines[i].done_ns.load(std::memory_order_acquire)) == 0)
      sleep_us(200);
    // The handlers' sample writes, released by their fetch_adds.
    (void)lines[i].ran.load(std::memory_order_acquire);
    end = std::max(end, d);
  }
  const long sw1 = others_switches();
  for (auto &p : posters)
    p.join();
  pthread_barrier_destroy(&go);
  guard.reset();
  for (auto &r : runners)
    r.join();
  cur_lines.store(nullptr);

  std::vector<std::uint64_t> lat;
  lat.reserve(samples.size());
  for (const sample &s : samples)
    lat.push_back(s.ran_ns - s.posted_ns);
  std::sort(lat.begin(), lat.end());
  std::vector<double> dur;
  for (unsigned i = 0; i < threads; ++i)
    dur.push_back(static_cast<double>(finished[i * 8] - t0) / 1e6);
  result r;
  r.posts_per_sec = static_cast<double>(per_thread * threads) /
                    static_cast<double>(end - t0) * 1e9;
  r.p50_us = static_cast<double>(rank(lat, 0.50)) / 1e3;
  r.p99_us = static_cast<double>(rank(lat, 0.99)) / 1e3;
  r.max_us = static_cast<double>(lat.back()) / 1e3;
  r.poster_p50_ms = median(dur);
  r.switches = static_cast<double>(sw1 - sw0);
  return r;
}

void usage(std::FILE *f, const char *argv0) {
  std::fprintf(f,
               "usage: %s [--workers W] [--threads T] [--posts P] "
               "[--every K] [--inflight N]\n"
               "  --workers W   threads running the io_context, 1..256 "
               "(default 2)\n"
               "  --threads T   posting threads, 1..1024 (default 64)\n"
               "  --posts P     posts per posting thread, 1..10^8 (default "
               "62500; T * P at most 10^8)\n"
               "  --every K     one post in K is a delay sample, 1..10^6 "
               "(default 64)\n"
               "  --inflight N  posts posted and not yet run, in all, at "
               "most; at least 16 * T (default 65536)\n",
               argv0);
}

// Returns 0 to run, 1 after --help, 2 on a bad flag (message printed).
int parse_args(int argc, char **argv, options *o) {
  // Every flag but --help takes a value: two arguments at a time.
  for (int i = 1; i < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      usage(stdout, argv[0]);
      return 1;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = false;
    if (name == "--workers")
      ok = peer::parse_u64(v, 1, 256, &o->workers);
    else if (name == "--threads")
      ok = peer::parse_u64(v, 1, 1024, &o->threads);
    else if (name == "--posts")
      ok = peer::parse_u64(v, 1, 100000000, &o->posts);
    else if (name == "--every")
      ok = peer::parse_u64(v, 1, 1000000, &o->every);
    else if (name == "--inflight")
      ok = peer::parse_u64(v, 16, 100000000, &o->inflight);
    if (!ok) {
      std::fprintf(stderr, "%s: bad or unknown argument '%s'\n", argv[0],
                   argv[i]);
      usage(stderr, argv[0]);
      return 2;
    }
  }
  if (o->threads * o->posts > 100000000 || o->inflight < 16 * o->threads) {
    std::fprintf(stderr,
                 "%s: T * P at most 10^8, --inflight at least "
                 "16 * T\n",
                 argv[0]);
    return 2;
  }
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
    std::thread wd(watchdog);
    const auto w = static_cast<unsigned>(o.workers);
    const auto t = static_cast<unsigned>(o.threads);
    const auto k = static_cast<unsigned>(o.every);
    const result many = measure(w, t, o.posts, k, o.inflight);
    const result one = measure(w, 1, o.posts * o.threads, k, o.inflight);
    all_done.store(true);
    wd.join();
    const unsigned long long total = o.posts * o.threads;
    std::printf("asio %u posters x %llu posts into %u threads: %.2f M "
                "posts/s, delay p50 %.1f us p99 %.1f us max %.1f us, "
                "posters p50 %.1f ms (blocked %.0f times)\n",
                t, static_cast<unsigned long long>(o.posts), w,
                many.posts_per_sec / 1e6, many.p50_us, many.p99_us, many.max_us,
                many.poster_p50_ms, many.switches);
    std::printf("asio 1 poster x %llu posts: %.2f M posts/s, delay p50 "
                "%.1f us p99 %.1f us (blocked %.0f times)\n",
                total, one.posts_per_sec / 1e6, one.p50_us, one.p99_us,
                one.switches);
    std::printf("{\"impl\":\"asio\",\"threads\":%u,\"workers\":%u,"
                "\"posts\":%llu,\"posts_per_sec\":%.0f,\"delay_p50_us\":%.2f,"
                "\"delay_p99_us\":%.2f,\"delay_max_us\":%.2f,"
                "\"poster_p50_ms\":%.2f,\"posts_per_sec_1\":%.0f,"
                "\"delay_p50_us_1\":%.2f,\"delay_p99_us_1\":%.2f,"
                "\"switches\":%.0f,\"switches_1\":%.0f}\n",
                t, w, total, many.posts_per_sec, many.p50_us, many.p99_us,
                many.max_us, many.poster_p50_ms, one.posts_per_sec, one.p50_us,
                one.p99_us, many.switches, one.switches);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
