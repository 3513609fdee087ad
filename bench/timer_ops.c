/*
 * timer_ops - the cost of arming and disarming a timer: weft_timer_start
 * (1 s ahead) followed by weft_timer_cancel, in a loop, from a handler on
 * the runtime and from a thread outside it. Both land in the timing wheel of
 * the timer's home shard (O(1) insert and unlink under its lock).
 *   build/bench/timer_ops [--iterations N]
 * No peer: Asio's steady_timer cancel goes through the reactor (a handler
 * is queued per cancelled wait), which is a different operation.
 */
#include <weft.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long iterations = 2000000;
static weft_timer *timer;
static double in_handler_ns;
static atomic_bool done;

static void never(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)status;
  (void)missed;
}

static double loop(void) {
  uint64_t t0 = weft_now_ns();
  for (long i = 0; i < iterations; i++) {
    if (weft_timer_start(timer, 1000000000u, 0, never, NULL) ||
        weft_timer_cancel(timer)) {
      fprintf(stderr, "timer_ops: start/cancel failed\n");
      exit(1);
    }
  }
  return (double)(weft_now_ns() - t0) / (double)iterations;
}

/* In chunks of 2000, re-posting itself: one handler running the whole
 * loop would be a stall (over 1 ms) and see its shard handed off. */
static void from_handler(void *arg) {
  weft_strand *s = arg;
  static long left;
  static uint64_t t0;
  if (!t0) {
    t0 = weft_now_ns();
    left = iterations;
  }
  long n = left < 2000 ? left : 2000;
  for (long i = 0; i < n; i++)
    if (weft_timer_start(timer, 1000000000u, 0, never, NULL) ||
        weft_timer_cancel(timer))
      exit(1);
  left -= n;
  if (left > 0 && weft_post(s, from_handler, s) == 0)
    return;
  in_handler_ns = (double)(weft_now_ns() - t0) / (double)iterations;
  atomic_store(&done, true);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
      iterations = atol(argv[++i]);
    else {
      fprintf(stderr, "usage: timer_ops [--iterations N]\n");
      return 2;
    }
  }
  if (iterations < 1)
    iterations = 1;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt;
  weft_strand *s;
  if (weft_rt_create(&rt, &cfg) || weft_strand_create(rt, &s) ||
      weft_timer_create(rt, s, &timer)) {
    fprintf(stderr, "timer_ops: setup failed\n");
    return 1;
  }
  double outside_ns = loop();
  weft_post(s, from_handler, s);
  while (!atomic_load(&done))
    usleep(1000);
  weft_timer_destroy(timer);
  weft_strand_release(s);
  weft_rt_destroy(rt);
  printf("start+cancel: %.1f ns in a handler, %.1f ns from outside\n",
         in_handler_ns, outside_ns);
  printf("{\"bench\":\"timer_ops\",\"iterations\":%ld,"
         "\"start_cancel_ns\":%.2f,\"start_cancel_outside_ns\":%.2f}\n",
         iterations, in_handler_ns, outside_ns);
  return 0;
}
