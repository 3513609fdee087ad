/*
 * post - the cost of a post, three ways.
 *
 *  post_run_ns: one strand whose handler re-posts itself, on a one-worker
 *    runtime: the cost of one post plus one run on the same shard.
 *  pair_run_ns: the same on a two-worker runtime with two such strands,
 *    posted from outside; the wall time until both chains are done over
 *    the chain length. Each worker runs one chain (a worker with both
 *    leaves one to steal), so it is post_run_ns again unless the two
 *    workers slow each other down: through a shared cache line (with
 *    48-byte nodes, two neighbours in one line made it about four times
 *    post_run_ns; tests/test_pool_lines.c) or by both chains running on
 *    one worker.
 *  wake_p50_us / wake_p99_us: a thread outside the runtime posts to a
 *    runtime that is parked (it sleeps ~200 us between posts); the time from
 *    just before weft_post_rt to the handler's first instruction.
 *  tick_read_ns (tick_source): one read of the counter weft's flight
 *    recorder stamps its events with (src/trace.h, weft__ticks: the CPU's
 *    counter where it runs at a constant rate through sleep states, else
 *    CLOCK_MONOTONIC); the least of 5 runs of 10^6 reads. The recorder
 *    needs one per run-queue item at least, so over an item's time it is
 *    the floor of the recorder's cost (tools/bench-report, trace_overhead).
 *
 * The same workloads run on Asio (build/bench/peers/asio_post) when it was
 * built; the last line is one JSON object with both and the ratios.
 *   build/bench/post [--iterations N] [--samples M] [--no-peer]
 */
#include <weft.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

/* weft__ticks: the counter itself, as the library reads it */
#include "trace.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static volatile uint64_t tick_sink; /* keeps the reads */

/* After a runtime was created: weft__hist_calibrate has chosen the
 * counter (weft__trace_tsc). */
static double tick_read_ns(void) {
  double best = 0;
  for (int r = 0; r < 5; r++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < 1000000; i++)
      tick_sink += weft__ticks();
    double ns = (double)(now_ns() - t0) / 1e6;
    if (!r || ns < best)
      best = ns;
  }
  return best;
}

static void check(int r, const char *what) {
  if (r) {
    fprintf(stderr, "post: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

/* A line each: pair_run_ns's two chains are written by two workers. */
struct chain {
  _Alignas(64) weft_strand *s;
  long left;
  atomic_bool done;
};

static void repost(void *arg) {
  struct chain *c = arg;
  if (--c->left > 0)
    check(weft_post(c->s, repost, c), "weft_post");
  else
    atomic_store(&c->done, true);
}

/* n workers, n self-posting chains started from outside: wall time until
 * all are done over the chain length (post_run_ns: n = 1; pair: 2). */
static double chains_run_ns(long iterations, unsigned n) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = n;
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  struct chain c[2];
  for (unsigned i = 0; i < n; i++) {
    c[i].left = iterations;
    atomic_init(&c[i].done, false);
    check(weft_strand_create(rt, &c[i].s), "weft_strand_create");
  }
  uint64_t t0 = now_ns();
  for (unsigned i = 0; i < n; i++)
    check(weft_post(c[i].s, repost, &c[i]), "weft_post");
  for (unsigned i = 0; i < n; i++)
    while (!atomic_load(&c[i].done))
      usleep(1000);
  uint64_t t1 = now_ns();
  for (unsigned i = 0; i < n; i++)
    weft_strand_release(c[i].s);
  weft_rt_destroy(rt);
  return (double)(t1 - t0) / (double)iterations;
}

static _Atomic uint64_t handler_at;

static void stamp(void *arg) {
  (void)arg;
  atomic_store(&handler_at, now_ns());
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void wake_latency(int samples, double *p50, double *p99) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  uint64_t *lat = calloc((size_t)samples, sizeof(*lat));
  for (int i = 0; i < samples; i++) {
    usleep(200);
    atomic_store(&handler_at, 0);
    uint64_t t0 = now_ns();
    check(weft_post_rt(rt, stamp, NULL), "weft_post_rt");
    uint64_t t1;
    while ((t1 = atomic_load(&handler_at)) == 0)
      ;
    lat[i] = t1 - t0;
  }
  qsort(lat, (size_t)samples, sizeof(*lat), cmp_u64);
  *p50 = lat[samples / 2] / 1e3;
  *p99 = lat[(samples * 99) / 100] / 1e3;
  free(lat);
  weft_rt_destroy(rt);
}

/* Runs the Asio peer; fills its four figures, or returns false. */
static bool run_peer(long iterations, int samples, double out[4]) {
  char path[4096], it[32], sm[32];
  if (!bench_peer_path("asio_post", path, sizeof(path)))
    return false;
  snprintf(it, sizeof(it), "%ld", iterations);
  snprintf(sm, sizeof(sm), "%d", samples);
  char *argv[] = {path, "--iterations", it, "--samples", sm, NULL};
  char *buf = bench_capture(argv);
  if (!buf)
    return false;
  bool ok = bench_json_num(buf, "post_run_ns", &out[0]) &&
            bench_json_num(buf, "wake_p50_us", &out[1]) &&
            bench_json_num(buf, "wake_p99_us", &out[2]) &&
            bench_json_num(buf, "pair_run_ns", &out[3]);
  free(buf);
  return ok;
}

int main(int argc, char **argv) {
  long iterations = 10000000;
  int samples = 2000;
  bool peer = true;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
      iterations = atol(argv[++i]);
    else if (!strcmp(argv[i], "--samples") && i + 1 < argc)
      samples = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer"))
      peer = false;
    else {
      fprintf(stderr, "usage: post [--iterations N] [--samples M] "
                      "[--no-peer]\n");
      return 2;
    }
  }
  if (iterations < 1 || samples < 10) {
    fprintf(stderr, "post: --iterations >= 1, --samples >= 10\n");
    return 2;
  }
  double ns = chains_run_ns(iterations, 1), pair = chains_run_ns(iterations, 2),
         p50, p99;
  wake_latency(samples, &p50, &p99);
  double tick_ns = tick_read_ns();
  double a[4];
  bool have = peer && run_peer(iterations, samples, a);
  printf("weft: post+run %.1f ns, two chains on two workers %.1f ns, wake "
         "p50 %.1f us p99 %.1f us; a tick read %.1f ns\n",
         ns, pair, p50, p99, tick_ns);
  if (have)
    printf("asio: post+run %.1f ns, two chains on two threads %.1f ns, wake "
           "p50 %.1f us p99 %.1f us\n",
           a[0], a[3], a[1], a[2]);
  printf("{\"bench\":\"post\",\"iterations\":%ld,\"samples\":%d,"
         "\"post_run_ns\":%.2f,\"pair_run_ns\":%.2f,\"wake_p50_us\":%.2f,"
         "\"wake_p99_us\":%.2f,\"tick_read_ns\":%.2f,\"tick_source\":\"%s\"",
         iterations, samples, ns, pair, p50, p99, tick_ns,
         weft__trace_tsc ? "cpu" : "clock_gettime");
  if (have)
    printf(",\"asio_post_run_ns\":%.2f,\"asio_pair_run_ns\":%.2f,"
           "\"asio_wake_p50_us\":%.2f,\"asio_wake_p99_us\":%.2f,"
           "\"post_run_speedup\":%.2f,\"pair_run_speedup\":%.2f,"
           "\"wake_p50_speedup\":%.2f",
           a[0], a[3], a[1], a[2], a[0] / ns, a[3] / pair, a[1] / p50);
  printf("}\n");
  return 0;
}
