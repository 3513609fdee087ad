/*
 * outside_posts - many threads outside the runtime posting into it at once:
 * throughput and post-to-run delay through the inject queue, against Asio.
 *
 * A runtime of --workers W shards (0, the default: one per CPU; all of
 * them started up front). --threads T plain pthreads (default 64), none of
 * them the runtime's, wait at a barrier and, released together, each post
 * --posts P handlers (default 62500, so 4 million in all, about a second
 * on a 2-CPU machine) with weft_post_rt. With more threads than CPUs (the
 * point: T = 64 on 2 CPUs) the posters are oversubscribed, and a lock on
 * the posting path would show as a convoy: a poster preempted while it
 * holds the lock stalls every thread that wants it, workers included.
 *
 * Each handler adds one to its poster's counter, one counter per poster in
 * a 64-byte line of its own, so that no single line written by every
 * handler dominates what is measured (a fetch_add with release order, so
 * that the main thread's acquire load sees the samples; on x86 the same
 * instruction as a relaxed one). One post in every --every K (default 64)
 * is a sample: the poster writes a CLOCK_MONOTONIC timestamp into a record
 * it passes as the argument (records allocated before the run, none in the
 * loop), and the handler's first instruction takes its own.
 *
 * Bounded memory: a poster keeps at most --inflight N / T of its posts
 * (N default 65536 in all) posted and not yet run; at that bound it
 * yields the CPU (sched_yield) until half of them have run. Posters can
 * outrun W workers on an oversubscribed machine, so the bound is often
 * reached, and then by Little's law the delay is about the posts in
 * flight over the throughput: a queue that lets posters run ahead shows a
 * longer delay at the same throughput. The tail over p50 (a worker or a
 * poster preempted, unfair handoffs) says more than p50 by itself.
 *
 * Reported, per variant:
 *   posts_per_sec  T * P over the wall time from the barrier's release to
 *                  the last handler (the latest of the handlers that
 *                  brought a poster's counter to P);
 *   delay_p50_us, delay_p99_us, delay_max_us  post-to-run delay over all
 *                  samples (nearest rank);
 *   poster_p50_ms  the median over the posters of the time from the
 *                  release to the return of the poster's last post;
 *   switches       voluntary context switches of every thread but main's
 *                  over the run: threads that blocked, on a lock's futex
 *                  (a convoy) or a worker with nothing to do parking
 *                  (sched_yield at the bound does not count).
 * Then the same total with one poster (T = 1, P = T * P, a runtime of its
 * own, same W): posts_per_sec_1, delay_p50_us_1, delay_p99_us_1,
 * switches_1. weft only: stalls and handoffs (weft_stats) of the first.
 *
 * The same workload on Asio, build/bench/peers/asio_outside_posts (one
 * io_context run by W threads, the W this runtime used), when it was
 * built: its keys are repeated with the prefix asio_, with the ratios
 * posts_per_sec_vs_asio (weft over Asio; higher is better) and
 * delay_p99_vs_asio (weft over Asio; lower is better).
 *
 * A watchdog ends the program (exit 1) with what it knows on stderr if a
 * variant has not finished 60 s after it began (the peer has its own).
 *   build/bench/outside_posts [--workers W] [--threads T] [--posts P]
 *                             [--every K] [--inflight N] [--no-peer]
 * Output: human lines, then as the last line one JSON object. Exit status:
 * 0, 2 on bad flags, 1 on any other failure.
 */
#include <weft.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#define WATCHDOG_NS (60ull * 1000000000ull)

/* One poster's counter, written by the handlers (on any worker), read by
 * its poster (the in-flight bound) and by the main thread. A line each. */
struct line {
  _Alignas(64) _Atomic uint64_t ran;
  _Atomic uint64_t done_ns; /* when ran reached target; 0 before */
  uint64_t target;
};

struct sample {
  uint64_t posted_ns;
  uint64_t ran_ns;
  struct line *line;
};

struct variant;

struct poster {
  _Alignas(64) struct variant *v;
  struct line *line;
  struct sample *samples;
  uint64_t finished_ns;
  pthread_t th;
};

struct variant {
  weft_rt *rt;
  unsigned threads;
  uint64_t per_thread;
  unsigned every;
  uint64_t window; /* per poster */
  struct line *lines;
  struct poster *posters;
  pthread_barrier_t go;
  _Atomic unsigned ready;
  _Atomic unsigned finished; /* posters past their last post */
  uint64_t t0;
};

struct result {
  double posts_per_sec, p50_us, p99_us, max_us, poster_p50_ms, switches;
  uint64_t stalls, handoffs, parks;
};

/* What the watchdog reports. */
static _Atomic(struct variant *) current;
static _Atomic uint64_t phase_start_ns;
static _Atomic bool all_done;

static void count_one(struct line *l) {
  uint64_t n = atomic_fetch_add_explicit(&l->ran, 1, memory_order_release);
  if (n + 1 == l->target)
    atomic_store_explicit(&l->done_ns, bench_now_ns(), memory_order_release);
}

static void plain(void *arg) { count_one(arg); }

static void sampled(void *arg) {
  uint64_t t = bench_now_ns();
  struct sample *s = arg;
  s->ran_ns = t;
  count_one(s->line);
}

static _Atomic uint64_t warm_ran;

static void warm(void *arg) {
  (void)arg;
  atomic_fetch_add_explicit(&warm_ran, 1, memory_order_relaxed);
}

static void fail(const char *what, int r) {
  fprintf(stderr, "outside_posts: %s: %s\n", what, weft_strerror(r));
  _exit(1);
}

static void *poster_main(void *arg) {
  struct poster *p = arg;
  struct variant *v = p->v;
  struct line *l = p->line;
  struct sample *s = p->samples;
  weft_rt *rt = v->rt;
  uint64_t n = v->per_thread, win = v->window;
  unsigned every = v->every, left = 1; /* the first post is a sample */
  atomic_fetch_add(&v->ready, 1);
  pthread_barrier_wait(&v->go);
  for (uint64_t i = 0; i < n; i++) {
    /* Reads the line the handlers write: only every 16th post. */
    if (i % 16 == 0 &&
        i - atomic_load_explicit(&l->ran, memory_order_relaxed) >= win)
      while (i - atomic_load_explicit(&l->ran, memory_order_relaxed) > win / 2)
        sched_yield();
    int r;
    if (--left == 0) {
      left = every;
      s->posted_ns = bench_now_ns();
      r = weft_post_rt(rt, sampled, s++);
    } else {
      r = weft_post_rt(rt, plain, l);
    }
    if (r)
      fail("weft_post_rt", r);
  }
  p->finished_ns = bench_now_ns();
  atomic_fetch_add(&v->finished, 1);
  return NULL;
}

static void *watchdog_main(void *arg) {
  (void)arg;
  while (!atomic_load(&all_done)) {
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);
    uint64_t start = atomic_load(&phase_start_ns);
    if (!start || bench_now_ns() - start < WATCHDOG_NS)
      continue;
    struct variant *v = atomic_load(&current);
    fprintf(stderr, "outside_posts: watchdog: a variant is not done 60 s "
                    "after it began\n");
    if (v) {
      uint64_t ran = 0;
      for (unsigned i = 0; i < v->threads; i++)
        ran += atomic_load(&v->lines[i].ran);
      fprintf(stderr,
              "outside_posts: %u posters, %u finished posting, %llu of "
              "%llu handlers ran, warm-up %llu\n",
              v->threads, atomic_load(&v->finished), (unsigned long long)ran,
              (unsigned long long)(v->per_thread * v->threads),
              (unsigned long long)atomic_load(&warm_ran));
    }
    _exit(1);
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest rank of sorted v[0..n), p in (0, 1]. */
static uint64_t rank(const uint64_t *v, size_t n, double p) {
  size_t k = (size_t)(p * (double)n);
  if ((double)k < p * (double)n)
    k++;
  if (k == 0)
    k = 1;
  return v[(k < n ? k : n) - 1];
}

/* Voluntary context switches (a thread blocked: a futex wait on a lock, a
 * worker parking) of the process, less the calling thread's. */
static long others_switches(void) {
  struct rusage all, self;
  getrusage(RUSAGE_SELF, &all);
  getrusage(RUSAGE_THREAD, &self);
  return all.ru_nvcsw - self.ru_nvcsw;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void measure(unsigned workers, unsigned threads, uint64_t per_thread,
                    unsigned every, uint64_t inflight, unsigned *used,
                    struct result *res) {
  atomic_store(&phase_start_ns, bench_now_ns());
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = workers;
  cfg.eager_workers = workers; /* 0: one per CPU, which is all of them */
  struct variant v;
  memset(&v, 0, sizeof(v));
  int r = weft_rt_create(&v.rt, &cfg);
  if (r)
    fail("weft_rt_create", r);
  *used = weft_rt_workers(v.rt);
  v.threads = threads;
  v.per_thread = per_thread;
  v.every = every;
  v.window = inflight / threads;
  size_t per = (size_t)((per_thread + every - 1) / every);
  v.lines = aligned_alloc(64, sizeof(*v.lines) * threads);
  v.posters = aligned_alloc(64, sizeof(*v.posters) * threads);
  struct sample *samples = calloc(per * threads, sizeof(*samples));
  uint64_t *lat = malloc(sizeof(*lat) * per * threads);
  double *dur = malloc(sizeof(*dur) * threads);
  if (!v.lines || !v.posters || !samples || !lat || !dur) {
    fprintf(stderr, "outside_posts: out of memory\n");
    exit(1);
  }
  bench_prefault(samples, sizeof(*samples) * per * threads);
  for (unsigned i = 0; i < threads; i++) {
    atomic_init(&v.lines[i].ran, 0);
    atomic_init(&v.lines[i].done_ns, 0);
    v.lines[i].target = per_thread;
    struct poster *p = &v.posters[i];
    p->v = &v;
    p->line = &v.lines[i];
    p->samples = samples + per * i;
    p->finished_ns = 0;
    for (size_t j = 0; j < per; j++)
      p->samples[j].line = p->line;
  }
  atomic_store(&current, &v);

  /* Warm-up, untimed: as many posts as may be in flight, from this thread
   * (also outside), so the node pool holds them before the run. */
  atomic_store(&warm_ran, 0);
  for (uint64_t i = 0; i < inflight; i++)
    if ((r = weft_post_rt(v.rt, warm, NULL)))
      fail("weft_post_rt", r);
  while (atomic_load(&warm_ran) < inflight)
    sleep_us(200);

  pthread_barrier_init(&v.go, NULL, threads + 1);
  for (unsigned i = 0; i < threads; i++)
    if ((r = pthread_create(&v.posters[i].th, NULL, poster_main,
                            &v.posters[i]))) {
      fprintf(stderr, "outside_posts: pthread_create: %s\n", strerror(r));
      exit(1);
    }
  while (atomic_load(&v.ready) < threads)
    sleep_us(100);
  long sw0 = others_switches();
  v.t0 =
      bench_now_ns(); /* every poster waits at the barrier: this releases it */
  pthread_barrier_wait(&v.go);

  uint64_t end = 0;
  for (unsigned i = 0; i < threads; i++) {
    uint64_t d;
    while (
        !(d = atomic_load_explicit(&v.lines[i].done_ns, memory_order_acquire)))
      sleep_us(200);
    /* The handlers' sample writes, released by their fetch_adds. */
    (void)atomic_load_explicit(&v.lines[i].ran, memory_order_acquire);
    if (d > end)
      end = d;
  }
  res->switches = (double)(others_switches() - sw0);
  for (unsigned i = 0; i < threads; i++)
    pthread_join(v.posters[i].th, NULL);
  pthread_barrier_destroy(&v.go);

  weft_stats st;
  weft_rt_stats(v.rt, &st);
  res->stalls = st.total.stalls;
  res->handoffs = st.total.handoffs;
  res->parks = st.total.parks;
  atomic_store(&current, NULL);
  weft_rt_destroy(v.rt);

  size_t n = 0;
  for (unsigned i = 0; i < threads; i++) {
    for (size_t j = 0; j < per; j++) {
      struct sample *s = &v.posters[i].samples[j];
      lat[n++] = s->ran_ns - s->posted_ns;
    }
    dur[i] = (double)(v.posters[i].finished_ns - v.t0) / 1e6;
  }
  qsort(lat, n, sizeof(*lat), cmp_u64);
  res->posts_per_sec =
      (double)(per_thread * threads) / (double)(end - v.t0) * 1e9;
  res->p50_us = (double)rank(lat, n, 0.50) / 1e3;
  res->p99_us = (double)rank(lat, n, 0.99) / 1e3;
  res->max_us = (double)lat[n - 1] / 1e3;
  res->poster_p50_ms = bench_median(dur, (int)threads);
  free(dur);
  free(lat);
  free(samples);
  free(v.posters);
  free(v.lines);
}

static const char *const peer_keys[] = {
    "posts_per_sec", "delay_p50_us",    "delay_p99_us",   "delay_max_us",
    "poster_p50_ms", "posts_per_sec_1", "delay_p50_us_1", "delay_p99_us_1",
    "switches",      "switches_1",
};
#define NPEER (sizeof(peer_keys) / sizeof(peer_keys[0]))

/* Runs the Asio peer; fills its figures in peer_keys' order, or returns
 * false. */
static bool run_peer(unsigned workers, unsigned threads, uint64_t per_thread,
                     unsigned every, uint64_t inflight, double out[NPEER]) {
  char path[4096], w[16], t[16], p[32], k[16], f[32];
  if (!bench_peer_path("asio_outside_posts", path, sizeof(path)))
    return false;
  snprintf(w, sizeof(w), "%u", workers);
  snprintf(t, sizeof(t), "%u", threads);
  snprintf(p, sizeof(p), "%llu", (unsigned long long)per_thread);
  snprintf(k, sizeof(k), "%u", every);
  snprintf(f, sizeof(f), "%llu", (unsigned long long)inflight);
  char *argv[] = {path, "--workers", w, "--threads",  t, "--posts",
                  p,    "--every",   k, "--inflight", f, NULL};
  char *buf = bench_capture(argv);
  if (!buf)
    return false;
  const char *json = bench_last_line(buf);
  bool ok = true;
  for (size_t i = 0; i < NPEER && ok; i++)
    ok = bench_json_num(json, peer_keys[i], &out[i]);
  free(buf);
  return ok;
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (!s || *s < '0' || *s > '9')
    return false;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 10);
  if (errno || *end || x < lo || x > hi)
    return false;
  *out = x;
  return true;
}

static int usage(void) {
  fprintf(stderr,
          "usage: outside_posts [--workers W] [--threads T] [--posts P] "
          "[--every K] [--inflight N] [--no-peer]\n"
          "  --workers W   shards, 0..256 (0: one per CPU; default 0)\n"
          "  --threads T   posting threads, 1..1024 (default 64)\n"
          "  --posts P     posts per posting thread, 1..10^8 (default 62500;"
          " T * P at most 10^8)\n"
          "  --every K     one post in K is a delay sample, 1..10^6 "
          "(default 64)\n"
          "  --inflight N  posts posted and not yet run, in all, at most; "
          "at least 16 * T (default 65536)\n");
  return 2;
}

int main(int argc, char **argv) {
  uint64_t workers = 0, threads = 64, posts = 62500, every = 64,
           inflight = 65536;
  bool peer = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    bool ok;
    if (!strcmp(a, "--no-peer")) {
      peer = false;
      continue;
    } else if (!strcmp(a, "--workers"))
      ok = parse_u64(val, 0, 256, &workers);
    else if (!strcmp(a, "--threads"))
      ok = parse_u64(val, 1, 1024, &threads);
    else if (!strcmp(a, "--posts"))
      ok = parse_u64(val, 1, 100000000, &posts);
    else if (!strcmp(a, "--every"))
      ok = parse_u64(val, 1, 1000000, &every);
    else if (!strcmp(a, "--inflight"))
      ok = parse_u64(val, 16, 100000000, &inflight);
    else
      ok = false;
    if (!ok)
      return usage();
    i++;
  }
  if (threads * posts > 100000000 || inflight < 16 * threads) {
    fprintf(stderr, "outside_posts: T * P at most 10^8, --inflight at "
                    "least 16 * T\n");
    return usage();
  }

  pthread_t wd;
  if (pthread_create(&wd, NULL, watchdog_main, NULL)) {
    fprintf(stderr, "outside_posts: cannot start the watchdog\n");
    return 1;
  }
  unsigned used, used1;
  struct result many, one;
  measure((unsigned)workers, (unsigned)threads, posts, (unsigned)every,
          inflight, &used, &many);
  measure((unsigned)workers, 1, posts * threads, (unsigned)every, inflight,
          &used1, &one);
  atomic_store(&all_done, true);
  pthread_join(wd, NULL);

  double a[NPEER];
  bool have = peer && run_peer(used, (unsigned)threads, posts, (unsigned)every,
                               inflight, a);
  uint64_t total = posts * threads;
  printf("weft: %llu posters x %llu posts into %u workers: %.2f M posts/s, "
         "delay p50 %.1f us p99 %.1f us max %.1f us, posters p50 %.1f ms "
         "(blocked %.0f times, stalls %llu, handoffs %llu, parks %llu)\n",
         (unsigned long long)threads, (unsigned long long)posts, used,
         many.posts_per_sec / 1e6, many.p50_us, many.p99_us, many.max_us,
         many.poster_p50_ms, many.switches, (unsigned long long)many.stalls,
         (unsigned long long)many.handoffs, (unsigned long long)many.parks);
  printf("weft: 1 poster x %llu posts: %.2f M posts/s, delay p50 %.1f us "
         "p99 %.1f us (blocked %.0f times)\n",
         (unsigned long long)total, one.posts_per_sec / 1e6, one.p50_us,
         one.p99_us, one.switches);
  if (have) {
    printf("asio: %llu posters x %llu posts into %u threads: %.2f M "
           "posts/s, delay p50 %.1f us p99 %.1f us max %.1f us, posters p50 "
           "%.1f ms (blocked %.0f times)\n",
           (unsigned long long)threads, (unsigned long long)posts, used,
           a[0] / 1e6, a[1], a[2], a[3], a[4], a[8]);
    printf("asio: 1 poster x %llu posts: %.2f M posts/s, delay p50 %.1f us "
           "p99 %.1f us (blocked %.0f times)\n",
           (unsigned long long)total, a[5] / 1e6, a[6], a[7], a[9]);
  } else if (peer) {
    printf("asio: peer not run (not built, or it failed)\n");
  }
  printf("{\"bench\":\"outside_posts\",\"threads\":%llu,\"workers\":%u,"
         "\"posts\":%llu,\"posts_per_thread\":%llu,\"every\":%llu,"
         "\"inflight\":%llu,\"posts_per_sec\":%.0f,\"delay_p50_us\":%.2f,"
         "\"delay_p99_us\":%.2f,\"delay_max_us\":%.2f,"
         "\"poster_p50_ms\":%.2f,\"posts_per_sec_1\":%.0f,"
         "\"delay_p50_us_1\":%.2f,\"delay_p99_us_1\":%.2f,"
         "\"switches\":%.0f,\"switches_1\":%.0f,\"stalls\":%llu,"
         "\"handoffs\":%llu",
         (unsigned long long)threads, used, (unsigned long long)total,
         (unsigned long long)posts, (unsigned long long)every,
         (unsigned long long)inflight, many.posts_per_sec, many.p50_us,
         many.p99_us, many.max_us, many.poster_p50_ms, one.posts_per_sec,
         one.p50_us, one.p99_us, many.switches, one.switches,
         (unsigned long long)many.stalls, (unsigned long long)many.handoffs);
  if (have) {
    for (size_t i = 0; i < NPEER; i++)
      printf(",\"asio_%s\":%.*f", peer_keys[i],
             strstr(peer_keys[i], "_us") || strstr(peer_keys[i], "_ms") ? 2 : 0,
             a[i]);
    printf(",\"posts_per_sec_vs_asio\":%.3f,\"delay_p99_vs_asio\":%.3f",
           many.posts_per_sec / a[0], many.p99_us / a[2]);
  }
  printf("}\n");
  return 0;
}
