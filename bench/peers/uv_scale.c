/*
 * uv_scale.c - what a timer costs on libuv when a loop holds a million, as
 * a peer of the timer part of weft's bench/scale.c (same protocol as it and
 * asio_scale.cpp; keep them in step).
 *
 * One loop on the main thread. Memory is the process's RSS
 * (/proc/self/statm: resident pages x page size), read before and after
 * the timers exist, over their count. Times are CLOCK_MONOTONIC, one clock
 * pair per batch, over the operations in it.
 *
 * For P pending = 10^3, 10^5, 10^6, those not above --timers (default
 * 10^6): a fresh loop; an array of P uv_timer_t allocated after the first
 * RSS reading (the handles are the timers' whole memory: libuv's timer heap
 * is intrusive), each uv_timer_init'ed and started one-shot
 * (uv_timer_start, repeat 0) with a timeout of deadline / 10^6 ms, the
 * deadline from 1 s to 1 h ahead, from a fixed-seed xorshift64: the same
 * sequence as weft's and asio_scale's, continued across the sizes.
 * timer_bytes: the RSS growth per timer at the largest P. Then rounds,
 * until at least 10^6 of each: a window of P/2 consecutive timers (windows
 * walk the array and wrap) is cancelled (uv_timer_stop each; libuv runs no
 * callback for a stopped timer, so there is nothing to poll), then started
 * again with new deadlines (uv_timer_start). timer_cancel_ns_1eK and
 * timer_start_ns_1eK: time summed over the windows, per operation. The
 * loop never runs while measuring, so no timer fires and its time (uv_now)
 * stays where it was. At the end every timer is stopped and closed, the
 * loop run until the closes are done, and the loop closed.
 *
 * Output: human lines, then as the last line one JSON object:
 *  {"impl":"libuv","timers":N,"timer_bytes":X,"timer_start_ns_1e3":X,
 *   "timer_cancel_ns_1e3":X,"timer_start_ns_1e5":X,"timer_cancel_ns_1e5":X,
 *   "timer_start_ns_1e6":X,"timer_cancel_ns_1e6":X}
 * Exit status: 0, 2 on bad flags, 1 on any other failure.
 */
#include <uv.h>

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../benchutil.h"

#define CYCLE_OPS 1000000u /* cancels (and starts) per pending count */
#define NSIZES 3

/* The pending counts measured: 10^3, 10^5, 10^6, those not above --timers. */
static const uint64_t sizes[NSIZES] = {1000, 100000, 1000000};
static const char *const size_names[NSIZES] = {"1e3", "1e5", "1e6"};

static uint64_t fired, closed;

static void die(const char *what, int r) {
  fprintf(stderr, "uv_scale: %s: %s\n", what, uv_strerror(r));
  exit(1);
}

/* Hands the allocator's free pages back to the kernel, so that memory an
 * earlier size freed is not reused, already resident, by the next one. */
static void trim(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

/* Resident bytes of this process. */
static double rss_bytes(void) {
  long r = bench_rss_bytes();
  if (r < 0) {
    fprintf(stderr, "uv_scale: cannot read /proc/self/statm\n");
    exit(1);
  }
  return (double)r;
}

/* The same deadlines as weft's bench/scale.c and asio_scale.cpp draw. */
static uint64_t rng = BENCH_SCALE_SEED;

static void on_timer(uv_timer_t *h) {
  (void)h;
  fired++;
}

static void on_close(uv_handle_t *h) {
  (void)h;
  closed++;
}

static void start(uv_timer_t *t) {
  int r =
      uv_timer_start(t, on_timer, bench_scale_deadline_ns(&rng) / 1000000u, 0);
  if (r)
    die("uv_timer_start", r);
}

static void usage(FILE *f) {
  fprintf(f, "usage: uv_scale [--timers N]\n"
             "  --timers N  the largest pending count measured, of 10^3, "
             "10^5, 10^6\n"
             "              (1000..10^9, default 1000000)\n");
}

int main(int argc, char **argv) {
  uint64_t max = 1000000;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--timers") && i + 1 < argc)
      v = argv[++i];
    else if (!strncmp(a, "--timers=", 9))
      v = a + 9;
    char *end = NULL;
    errno = 0;
    unsigned long long x =
        v && *v != '-' && *v != '+' ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || errno || *end || x < 1000 || x > 1000000000) {
      if (v)
        fprintf(stderr, "uv_scale: bad value '%s' for --timers\n", v);
      else
        fprintf(stderr, "uv_scale: unknown or malformed argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
    max = x;
  }

  double bytes = 0, start_ns[NSIZES], cancel_ns[NSIZES];
  int n = 0;
  for (int k = 0; k < NSIZES && sizes[k] <= max; k++) {
    const uint64_t p = sizes[k], window = p / 2;
    uv_loop_t loop;
    int r = uv_loop_init(&loop);
    if (r)
      die("uv_loop_init", r);

    trim();
    double rss0 = rss_bytes();
    uv_timer_t *timers = malloc(p * sizeof(*timers));
    if (!timers)
      die("malloc", UV_ENOMEM);
    for (uint64_t i = 0; i < p; i++) {
      if ((r = uv_timer_init(&loop, &timers[i])))
        die("uv_timer_init", r);
      start(&timers[i]);
    }
    bytes = (rss_bytes() - rss0) / (double)p;

    uint64_t cancel = 0, restart = 0, ops = 0, base = 0;
    for (; ops < CYCLE_OPS; ops += window) {
      uint64_t t0 = bench_now_ns();
      for (uint64_t i = 0; i < window; i++)
        uv_timer_stop(&timers[(base + i) % p]);
      uint64_t t1 = bench_now_ns();
      for (uint64_t i = 0; i < window; i++)
        start(&timers[(base + i) % p]);
      uint64_t t2 = bench_now_ns();
      cancel += t1 - t0;
      restart += t2 - t1;
      base = (base + window) % p;
    }
    cancel_ns[k] = (double)cancel / (double)ops;
    start_ns[k] = (double)restart / (double)ops;
    n = k + 1;

    closed = 0;
    for (uint64_t i = 0; i < p; i++) {
      uv_timer_stop(&timers[i]);
      uv_close((uv_handle_t *)&timers[i], on_close);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    if (closed != p || fired != 0) {
      fprintf(stderr, "uv_scale: %llu of %llu timers closed, %llu fired\n",
              (unsigned long long)closed, (unsigned long long)p,
              (unsigned long long)fired);
      return 1;
    }
    if ((r = uv_loop_close(&loop)))
      die("uv_loop_close", r);
    free(timers);

    printf("libuv uv_timer_t (sizeof %zu), %llu pending: %.1f bytes; start "
           "%.1f ns, cancel %.1f ns; %llu ops each\n",
           sizeof(uv_timer_t), (unsigned long long)p, bytes, start_ns[k],
           cancel_ns[k], (unsigned long long)ops);
    fflush(stdout);
  }

  printf("{\"impl\":\"libuv\",\"timers\":%llu,\"timer_bytes\":%.2f",
         (unsigned long long)max, bytes);
  for (int k = 0; k < n; k++)
    printf(",\"timer_start_ns_%s\":%.2f,\"timer_cancel_ns_%s\":%.2f",
           size_names[k], start_ns[k], size_names[k], cancel_ns[k]);
  printf("}\n");
  return 0;
}
