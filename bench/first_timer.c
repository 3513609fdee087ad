/*
 * first_timer - how late the very first timer of a fresh process fires.
 *
 * Each run is a fresh process (this program re-executed through
 * /proc/self/exe with a hidden --child flag), so nothing is warm: no
 * threads, no pools, no page of the clock, no kernel state of the process.
 *
 *  weft:  weft_rt_create with --threads workers, then at once a strand, a
 *         timer on that strand and weft_timer_start_at(now + --ms). Lateness
 *         = the handler's weft_now_ns() minus the deadline.
 *  floor: the kernel alone: PR_SET_TIMERSLACK 1 (as weft's threads), then
 *         clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) to now + --ms.
 *         Lateness = the clock after the sleep minus the deadline.
 *  asio:  build/bench/peers/asio_first_timer, one fresh process per run: an
 *         io_context run by --threads threads, a steady_timer of --ms on a
 *         strand; lateness = handler time minus the timer's expiry.
 *
 * Every figure is in microseconds; medians and maxima over --runs runs.
 *   build/bench/first_timer [--runs 20] [--ms 5] [--threads N] [--no-peer]
 * The last line is one JSON object.
 */
#include <weft.h>

#include <errno.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void check(int r, const char *what) {
  if (r) {
    fprintf(stderr, "first_timer: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

/* ---- children: one measurement each, printed as "late_ns create_ns" ---- */

struct shot {
  uint64_t deadline;
  uint64_t fired_at;
  sem_t done;
};

static void on_timer(void *arg, int status, uint64_t missed) {
  (void)missed;
  uint64_t now = weft_now_ns(); /* first thing: this is the measurement */
  struct shot *s = arg;
  if (status != 0)
    return;
  s->fired_at = now;
  sem_post(&s->done);
}

static int child_weft(unsigned threads, unsigned ms) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  struct shot s = {0};
  sem_init(&s.done, 0, 0);
  uint64_t t0 = mono_ns();
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  uint64_t t1 = mono_ns();
  weft_strand *st;
  weft_timer *t;
  check(weft_strand_create(rt, &st), "weft_strand_create");
  check(weft_timer_create(rt, st, &t), "weft_timer_create");
  s.deadline = weft_now_ns() + (uint64_t)ms * 1000000u;
  check(weft_timer_start_at(t, s.deadline, 0, on_timer, &s),
        "weft_timer_start_at");
  while (sem_wait(&s.done) != 0 && errno == EINTR)
    ;
  printf("%lld %llu\n", (long long)(s.fired_at - s.deadline),
         (unsigned long long)(t1 - t0));
  fflush(stdout);
  weft_timer_destroy(t);
  weft_strand_release(st);
  check(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), "weft_rt_shutdown");
  check(weft_rt_destroy(rt), "weft_rt_destroy");
  return 0;
}

static int child_floor(unsigned ms) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  uint64_t deadline = mono_ns() + (uint64_t)ms * 1000000u;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                        .tv_nsec = (long)(deadline % 1000000000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
  uint64_t now = mono_ns();
  printf("%lld 0\n", (long long)(now - deadline));
  fflush(stdout);
  return 0;
}

/* ---- parent ------------------------------------------------------------ */

enum kind { K_WEFT, K_FLOOR, K_ASIO };

/* One fresh-process measurement: lateness (and create time) in us. */
static bool one_run(enum kind k, const char *peer, unsigned ms,
                    unsigned threads, double *late_us, double *create_us) {
  char a_ms[16], a_th[16];
  snprintf(a_ms, sizeof(a_ms), "%u", ms);
  snprintf(a_th, sizeof(a_th), "%u", threads);
  char *argv[10];
  int n = 0;
  argv[n++] = k == K_ASIO ? (char *)peer : "/proc/self/exe";
  if (k != K_ASIO) {
    argv[n++] = "--child";
    argv[n++] = k == K_WEFT ? "weft" : "floor";
  }
  argv[n++] = "--ms";
  argv[n++] = a_ms;
  argv[n++] = "--threads";
  argv[n++] = a_th;
  argv[n] = NULL;
  char *out = bench_capture(argv);
  if (!out)
    return false;
  bool ok;
  if (k == K_ASIO) {
    ok = bench_json_num(out, "late_us", late_us);
    *create_us = 0;
  } else {
    long long late;
    unsigned long long create;
    ok = sscanf(out, "%lld %llu", &late, &create) == 2;
    if (ok) {
      *late_us = (double)late / 1e3;
      *create_us = (double)create / 1e3;
    }
  }
  free(out);
  return ok;
}

static unsigned cpus_allowed(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return (unsigned)CPU_COUNT(&set);
  return 1;
}

static void usage(void) {
  fprintf(stderr, "usage: first_timer [--runs R] [--ms M] [--threads N] "
                  "[--no-peer]\n");
}

int main(int argc, char **argv) {
  int runs = 20;
  unsigned ms = 5, threads = 0;
  bool peer = true;
  const char *child = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--runs") && i + 1 < argc)
      runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
      ms = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer"))
      peer = false;
    else if (!strcmp(argv[i], "--child") && i + 1 < argc)
      child = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  if (!threads)
    threads = cpus_allowed();
  if (runs < 1 || ms < 1 || ms > 10000 || threads > WEFT_MAX_WORKERS) {
    fprintf(stderr,
            "first_timer: --runs >= 1, --ms 1..10000, --threads "
            "1..%d\n",
            WEFT_MAX_WORKERS);
    return 2;
  }
  if (child) {
    if (!strcmp(child, "weft"))
      return child_weft(threads, ms);
    if (!strcmp(child, "floor"))
      return child_floor(ms);
    usage();
    return 2;
  }

  char pbuf[4096];
  const char *ppath =
      peer ? bench_peer_path("asio_first_timer", pbuf, sizeof(pbuf)) : NULL;
  double *late = calloc((size_t)runs, sizeof(double));
  double *create = calloc((size_t)runs, sizeof(double));
  double *flo = calloc((size_t)runs, sizeof(double));
  double *asio = calloc((size_t)runs, sizeof(double));
  if (!late || !create || !flo || !asio)
    return 1;
  bool have_asio = ppath != NULL;
  /* Interleaved, so that a slow phase of the machine hits all three. */
  for (int r = 0; r < runs; r++) {
    double dummy;
    if (!one_run(K_WEFT, NULL, ms, threads, &late[r], &create[r])) {
      fprintf(stderr, "first_timer: weft child failed\n");
      return 1;
    }
    if (!one_run(K_FLOOR, NULL, ms, threads, &flo[r], &dummy)) {
      fprintf(stderr, "first_timer: floor child failed\n");
      return 1;
    }
    if (have_asio && !one_run(K_ASIO, ppath, ms, threads, &asio[r], &dummy)) {
      fprintf(stderr, "first_timer: %s failed; no peer figures\n", ppath);
      have_asio = false;
    }
  }
  double late_med = bench_median(late, runs), late_max = late[runs - 1];
  double create_med = bench_median(create, runs), create_max = create[runs - 1];
  double flo_med = bench_median(flo, runs), flo_max = flo[runs - 1];
  double asio_med = 0, asio_max = 0;
  if (have_asio) {
    asio_med = bench_median(asio, runs);
    asio_max = asio[runs - 1];
  }
  printf("weft:  first %u ms timer late by median %.1f us, max %.1f us "
         "(%u workers; weft_rt_create median %.1f us, max %.1f us)\n",
         ms, late_med, late_max, threads, create_med, create_max);
  printf("floor: clock_nanosleep late by median %.1f us, max %.1f us\n",
         flo_med, flo_max);
  if (have_asio)
    printf("asio:  first %u ms steady_timer late by median %.1f us, max "
           "%.1f us (%u threads)\n",
           ms, asio_med, asio_max, threads);
  printf("{\"bench\":\"first_timer\",\"runs\":%d,\"ms\":%u,\"threads\":%u,"
         "\"late_median_us\":%.2f,\"late_max_us\":%.2f,"
         "\"create_median_us\":%.1f,\"create_max_us\":%.1f,"
         "\"floor_median_us\":%.2f,\"floor_max_us\":%.2f",
         runs, ms, threads, late_med, late_max, create_med, create_max, flo_med,
         flo_max);
  if (have_asio)
    printf(",\"asio_late_median_us\":%.2f,\"asio_late_max_us\":%.2f", asio_med,
           asio_max);
  printf(",\"median_minus_floor_us\":%.2f}\n", late_med - flo_med);
  free(late);
  free(create);
  free(flo);
  free(asio);
  return 0;
}
