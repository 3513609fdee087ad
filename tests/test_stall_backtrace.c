/*
 * test_stall_backtrace: a stall report carries the stuck thread's
 * backtrace, taken with weft_config.stall_signal, only from a thread that
 * computes; a blocked thread is never signalled and its report names its
 * system call instead.
 *
 *  - A handler that computes (spins on the clock) for 8 thresholds: the log
 *    hook gets one stall line naming it, then frame lines ("  #N ..."), one
 *    of which names the function it spins in, and nothing else.
 *  - The same with on_stall: weft_stall.frames holds that function.
 *  - A handler blocked in nanosleep for 8 thresholds: its sleep is not cut
 *    short (nanosleep returns 0, after its whole time), the stall line
 *    names the system call, and no frame line follows.
 *  - stall_signal -1: the stall line, no frame lines.
 *  - The application's own handler for the signal: weft leaves it (it is
 *    still the action, and runs when the test raises the signal), never
 *    sends the signal, says once at WEFT_LOG_INFO that backtraces are off,
 *    and stall lines still come, without frames.
 *  - stall_signal SIGKILL, SIGSEGV, 9999 or -2: weft_rt_create fails with
 *    -EINVAL.
 *
 * Each stuck handler stays inside until its report has come (bounded), so
 * a slow machine cannot make it return unreported. Nothing here measures
 * speed.
 */
#include "testutil.h"

#include <dlfcn.h>
#include <signal.h>

#define THRESHOLD_NS 20000000u         /* 20 ms */
#define STUCK_NS (8ull * THRESHOLD_NS) /* how long a handler is stuck */
#define MAXLINES 128

/* Every message the log hook got, in order. */
typedef struct msgs {
  pthread_mutex_t m;
  pthread_cond_t c;
  unsigned n;
  int level[MAXLINES];
  char line[MAXLINES][256];
  bool in_sleep_at_stall; /* the sleeper was in nanosleep at the report */
} msgs;

static msgs g_msgs = {.m = PTHREAD_MUTEX_INITIALIZER};
static atomic_uint g_reports; /* stall lines and on_stall calls */
static atomic_uint g_in_sleep;
static tu_count g_done;

static void msgs_reset(void) {
  pthread_mutex_lock(&g_msgs.m);
  g_msgs.n = 0;
  g_msgs.in_sleep_at_stall = false;
  pthread_mutex_unlock(&g_msgs.m);
  atomic_store(&g_reports, 0);
  atomic_store(&g_in_sleep, 0);
  atomic_store(&g_done, 0);
}

static void on_log(void *ctx, int level, const char *msg) {
  msgs *l = ctx;
  pthread_mutex_lock(&l->m);
  if (l->n < MAXLINES) {
    l->level[l->n] = level;
    snprintf(l->line[l->n], sizeof(l->line[0]), "%s", msg);
  }
  l->n++;
  if (strncmp(msg, "stall: ", 7) == 0) {
    l->in_sleep_at_stall = atomic_load(&g_in_sleep) != 0;
    atomic_fetch_add(&g_reports, 1);
    pthread_cond_broadcast(&l->c);
  }
  pthread_mutex_unlock(&l->m);
}

/* What the log says: stall lines, frame lines, and whether every frame
 * line follows the first stall line. */
typedef struct summary {
  unsigned stalls, frames, frames_before, named, info_off;
  int stall; /* index of the first stall line, -1: none */
} summary;

static summary summarize(const char *fn) {
  summary s = {.stall = -1};
  pthread_mutex_lock(&g_msgs.m);
  for (unsigned i = 0; i < g_msgs.n && i < MAXLINES; i++) {
    const char *l = g_msgs.line[i];
    print_message("[ LOG      ] %d: %s\n", g_msgs.level[i], l);
    if (strncmp(l, "stall: ", 7) == 0) {
      s.stalls++;
      if (s.stall < 0)
        s.stall = (int)i;
      assert_int_equal(g_msgs.level[i], WEFT_LOG_WARN);
    } else if (strncmp(l, "  #", 3) == 0) {
      s.frames++;
      s.frames_before += s.stall < 0;
      s.named += fn && strstr(l, fn) != NULL;
      assert_int_equal(g_msgs.level[i], WEFT_LOG_WARN);
    } else if (strstr(l, "without backtraces")) {
      s.info_off++;
      assert_int_equal(g_msgs.level[i], WEFT_LOG_INFO);
    }
  }
  assert_true(g_msgs.n <= MAXLINES);
  pthread_mutex_unlock(&g_msgs.m);
  return s;
}

static const char *stall_line(const summary *s) {
  assert_true(s->stall >= 0);
  return g_msgs.line[s->stall];
}

/* Not static and not inlined, and the test is linked with -rdynamic
 * (tests/CMakeLists.txt): a frame can name it. Computes for STUCK_NS,
 * then on until its report has come (bounded). */
void bt_spin_here(void);
__attribute__((noinline)) void bt_spin_here(void) {
  uint64_t t0 = tu_now_ns(), dl = tu_deadline_ns(TU_WAIT_S);
  uint64_t now = t0;
  while (now - t0 < STUCK_NS || (!atomic_load(&g_reports) && now < dl))
    now = tu_now_ns();
  TU_CHECKF(atomic_load(&g_reports) > 0, "no report while it computed");
}

void bt_spinner(void *arg);
void bt_spinner(void *arg) {
  (void)arg;
  bt_spin_here();
  atomic_fetch_add(&g_done, 1); /* after the call: no tail call */
}

/* Sleeps STUCK_NS in one nanosleep, which a signal would cut short
 * (EINTR); then waits, blocked, until its report has come. */
void bt_sleeper(void *arg);
void bt_sleeper(void *arg) {
  (void)arg;
  struct timespec ts = {(time_t)(STUCK_NS / 1000000000u),
                        (long)(STUCK_NS % 1000000000u)};
  atomic_store(&g_in_sleep, 1);
  uint64_t t0 = tu_now_ns();
  int rc = nanosleep(&ts, NULL);
  int err = errno;
  uint64_t t1 = tu_now_ns();
  atomic_store(&g_in_sleep, 0);
  TU_CHECKF(rc == 0, "nanosleep was cut short: %s", strerror(err));
  TU_CHECKF(t1 - t0 >= STUCK_NS, "slept %" PRIu64 " of %llu ns", t1 - t0,
            STUCK_NS);
  struct timespec dl = {.tv_sec =
                            (time_t)(tu_deadline_ns(TU_WAIT_S) / 1000000000u)};
  pthread_mutex_lock(&g_msgs.m);
  while (!atomic_load(&g_reports) &&
         pthread_cond_timedwait(&g_msgs.c, &g_msgs.m, &dl) == 0) {
  }
  pthread_mutex_unlock(&g_msgs.m);
  TU_CHECKF(atomic_load(&g_reports) > 0, "no report while it was inside");
  atomic_fetch_add(&g_done, 1);
}

static weft_rt *make_rt(int sig, int level, weft_stall_fn on_stall) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = THRESHOLD_NS;
  cfg.log_fn = on_log;
  cfg.log_ctx = &g_msgs;
  cfg.log_level = level;
  cfg.on_stall = on_stall;
  cfg.stall_signal = sig;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

/* Runs fn once as a handler of a fresh runtime, to its end. */
static void run_stuck(int sig, int level, weft_stall_fn on_stall, weft_fn fn) {
  msgs_reset();
  weft_rt *rt = make_rt(sig, level, on_stall);
  tu_assert_rc(weft_post_rt(rt, fn, NULL), 0);
  tu_wait_count(&g_done, 1, "the stuck handler");
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

/* ------------------------------------------------ a handler that computes */

static void test_computing_has_frames(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backtrace: a computing handler");
  run_stuck(0, WEFT_LOG_WARN, NULL, bt_spinner);
  summary s = summarize("bt_spin_here");
  assert_int_equal(s.stalls, 1);
  assert_non_null(strstr(stall_line(&s), "stall: bt_spinner ("));
  assert_int_equal(s.frames_before, 0);
  /* Under ThreadSanitizer the handler runs at the spinner's next
   * intercepted call (clock_gettime), from TSan's own frames: the
   * spinner's are still among the 32, further down. */
  assert_true(s.frames >= 1 && s.frames <= 32);
  assert_non_null(strstr(stall_line(&s), "; backtrace:"));
  if (!s.named)
    fail_msg("no frame names bt_spin_here");
  /* The stall line and its frames, in a row. */
  for (unsigned i = 1; i <= s.frames; i++)
    assert_int_equal(strncmp(g_msgs.line[s.stall + i], "  #", 3), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* on_stall: the frames as data, named here with dladdr. */
static atomic_uint g_named, g_nframes;

static void on_stall(const weft_stall *st, void *ctx) {
  (void)ctx;
  atomic_store(&g_nframes, st->nframes);
  for (unsigned i = 0; i < st->nframes; i++) {
    Dl_info info;
    if (dladdr(st->frames[i], &info) && info.dli_sname &&
        strcmp(info.dli_sname, "bt_spin_here") == 0)
      atomic_fetch_add(&g_named, 1);
  }
  atomic_fetch_add(&g_reports, 1);
}

static void test_on_stall_frames(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backtrace: on_stall gets the frames");
  atomic_store(&g_named, 0);
  atomic_store(&g_nframes, 0);
  run_stuck(0, WEFT_LOG_WARN, on_stall, bt_spinner);
  assert_int_equal(atomic_load(&g_reports), 1);
  assert_true(atomic_load(&g_nframes) >= 1);
  assert_true(atomic_load(&g_nframes) <= 32);
  assert_true(atomic_load(&g_named) >= 1);
  assert_int_equal(g_msgs.n, 0); /* on_stall instead of the log */
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* -------------------------------------------------- a blocked handler */

static void test_blocked_names_syscall(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backtrace: a handler blocked in nanosleep");
  run_stuck(0, WEFT_LOG_WARN, NULL, bt_sleeper);
  summary s = summarize(NULL);
  assert_int_equal(s.stalls, 1);
  assert_non_null(strstr(stall_line(&s), "stall: bt_sleeper ("));
  if (g_msgs.in_sleep_at_stall) {
    /* "nanosleep" or "clock_nanosleep", as the C library calls it. */
    assert_non_null(strstr(stall_line(&s), "; blocked in "));
    assert_non_null(strstr(stall_line(&s), "nanosleep"));
    assert_int_equal(s.frames, 0);
  } else {
    /* The monitor came only after the sleep (a starved machine): the
     * sleep's own checks above still hold. */
    print_message("[ INFO     ] reported after the sleep: %s\n",
                  stall_line(&s));
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------- turned off */

static void test_off(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backtrace: stall_signal -1");
  run_stuck(-1, WEFT_LOG_WARN, NULL, bt_spinner);
  summary s = summarize("bt_spin_here");
  assert_int_equal(s.stalls, 1);
  assert_non_null(strstr(stall_line(&s), "stall: bt_spinner ("));
  assert_int_equal(s.frames, 0);
  assert_null(strstr(stall_line(&s), "; backtrace"));
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------ the application's own handler */

static atomic_uint g_app_hits;

static void app_handler(int sig) {
  (void)sig;
  atomic_fetch_add(&g_app_hits, 1);
}

static void test_app_handler_kept(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backtrace: the application's handler");
  int sig = SIGRTMAX - 1; /* the default */
  struct sigaction sa, old, cur;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = app_handler;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(sig, &sa, &old), 0);
  atomic_store(&g_app_hits, 0);
  run_stuck(0, WEFT_LOG_INFO, NULL, bt_spinner);
  summary s = summarize("bt_spin_here");
  assert_int_equal(s.stalls, 1);
  assert_non_null(strstr(stall_line(&s), "stall: bt_spinner ("));
  assert_int_equal(s.frames, 0);
  assert_int_equal(s.info_off, 1);
  assert_int_equal(atomic_load(&g_app_hits), 0); /* weft sent nothing */
  assert_int_equal(sigaction(sig, NULL, &cur), 0);
  assert_true(!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == app_handler);
  assert_int_equal(raise(sig), 0);
  uint64_t dl = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&g_app_hits) && tu_now_ns() < dl)
    tu_sleep_ms(1);
  assert_int_equal(atomic_load(&g_app_hits), 1);
  assert_int_equal(sigaction(sig, &old, NULL), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------------------------- bad input */

static void test_bad_signal(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  weft_rt *rt = NULL;
  const int bad[] = {SIGKILL, SIGSTOP, SIGSEGV, SIGINT, 9999, -2, SIGRTMAX + 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cfg.stall_signal = bad[i];
    assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
    assert_null(rt);
  }
  /* Checked without a monitor too. */
  cfg.flags = WEFT_CONFIG_NO_MONITOR;
  cfg.stall_signal = SIGKILL;
  assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
}

int main(void) {
  tu_watchdog_start();
  pthread_condattr_t ca; /* the sleeper's wait is on CLOCK_MONOTONIC */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g_msgs.c, &ca);
  pthread_condattr_destroy(&ca);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_computing_has_frames),
      cmocka_unit_test(test_on_stall_frames),
      cmocka_unit_test(test_blocked_names_syscall),
      cmocka_unit_test(test_off),
      cmocka_unit_test(test_app_handler_kept),
      cmocka_unit_test(test_bad_signal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
