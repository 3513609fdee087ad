/*
 * test_thread_slack: the runtime's threads keep their own timer slack,
 * whatever slack the thread that created the runtime had.
 *
 * The creating thread sets a slack of 5 ms (PR_SET_TIMERSLACK), which
 * every thread it creates inherits. The threads weft_rt_create starts are
 * then read in /proc/self/task/TID/timerslack_ns (the threads that existed
 * before the runtime, such as the test's watchdog, are left out):
 *  - the shard threads and the spare have weft_config.timer_slack_ns;
 *  - the monitor has a tenth of its tick (stall_threshold_ns / 20), so
 *    that its ticks, and with them the notice of a stall, are not stretched
 *    by the application's slack;
 *  - none kept the creator's 5 ms;
 *  - with WEFT_CONFIG_NO_MONITOR there is no monitor and no spare.
 * The spare and the monitor set their slack as they start, after
 * weft_rt_create returns: the test waits (bounded) for the figures.
 * Reading another thread's slack needs CAP_SYS_NICE: without it (not
 * root) the test says so and is skipped; CI runs as root.
 */
#include "testutil.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define CREATOR_SLACK 5000000ul
#define THREAD_SLACK 2000u
#define STALL_NS 2000000u /* tick 1 ms: the monitor's slack 100 us */
#define MONITOR_SLACK (STALL_NS / 20)
#define MAX_TIDS 256

struct tids {
  unsigned n;
  int tid[MAX_TIDS];
};

static void list_tids(struct tids *out) {
  out->n = 0;
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) && out->n < MAX_TIDS) {
    int tid = atoi(e->d_name);
    if (tid > 0)
      out->tid[out->n++] = tid;
  }
  closedir(d);
}

static bool has_tid(const struct tids *t, int tid) {
  for (unsigned i = 0; i < t->n; i++)
    if (t->tid[i] == tid)
      return true;
  return false;
}

static bool not_permitted;

/* The slack of thread tid, or -1 if it cannot be read (it exited, or
 * reading another thread's slack needs CAP_SYS_NICE: not_permitted). The
 * file is /proc/TID/timerslack_ns; /proc/self/task/TID has none. */
static long slack_of(int tid) {
  char path[64], buf[32];
  snprintf(path, sizeof path, "/proc/%d/timerslack_ns", tid);
  FILE *f = fopen(path, "r");
  if (!f) {
    if (errno == EPERM || errno == EACCES)
      not_permitted = true;
    return -1;
  }
  long v = -1;
  if (!fgets(buf, sizeof buf, f) || sscanf(buf, "%ld", &v) != 1)
    v = -1;
  fclose(f);
  return v;
}

struct want {
  const struct tids *before;
  unsigned threads, monitors; /* expected counts among the new threads */
  unsigned got_threads, got_monitors, got_creator, got_other;
};

/* The new threads' slack values match what is wanted. */
static bool slack_settled(void *ctx, char *buf, size_t len) {
  struct want *w = ctx;
  struct tids now;
  list_tids(&now);
  w->got_threads = w->got_monitors = w->got_creator = w->got_other = 0;
  for (unsigned i = 0; i < now.n; i++) {
    if (has_tid(w->before, now.tid[i]))
      continue;
    long v = slack_of(now.tid[i]);
    if (v == THREAD_SLACK)
      w->got_threads++;
    else if (v == MONITOR_SLACK)
      w->got_monitors++;
    else if (v == (long)CREATOR_SLACK)
      w->got_creator++;
    else if (v >= 0)
      w->got_other++;
  }
  snprintf(buf, len,
           "new threads with the runtime's slack %u (want %u), the monitor's "
           "%u (want %u), the creator's %u, other %u",
           w->got_threads, w->threads, w->got_monitors, w->monitors,
           w->got_creator, w->got_other);
  return w->got_threads == w->threads && w->got_monitors == w->monitors &&
         w->got_creator == 0 && w->got_other == 0;
}

static void ran(void *arg) { atomic_fetch_add((tu_count *)arg, 1); }

static void check(unsigned flags, unsigned threads, unsigned monitors) {
  struct tids before;
  list_tids(&before);
  unsigned long old = (unsigned long)prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  assert_int_equal(prctl(PR_SET_TIMERSLACK, CREATOR_SLACK, 0, 0, 0), 0);

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.timer_slack_ns = THREAD_SLACK;
  cfg.stall_threshold_ns = STALL_NS;
  cfg.flags = flags;
  weft_rt *rt;
  int rc = weft_rt_create(&rt, &cfg);
  assert_int_equal(prctl(PR_SET_TIMERSLACK, old, 0, 0, 0), 0);
  assert_int_equal(rc, 0);

  /* The runtime works as usual. */
  tu_count n = 0;
  assert_int_equal(weft_post_rt(rt, ran, &n), 0);
  tu_wait_count(&n, 1, "the handler posted");

  struct want w = {.before = &before, .threads = threads, .monitors = monitors};
  char seen[256];
  slack_settled(&w, seen, sizeof seen);
  if (not_permitted) {
    weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN);
    weft_rt_destroy(rt);
    print_message("test_thread_slack: SKIPPED: reading another thread's "
                  "/proc/TID/timerslack_ns needs CAP_SYS_NICE (run as root, "
                  "as CI does)\n");
    skip();
  }
  tu_wait_until(slack_settled, &w, "the runtime's threads' timer slack");

  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_with_monitor(void **state) {
  (void)state;
  tu_phase("2 shard threads, a spare and the monitor");
  check(0, 3, 1);
}

static void test_without_monitor(void **state) {
  (void)state;
  tu_phase("WEFT_CONFIG_NO_MONITOR: 2 shard threads only");
  check(WEFT_CONFIG_NO_MONITOR, 2, 0);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_with_monitor),
      cmocka_unit_test(test_without_monitor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
