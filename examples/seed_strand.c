/*
 * seed_strand - the Boost.Asio strand test case that started weft (the
 * question "boost::asio reasoning behind num_implementations for
 * io_service::strand": a sleeping handler stalls unrelated strands), ported
 * to weft.
 *
 * W chains of work run on N threads: every handler counts itself, creates a
 * new Work with a new strand and posts its successor there. With
 * --blocking K, K more strands each get one handler that sleeps through the
 * whole measurement, on the same N threads (no thread is added). On Asio's
 * legacy strands the sleeper soon shares a strand implementation with the
 * chains and throughput collapses; on weft it must not.
 *
 * With no option it is the demo: weft and Asio (both strand kinds, when
 * bench/peers was built) unblocked and with one sleeper, as a table.
 * With options it is the benchmark build/bench/seed_strand: its last line
 * is one JSON object, with the peers' figures and the ratios, and a floor:
 * the same work with no runtime (each thread runs its share of the chains
 * in a loop: allocate the next Work, count on the shared counter, free the
 * last; no strands, no queues, no parking), against which weft's
 * unblocked rate is reported as a fraction.
 */
#include <weft.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../bench/benchutil.h"

/* On separate cache lines (the peer does the same): every handler writes
 * counter and reads running. */
static _Alignas(64) atomic_bool running;
static _Alignas(64) atomic_long counter;
static double block_limit_s;

struct work {
  weft_rt *rt;
  weft_strand *strand;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, int err) {
  fprintf(stderr, "seed_strand: %s: %s\n", what, weft_strerror(err));
  exit(1);
}

static void do_the_work(void *arg);

/* A new Work with a new strand, as the original does for every handler. */
static void start_the_work(weft_rt *rt) {
  struct work *w = malloc(sizeof(*w));
  if (!w)
    die("malloc", -ENOMEM);
  w->rt = rt;
  int r = weft_strand_create(rt, &w->strand);
  if (r == 0)
    r = weft_post(w->strand, do_the_work, w);
  if (r == -ESHUTDOWN) {
    if (w->strand)
      weft_strand_release(w->strand);
    free(w);
    return;
  }
  if (r)
    die("post", r);
}

static void do_the_work(void *arg) {
  struct work *w = arg;
  atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
  if (atomic_load_explicit(&running, memory_order_relaxed))
    start_the_work(w->rt);
  /* The shared_ptr of the original drops here. */
  weft_strand_release(w->strand);
  free(w);
}

static void blocking_work(void *arg) {
  (void)arg;
  double until = now_s() + block_limit_s;
  while (atomic_load(&running) && now_s() < until)
    usleep(10000);
}

struct opts {
  unsigned threads, work, blocking;
  double seconds;
  bool peers, no_monitor, compare_monitor;
  unsigned rounds;
};

/* Stalls are expected here (the sleeper, and handlers preempted on an
 * oversubscribed machine): count them instead of printing. */
static atomic_ulong stalls_seen;
static void on_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  atomic_fetch_add(&stalls_seen, 1);
}
static uint64_t last_handoffs;

/* Counts handlers for o->seconds, then stops the chains; handlers per
 * second over the span. */
static double measure(const struct opts *o) {
  long c0 = atomic_load(&counter);
  double t0 = now_s();
  usleep((useconds_t)(o->seconds * 1e6));
  long c1 = atomic_load(&counter);
  double t1 = now_s();
  atomic_store(&running, false);
  return (double)(c1 - c0) / (t1 - t0);
}

/* One run on weft; returns handlers per second. */
static double run_weft(const struct opts *o, unsigned blocking) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = o->threads;
  cfg.on_stall = on_stall;
  if (o->no_monitor)
    cfg.flags |= WEFT_CONFIG_NO_MONITOR;
  weft_rt *rt;
  int r = weft_rt_create(&rt, &cfg);
  if (r)
    die("weft_rt_create", r);
  atomic_store(&running, true);
  atomic_store(&counter, 0);
  block_limit_s = o->seconds + 1 > 5 ? o->seconds + 1 : 5;
  for (unsigned i = 0; i < o->work; i++)
    start_the_work(rt);
  weft_strand *blockers[64];
  for (unsigned i = 0; i < blocking; i++) {
    if ((r = weft_strand_create(rt, &blockers[i])) ||
        (r = weft_post(blockers[i], blocking_work, NULL)))
      die("blocking post", r);
    weft_strand_release(blockers[i]);
  }
  double rate = measure(o);
  if ((r = weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN)))
    die("weft_rt_shutdown", r);
  weft_stats st;
  weft_rt_stats(rt, &st);
  last_handoffs = st.total.handoffs;
  weft_rt_destroy(rt);
  return rate;
}

/* The floor's thread: its chains, each allocating its next Work, counting
 * and freeing its last, in turn, while running. */
static void *floor_thread(void *arg) {
  unsigned chains = (unsigned)(uintptr_t)arg;
  struct work **w = calloc(chains, sizeof(*w));
  if (!w)
    die("calloc", -ENOMEM);
  while (atomic_load_explicit(&running, memory_order_relaxed))
    for (unsigned i = 0; i < chains; i++) {
      struct work *next = malloc(sizeof(*next));
      if (!next)
        die("malloc", -ENOMEM);
      atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
      free(w[i]);
      w[i] = next;
    }
  for (unsigned i = 0; i < chains; i++)
    free(w[i]);
  free(w);
  return NULL;
}

/* The same work with no runtime, on o->threads threads (fewer if there
 * are fewer chains); handlers (loop turns) per second. */
static double run_floor(const struct opts *o) {
  pthread_t t[WEFT_MAX_WORKERS];
  /* No thread without a chain: as many chains in all as weft runs. */
  unsigned n = o->work < o->threads ? o->work : o->threads;
  atomic_store(&running, true);
  atomic_store(&counter, 0);
  for (unsigned i = 0; i < n; i++) {
    unsigned chains = o->work / n + (i < o->work % n);
    if (pthread_create(&t[i], NULL, floor_thread, (void *)(uintptr_t)chains))
      die("pthread_create", -EAGAIN);
  }
  double rate = measure(o);
  for (unsigned i = 0; i < n; i++)
    pthread_join(t[i], NULL);
  return rate;
}

/* Runs the Asio peer with the same settings; returns handlers/s or -1. */
static double run_peer(const struct opts *o, unsigned blocking, bool legacy) {
  char path[4096], th[16], sec[32], blk[16], wk[16];
  if (!bench_peer_path("asio_seed_strand", path, sizeof(path)))
    return -1;
  snprintf(th, sizeof(th), "%u", o->threads);
  snprintf(sec, sizeof(sec), "%.3f", o->seconds);
  snprintf(blk, sizeof(blk), "%u", blocking);
  snprintf(wk, sizeof(wk), "%u", o->work);
  char *argv[] = {path, "--threads",
                  th,   "--seconds",
                  sec,  "--blocking",
                  blk,  "--work",
                  wk,   legacy ? "--legacy" : NULL,
                  NULL};
  char *out = bench_capture(argv);
  double v = -1;
  if (out && !bench_json_num(out, "handlers_per_sec", &v))
    v = -1;
  free(out);
  return v;
}

static void usage(void) {
  fprintf(stderr, "usage: seed_strand [--threads N] [--seconds S] "
                  "[--blocking K] [--work W] [--no-peer] [--no-monitor]\n"
                  "                   [--compare-monitor] [--rounds R]\n"
                  "  no options: the demo table\n");
  exit(2);
}

static unsigned parse_uint(const char *s, unsigned max) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || v > max)
    usage();
  return (unsigned)v;
}

static void parse(int argc, char **argv, struct opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--no-peer")) {
      o->peers = false;
      continue;
    }
    if (!strcmp(a, "--no-monitor")) {
      o->no_monitor = true;
      continue;
    }
    if (!strcmp(a, "--compare-monitor")) {
      o->compare_monitor = true;
      continue;
    }
    if (i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--rounds"))
      o->rounds = parse_uint(v, 16);
    else if (!strcmp(a, "--threads"))
      o->threads = parse_uint(v, WEFT_MAX_WORKERS);
    else if (!strcmp(a, "--work"))
      o->work = parse_uint(v, 1000000);
    else if (!strcmp(a, "--blocking"))
      o->blocking = parse_uint(v, 64);
    else if (!strcmp(a, "--seconds")) {
      o->seconds = strtod(v, NULL);
      if (!(o->seconds > 0 && o->seconds < 3600))
        usage();
    } else
      usage();
  }
  if (!o->threads)
    usage();
  if (!o->work)
    o->work = o->threads;
  if (!o->rounds)
    o->rounds = 1;
}

static void fmt_rate(char *out, size_t n, double v) {
  if (v < 0)
    snprintf(out, n, "%s", "-");
  else
    snprintf(out, n, "%.0f", v);
}

static void demo(struct opts *o) {
  const char *names[3] = {"weft", "asio strand<executor>",
                          "asio io_context::strand"};
  double un[3], bl[3];
  printf("seed_strand: %u threads, %u chains, %.1f s per run; 'blocked' adds "
         "one strand whose handler sleeps, without adding a thread\n",
         o->threads, o->work, o->seconds);
  un[0] = run_weft(o, 0);
  bl[0] = run_weft(o, 1);
  for (int k = 1; k < 3; k++) {
    un[k] = run_peer(o, 0, k == 2);
    bl[k] = un[k] < 0 ? -1 : run_peer(o, 1, k == 2);
  }
  printf("\n%-26s %15s %15s %9s %12s\n", "runtime", "unblocked h/s",
         "blocked h/s", "blk/unblk", "weft/this");
  for (int k = 0; k < 3; k++) {
    char a[32], b[32], r[32], w[32];
    fmt_rate(a, sizeof(a), un[k]);
    fmt_rate(b, sizeof(b), bl[k]);
    snprintf(r, sizeof(r), un[k] > 0 && bl[k] >= 0 ? "%.3f" : "-",
             bl[k] / un[k]);
    snprintf(w, sizeof(w), k && un[k] > 0 && bl[k] > 0 ? "%.1fx / %.0fx" : "-",
             un[0] / un[k], bl[0] / bl[k]);
    printf("%-26s %15s %15s %9s %12s\n", names[k], a, b, r, w);
  }
  if (un[1] < 0)
    printf("\n(Asio peers not built: install libasio-dev and g++, then "
           "rebuild)\n");
  printf("\nweft keeps %.0f%% of its throughput with a sleeping handler.\n",
         100 * bl[0] / un[0]);
}

/* Unblocked throughput with the monitor on and off, alternating, 3 rounds;
 * the medians and the overhead. */
static void compare_monitor(struct opts *o) {
  double on[3], off[3];
  for (int i = 0; i < 3; i++) {
    o->no_monitor = false;
    on[i] = run_weft(o, 0);
    o->no_monitor = true;
    off[i] = run_weft(o, 0);
  }
  bench_median(on, 3); /* sorts them: [1] is the median */
  bench_median(off, 3);
  printf("monitor on %.0f h/s, off %.0f h/s (medians of 3)\n", on[1], off[1]);
  printf("{\"bench\":\"seed_strand_monitor\",\"threads\":%u,\"seconds\":%.2f,"
         "\"monitor_on_handlers_per_sec\":%.0f,"
         "\"monitor_off_handlers_per_sec\":%.0f,"
         "\"monitor_overhead_pct\":%.2f}\n",
         o->threads, o->seconds, on[1], off[1], 100 * (1 - on[1] / off[1]));
}

static void bench(struct opts *o) {
  if (o->compare_monitor) {
    compare_monitor(o);
    return;
  }
  /* Blocked and unblocked alternate, --rounds times; medians. On a small
   * machine the shared counter makes single runs swing by 2x. */
  double wr[16], wur[16], fr[16];
  uint64_t handoffs = 0, stalls = 0;
  for (unsigned r = 0; r < o->rounds; r++) {
    atomic_store(&stalls_seen, 0);
    wr[r] = run_weft(o, o->blocking);
    handoffs += last_handoffs;
    stalls += atomic_load(&stalls_seen);
    wur[r] = o->blocking ? run_weft(o, 0) : wr[r];
    fr[r] = run_floor(o);
  }
  double w = bench_median(wr, (int)o->rounds);
  double wu = bench_median(wur, (int)o->rounds);
  double fl = bench_median(fr, (int)o->rounds);
  double a = -1, al = -1, au = -1, alu = -1;
  if (o->peers) {
    a = run_peer(o, o->blocking, false);
    al = run_peer(o, o->blocking, true);
    au = o->blocking && a >= 0 ? run_peer(o, 0, false) : a;
    alu = o->blocking && al >= 0 ? run_peer(o, 0, true) : al;
  }
  double best = a > al ? a : al;
  printf("weft %.0f h/s (unblocked %.0f); asio strand %.0f, legacy %.0f; "
         "floor %.0f\n",
         w, wu, a, al, fl);
  printf("{\"bench\":\"seed_strand\",\"threads\":%u,\"seconds\":%.2f,"
         "\"blocking\":%u,\"work\":%u,\"rounds\":%u,"
         "\"handlers_per_sec\":%.0f,"
         "\"unblocked_handlers_per_sec\":%.0f,\"blocked_ratio\":%.4f,"
         "\"stalls\":%llu,\"handoffs\":%llu,\"monitor\":%s,"
         "\"floor_handlers_per_sec\":%.0f,\"ratio_vs_floor\":%.3f",
         o->threads, o->seconds, o->blocking, o->work, o->rounds, w, wu, w / wu,
         (unsigned long long)stalls, (unsigned long long)handoffs,
         o->no_monitor ? "false" : "true", fl, fl > 0 ? wu / fl : 0);
  if (best > 0)
    printf(",\"asio_strand_handlers_per_sec\":%.0f,"
           "\"asio_legacy_handlers_per_sec\":%.0f,"
           "\"asio_strand_blocked_ratio\":%.4f,"
           "\"asio_legacy_blocked_ratio\":%.4f,"
           "\"ratio_vs_best_asio\":%.3f",
           a, al, au > 0 ? a / au : 0, alu > 0 ? al / alu : 0, w / best);
  printf("}\n");
}

int main(int argc, char **argv) {
  struct opts o = {.threads = 8, .seconds = 3, .blocking = 0, .peers = true};
  if (argc == 1) {
    o.work = o.threads;
    o.seconds = 2;
    demo(&o);
    return 0;
  }
  parse(argc, argv, &o);
  bench(&o);
  return 0;
}
