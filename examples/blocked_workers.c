/*
 * blocked_workers - weft's promise with every worker stuck: a timer keeps
 * ticking and a connection keeps echoing while all N workers sleep inside
 * handlers.
 *
 *   blocked_workers [--threads N] [--seconds S] [--period-ms P]
 *
 * A runtime of N workers (default: one per CPU) runs
 *  - a periodic timer of P ms (default 10) on a strand of its own, which
 *    notes the time of every tick;
 *  - an echo server (weft_tcp_listen on 127.0.0.1) with one client, a
 *    thread of this program that sends 64 bytes and waits for them to
 *    come back, over and over (demo_client.h).
 * After a warm-up, N handlers that sleep for S seconds (default 2) are
 * posted at once, each to a strand of its own: together they hold N
 * threads, as many as there are workers. The monitor notices each stuck
 * worker and hands its shard (run queue, timers, sockets) to a spare
 * thread, so the timer and the echoes should go on through the window.
 *
 * Prints one JSON line: the ticks inside the window against those due, the
 * timer's longest silence around it, the echoes completed inside it and
 * the slowest one, and the runtime's stall and handoff counts.
 * examples/peers/asio_blocked_workers.cpp runs the same workload on Asio;
 * tools/demo.sh runs both.
 */
#include <weft.h>

#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_client.h"

#define WARMUP_NS 300000000u /* before the window, and after it */
#define MAX_TICKS 100000

static void check(int r, const char *what) {
  if (r < 0) {
    fprintf(stderr, "blocked_workers: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

/* ---- the timer: touched only on its strand, read after shutdown -------- */

static uint64_t ticks[MAX_TICKS];
static unsigned nticks;

static void on_tick(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  if (status == 0 && nticks < MAX_TICKS)
    ticks[nticks++] = weft_now_ns();
}

/* ---- the sleepers ------------------------------------------------------- */

/* The sleepers are stalls by design: they are counted in the statistics
 * (weft_stats.total.stalls) instead of reported on stderr. */
static void on_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
}

static uint64_t window_end;

static void sleeper(void *arg) {
  (void)arg;
  dc_sleep_until(window_end);
}

/* ---- the echo server: one read or write in flight per connection ------- */

/* Per-connection state, freed in the close callback. */
struct conn {
  char buf[4096];
};

static void on_read(void *arg, weft_tcp *c, long n);

static void conn_free(void *data, weft_tcp *c) {
  (void)c;
  free(data);
}

static void on_written(void *arg, weft_tcp *c, int status) {
  struct conn *k = arg;
  if (status < 0 || weft_tcp_read(c, k->buf, sizeof(k->buf), on_read, k) < 0)
    weft_tcp_close(c, 0);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct conn *k = arg;
  if (n <= 0 || weft_tcp_write(c, k->buf, (size_t)n, on_written, k) < 0)
    weft_tcp_close(c, 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct conn *k = malloc(sizeof(*k));
  if (!k) {
    weft_tcp_close(c, 1);
    return;
  }
  weft_tcp_set_data(c, k, conn_free);
  weft_tcp_nodelay(c, 1);
  if (weft_tcp_read(c, k->buf, sizeof(k->buf), on_read, k) < 0)
    weft_tcp_close(c, 0);
}

/* ---- main --------------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr, "usage: blocked_workers [--threads N] [--seconds S] "
                  "[--period-ms P]\n");
  exit(2);
}

int main(int argc, char **argv) {
  unsigned threads = 0, period_ms = 10;
  double seconds = 2;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc)
      usage();
    if (!strcmp(argv[i], "--threads"))
      threads = (unsigned)dc_number(argv[i + 1], 0, WEFT_MAX_WORKERS, usage);
    else if (!strcmp(argv[i], "--seconds"))
      seconds = dc_number(argv[i + 1], 0.01, 60, usage);
    else if (!strcmp(argv[i], "--period-ms"))
      period_ms = (unsigned)dc_number(argv[i + 1], 1, 1000, usage);
    else
      usage();
  }

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  cfg.on_stall = on_stall;
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  threads = weft_rt_workers(rt);

  /* The timer, on a strand of its own. */
  weft_strand *ts;
  weft_timer *t;
  uint64_t period = (uint64_t)period_ms * 1000000u;
  check(weft_strand_create(rt, &ts), "weft_strand_create");
  check(weft_timer_create(rt, ts, &t), "weft_timer_create");
  check(weft_timer_start(t, period, period, on_tick, NULL), "weft_timer_start");

  /* The echo server and its client. */
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  weft_listener *l;
  unsigned alen = sizeof(a);
  check(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof(a), NULL, on_accept,
                        NULL, &l),
        "weft_tcp_listen");
  check(weft_listener_addr(l, (struct sockaddr *)&a, &alen),
        "weft_listener_addr");
  struct dc_echo echo = {.port = ntohs(a.sin_port)};
  echo.w0 = dc_now_ns() + WARMUP_NS;
  echo.w1 = echo.w0 + (uint64_t)(seconds * 1e9);
  echo.end = echo.w1 + WARMUP_NS;
  window_end = echo.w1;
  pthread_t client;
  if (pthread_create(&client, NULL, dc_echo_run, &echo) != 0) {
    fprintf(stderr, "blocked_workers: pthread_create failed\n");
    return 1;
  }

  /* The window: one sleeping handler per worker, each on its own strand. */
  dc_sleep_until(echo.w0);
  for (unsigned i = 0; i < threads; i++) {
    weft_strand *s;
    check(weft_strand_create(rt, &s), "weft_strand_create");
    check(weft_post(s, sleeper, NULL), "weft_post");
    weft_strand_release(s);
  }
  dc_sleep_until(echo.end);
  pthread_join(client, NULL);
  if (echo.err < 0) {
    fprintf(stderr, "blocked_workers: echo client: %s\n", strerror(-echo.err));
    return 1;
  }
  uint64_t stopped = dc_now_ns();

  weft_timer_destroy(t);
  weft_strand_release(ts);
  check(weft_listener_close(l, NULL, NULL), "weft_listener_close");
  check(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), "weft_rt_shutdown");
  weft_stats st;
  check(weft_rt_stats(rt, &st), "weft_rt_stats");
  check(weft_rt_destroy(rt), "weft_rt_destroy");

  /* Ticks inside the window, and the longest silence of the timer around
   * it: between two ticks, or from the last tick to the stop. */
  unsigned in_window = 0;
  uint64_t gap = 0, prev = 0;
  for (unsigned i = 0; i <= nticks; i++) {
    uint64_t cur = i < nticks ? ticks[i] : stopped;
    if (cur >= echo.w0 && cur <= echo.w1 && i < nticks)
      in_window++;
    if (prev && prev < echo.w1 && cur > echo.w0 && cur - prev > gap)
      gap = cur - prev;
    prev = cur;
  }
  printf("{\"demo\":\"blocked_workers\",\"impl\":\"weft\",\"threads\":%u,"
         "\"seconds\":%.2f,\"period_ms\":%u,\"ticks\":%u,\"ticks_due\":%llu,"
         "\"longest_gap_ms\":%.2f,\"echoes\":%llu,\"slowest_echo_ms\":%.2f,"
         "\"stalls\":%llu,\"handoffs\":%llu}\n",
         threads, seconds, period_ms, in_window,
         (unsigned long long)((echo.w1 - echo.w0) / period), (double)gap / 1e6,
         (unsigned long long)echo.echoes, (double)echo.slowest_ns / 1e6,
         (unsigned long long)st.total.stalls,
         (unsigned long long)st.total.handoffs);
  return 0;
}
