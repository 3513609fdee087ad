/*
 * uv_timer_lateness.c - periodic timer lateness on libuv, as a peer of
 * weft's bench/timer_lateness.c.
 *
 * libuv is single-threaded: --threads N means N loops in N threads, loop j
 * owning every N-th timer (so each loop's deadlines stay spread evenly).
 * Each timer is a uv_timer_t with repeat = --period-us (a whole number of
 * milliseconds: libuv timers have 1 ms resolution), first deadlines spread
 * evenly over one period; the first firing is set to the first whole
 * millisecond of loop time at or after the deadline.
 *
 * Lateness is measured from the intended grid (first + j * period). libuv
 * re-arms a repeating timer from the loop time of its firing (loop time + 1
 * period), so a firing that comes late by a whole period shifts the timer
 * and skips the periods passed over, as weft's periodic timers do: each
 * firing is attributed to the latest grid point at or before the loop time
 * it was due at, and the grid points passed over are counted as missed, as
 * weft counts them. So lateness = the millisecond rounding of the due time
 * plus the loop's own delay. Never negative.
 *
 * --busy K: K uv_idle_t handles, spread over the loops, each doing ~1 us of
 * work per loop iteration. --blocked K: K one-shot handlers, spread over the
 * loops, that sleep through the measurement (each stalls its whole loop).
 * Threads keep the default timer slack.
 *
 * Samples after a 0.2 s warm-up, deadlines within --seconds; nearest-rank
 * percentiles. Last line: {"impl":"uv","p50_us":X,"p99_us":X,"max_us":X,
 * "samples":N,"missed":M}. --dist FILE appends the distribution's tail to
 * FILE (bench_write_tail). Exit status: 0, 2 on bad flags, 1 on failure.
 */
#include <uv.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../benchutil.h"

#define WARMUP_NS 200000000ull
#define LEAD_NS 20000000ull
#define MS 1000000ull

struct utimer {
  uv_timer_t h;
  uint64_t first, next, missed, due_ms;
  unsigned i;
};

struct loop {
  uv_loop_t loop;
  uv_timer_t stopper;
  pthread_t th;
  unsigned j;
};

static unsigned ntimers, nthreads, nbusy, nblocked;
static uint64_t period, t0, from, to, stop_at;
static size_t cap;
static int64_t *samples;
static uint32_t *counts;
static struct utimer *timers;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_timer(uv_timer_t *h) {
  uint64_t now = now_ns();
  struct utimer *t = (struct utimer *)h;
  uint64_t due = t->due_ms * MS;
  uint64_t j = due >= t->first ? (due - t->first) / period : 0;
  if (j < t->next)
    j = t->next;
  uint64_t d = t->first + j * period;
  if (d >= from && d < to) {
    t->missed += j - t->next;
    if (counts[t->i] < cap)
      samples[t->i * cap + counts[t->i]++] = (int64_t)(now - d);
  }
  t->next = j + 1;
  /* libuv has already re-armed it: its next due time in loop time. */
  t->due_ms = uv_now(h->loop) + uv_timer_get_due_in(h);
}

static void on_idle(uv_idle_t *h) {
  (void)h;
  uint64_t end = now_ns() + 1000;
  while (now_ns() < end)
    ;
}

static void on_blocked(uv_timer_t *h) {
  (void)h;
  while (now_ns() < stop_at)
    usleep(1000);
}

static void on_stop(uv_timer_t *h) { uv_stop(h->loop); }

static void die(const char *what, int r) {
  fprintf(stderr, "uv_timer_lateness: %s: %s\n", what, uv_strerror(r));
  exit(1);
}

static void *loop_thread(void *p) {
  struct loop *l = p;
  int r = uv_loop_init(&l->loop);
  if (r)
    die("uv_loop_init", r);
  uv_update_time(&l->loop);
  uint64_t base = uv_now(&l->loop);
  for (unsigned i = l->j; i < ntimers; i += nthreads) {
    struct utimer *t = &timers[i];
    t->due_ms = (t->first + MS - 1) / MS; /* loop time never runs ahead */
    if (t->due_ms < base)
      t->due_ms = base;
    uv_timer_init(&l->loop, &t->h);
    r = uv_timer_start(&t->h, on_timer, t->due_ms - base, period / MS);
    if (r)
      die("uv_timer_start", r);
  }
  for (unsigned k = l->j; k < nbusy; k += nthreads) {
    uv_idle_t *idle = malloc(sizeof(*idle));
    if (!idle || (r = uv_idle_init(&l->loop, idle)) ||
        (r = uv_idle_start(idle, on_idle)))
      die("uv_idle", idle ? r : UV_ENOMEM);
  }
  for (unsigned k = l->j; k < nblocked; k += nthreads) {
    uv_timer_t *b = malloc(sizeof(*b));
    if (!b || (r = uv_timer_init(&l->loop, b)) ||
        (r = uv_timer_start(b, on_blocked, 0, 0)))
      die("uv_timer (blocked)", b ? r : UV_ENOMEM);
  }
  uv_timer_init(&l->loop, &l->stopper);
  uv_timer_start(&l->stopper, on_stop, (stop_at + MS - 1) / MS - base, 0);
  uv_run(&l->loop, UV_RUN_DEFAULT);
  return NULL; /* the process exits next; handles are not closed */
}

static void usage(void) {
  fprintf(stderr, "usage: uv_timer_lateness [--timers T] [--period-us P] "
                  "[--seconds S] [--threads N] [--busy K] [--blocked K] "
                  "[--dist FILE]\n");
  exit(2);
}

static unsigned parse_uint(const char *s, unsigned long lo, unsigned long hi) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || *s == '-' || v < lo || v > hi)
    usage();
  return (unsigned)v;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  double seconds = 3;
  const char *dist = NULL;
  ntimers = 1000;
  nthreads = 2;
  period = MS;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc)
      usage();
    const char *a = argv[i], *v = argv[++i];
    if (!strcmp(a, "--timers"))
      ntimers = parse_uint(v, 1, 1000000);
    else if (!strcmp(a, "--period-us"))
      period = parse_uint(v, 10, 10000000) * 1000ull;
    else if (!strcmp(a, "--threads"))
      nthreads = parse_uint(v, 1, 1024);
    else if (!strcmp(a, "--busy"))
      nbusy = parse_uint(v, 0, 1024);
    else if (!strcmp(a, "--blocked"))
      nblocked = parse_uint(v, 0, 64);
    else if (!strcmp(a, "--dist") && *v)
      dist = v;
    else if (!strcmp(a, "--seconds")) {
      seconds = strtod(v, NULL);
      if (!(seconds >= 0.1 && seconds <= 600))
        usage();
    } else
      usage();
  }
  if (period % MS) {
    fprintf(stderr, "uv_timer_lateness: libuv timers have 1 ms resolution: "
                    "--period-us must be a multiple of 1000\n");
    return 2;
  }
  if (nthreads > ntimers)
    nthreads = ntimers;
  uint64_t len = (uint64_t)(seconds * 1e9);
  cap = len / period + 2;
  if ((double)ntimers * (double)cap > 2e8) {
    fprintf(stderr, "uv_timer_lateness: too many samples\n");
    return 2;
  }
  samples = malloc((size_t)ntimers * cap * sizeof(*samples));
  counts = calloc(ntimers, sizeof(*counts));
  timers = calloc(ntimers, sizeof(*timers));
  struct loop *loops = calloc(nthreads, sizeof(*loops));
  if (!samples || !counts || !timers || !loops)
    die("malloc", UV_ENOMEM);
  /* Faulted in now, not by the samples (timer_lateness.c, samples_init);
   * Asio's resize writes its samples first too. */
  bench_prefault(samples, (size_t)ntimers * cap * sizeof(*samples));
  t0 = now_ns() + LEAD_NS;
  from = t0 + WARMUP_NS;
  to = from + len;
  stop_at = to + LEAD_NS;
  for (unsigned i = 0; i < ntimers; i++) {
    timers[i].i = i;
    timers[i].first = t0 + (uint64_t)i * period / ntimers;
  }
  for (unsigned j = 0; j < nthreads; j++) {
    loops[j].j = j;
    if (pthread_create(&loops[j].th, NULL, loop_thread, &loops[j]))
      die("pthread_create", UV_EAGAIN);
  }
  for (unsigned j = 0; j < nthreads; j++)
    pthread_join(loops[j].th, NULL);
  size_t n = 0;
  uint64_t missed = 0;
  for (unsigned i = 0; i < ntimers; i++) {
    memmove(samples + n, samples + i * cap, counts[i] * sizeof(*samples));
    n += counts[i];
    missed += timers[i].missed;
  }
  if (!n) {
    fprintf(stderr, "uv_timer_lateness: no samples\n");
    return 1;
  }
  qsort(samples, n, sizeof(*samples), cmp_i64);
  double p50 = samples[n / 2] / 1e3, p99 = samples[n * 99 / 100] / 1e3,
         mx = samples[n - 1] / 1e3;
  FILE *f = dist ? fopen(dist, "a") : NULL;
  if (dist && !f)
    die(dist, uv_translate_sys_error(errno));
  if (f) {
    bench_write_tail(f, "uv", samples, n);
    if (fclose(f))
      die(dist, uv_translate_sys_error(errno));
  }
  printf("uv: p50 %.2f us, p99 %.2f us, max %.2f us, %zu samples, %llu "
         "missed\n",
         p50, p99, mx, n, (unsigned long long)missed);
  printf("{\"impl\":\"uv\",\"p50_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f,"
         "\"samples\":%zu,\"missed\":%llu}\n",
         p50, p99, mx, n, (unsigned long long)missed);
  return 0;
}
