/*
 * test_shutdown_matrix: every public call made while a shutdown runs, from
 * outside the runtime and from inside one of its handlers, in both modes,
 * returns only what weft.h documents for it.
 *
 * A runtime with a strand, a timer, a listener and an accepted connection
 * starts a NOWAIT shutdown while a handler holds the connection's strand
 * (so the shutdown is under way and cannot finish). Then the test thread
 * makes every call (outside), and the handler makes every call (inside,
 * on the connection's strand); each result is checked against the codes
 * weft.h lists for that call. Then the handler returns and the shutdown
 * must finish, with the connection's close callback run once.
 */
#include "testutil.h"

#define OK 1000 /* stands for 0 in the lists below: 0 ends a list */

typedef struct expect {
  const char *call;
  int rc;
  int allowed[6]; /* OK or negative errno; 0 ends */
} expect;

static tu_count g_bad;

static void check(const char *where, const char *call, int rc,
                  const int *allowed) {
  for (int i = 0; allowed[i]; i++)
    if (rc == (allowed[i] == OK ? 0 : allowed[i]))
      return;
  atomic_fetch_add(&g_bad, 1);
  print_error("%s, shutting down: %s returned %d (%s), not documented there\n",
              where, call, rc, weft_strerror(rc));
}

#define CHECK(where, call, ...)                                                \
  do {                                                                         \
    static const int allowed_[] = {__VA_ARGS__, 0};                            \
    check((where), #call, (call), allowed_);                                   \
  } while (0)

static void noop(void *arg) { (void)arg; }
static void on_timer(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)status;
  (void)missed;
}
static long job(void *arg) { return (long)(uintptr_t)arg; }
static void job_done(void *arg, long r) {
  (void)arg;
  (void)r;
}
static void on_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  (void)c;
  (void)n;
}
static void on_connect(void *arg, weft_tcp *c, int status) {
  (void)arg;
  (void)c;
  (void)status;
}
static void on_accept_none(void *arg, weft_tcp *c) {
  (void)arg;
  weft_tcp_close(c, 1);
}

typedef struct world {
  weft_rt *rt;
  weft_strand *s;
  weft_timer *t;
  weft_listener *l;
  weft_tcp *_Atomic conn;
  tu_count closes;
  atomic_bool go, done, started;
} world;

static world g_w;

/* Every call, from where (the test thread, or a handler on the
 * connection's strand). */
static void every_call(const char *where, bool inside) {
  world *w = &g_w;
  weft_strand *s2;
  weft_timer *t2;
  weft_tcp *c2;
  weft_listener *l2;
  weft_stats st;
  weft_shard_stats sst;
  weft_tcp *c = atomic_load(&w->conn);
  char buf[8];
  struct sockaddr_in a;
  tu_addr_loopback(&a, 1);
  CHECK(where, weft_post(w->s, noop, NULL), -ESHUTDOWN);
  CHECK(where, weft_post_ex(w->s, noop, noop, NULL), -ESHUTDOWN);
  CHECK(where, weft_post_rt(w->rt, noop, NULL), -ESHUTDOWN);
  CHECK(where, weft_post_rt_ex(w->rt, noop, noop, NULL), -ESHUTDOWN);
  CHECK(where, weft_strand_create(w->rt, &s2), -ESHUTDOWN);
  CHECK(where, weft_timer_create(w->rt, w->s, &t2), -ESHUTDOWN);
  CHECK(where, weft_timer_start(w->t, 1000000, 0, on_timer, NULL), -ESHUTDOWN);
  CHECK(where, weft_timer_start_at(w->t, 1, 0, on_timer, NULL), -ESHUTDOWN);
  CHECK(where, weft_timer_cancel(w->t), OK, -EALREADY);
  CHECK(where, weft_blocking(w->rt, job, NULL, NULL, job_done, NULL),
        -ESHUTDOWN);
  CHECK(where, weft_blocking_cancel(w->rt, 12345), -EALREADY);
  CHECK(where,
        weft_tcp_listen(w->rt, (struct sockaddr *)&a, sizeof(a), NULL,
                        on_accept_none, NULL, &l2),
        -ESHUTDOWN);
  CHECK(where,
        weft_tcp_connect(w->rt, NULL, (struct sockaddr *)&a, sizeof(a), 0,
                         on_connect, NULL, &c2),
        -ESHUTDOWN);
  if (inside) {
    CHECK(where, weft_tcp_read(c, buf, sizeof(buf), on_read, NULL), -ESHUTDOWN,
          -EBADF);
    CHECK(where, weft_tcp_write(c, "x", 1, NULL, NULL), -ESHUTDOWN, -EBADF,
          -EPIPE);
    CHECK(where,
          weft_tcp_read_until(c, buf, sizeof(buf), 0, "\n", 1, NULL, NULL),
          -ESHUTDOWN, -EBADF, -EINVAL);
    CHECK(where, weft_tcp_shutdown(c), -ESHUTDOWN, -EBADF);
    CHECK(where, weft_tcp_set_watermarks(c, 1, 2, NULL, NULL), OK);
    CHECK(where, weft_tcp_set_timeouts(c, 1000000, 0, 0), -ESHUTDOWN, -EBADF,
          OK);
    CHECK(where, weft_tcp_nodelay(c, 1), OK, -EBADF);
    CHECK(where, weft_rt_wait(w->rt, 0), -EDEADLK);
    CHECK(where, weft_rt_destroy(w->rt), -EDEADLK);
    CHECK(where, weft_rt_shutdown(w->rt, WEFT_SHUTDOWN_DRAIN), -EDEADLK);
    CHECK(where, weft_rt_shutdown(w->rt, WEFT_SHUTDOWN_NOWAIT), -EALREADY);
  } else {
    CHECK(where, weft_tcp_read(c, buf, sizeof(buf), on_read, NULL), -EPERM);
    CHECK(where, weft_tcp_write(c, "x", 1, NULL, NULL), -EPERM);
    CHECK(where, weft_tcp_shutdown(c), -EPERM);
    CHECK(where, weft_tcp_set_data(c, NULL, NULL), -EPERM);
    CHECK(where, weft_tcp_close(c, 0), -ESHUTDOWN);
    CHECK(where, weft_rt_wait(w->rt, 0), -ETIMEDOUT);
    CHECK(where, weft_rt_shutdown(w->rt, WEFT_SHUTDOWN_DRAIN), -EALREADY);
  }
  CHECK(where, weft_listener_close(w->l, NULL, NULL), OK, -EALREADY);
  CHECK(where, weft_rt_stats(w->rt, &st), OK);
  CHECK(where, weft_rt_shard_stats(w->rt, 0, &sst), OK);
  CHECK(where, weft_rt_shard_stats(w->rt, 99, &sst), -ERANGE);
}

/* Holds the connection's strand until told, then makes every call from
 * inside. */
static void holder(void *arg) {
  world *w = arg;
  atomic_store(&w->started, true);
  while (!atomic_load(&w->go))
    tu_sleep_ms(1);
  every_call("inside", true);
  atomic_store(&w->done, true);
}

static void on_closed(void *data, weft_tcp *c) {
  (void)c;
  atomic_fetch_add(&((world *)data)->closes, 1);
}

static void on_accept(void *arg, weft_tcp *c) {
  world *w = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, w, on_closed), 0);
  atomic_store(&w->conn, c);
}

static void run(int mode) {
  world *w = &g_w;
  memset(w, 0, sizeof(*w));
  atomic_store(&g_bad, 0);
  tu_rt_create(&w->rt, 2, 0);
  tu_strand_create(w->rt, &w->s);
  tu_assert_rc(weft_timer_create(w->rt, w->s, &w->t), 0);
  tu_assert_rc(weft_timer_start(w->t, 3600000000000ull, 0, on_timer, NULL), 0);
  uint16_t port = tu_tcp_listen(w->rt, NULL, on_accept, w, &w->l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  while (!atomic_load(&w->conn))
    tu_sleep_ms(1);
  tu_assert_rc(weft_post(weft_tcp_strand(atomic_load(&w->conn)), holder, w), 0);
  while (!atomic_load(&w->started))
    tu_sleep_ms(1);
  tu_assert_rc(weft_rt_shutdown(w->rt, mode | WEFT_SHUTDOWN_NOWAIT), 0);
  every_call("outside", false);
  atomic_store(&w->go, true);
  while (!atomic_load(&w->done))
    tu_sleep_ms(1);
  tu_assert_rc(weft_rt_wait(w->rt, (uint64_t)TU_WAIT_S * 1000000000u), 0);
  weft_timer_destroy(w->t);
  weft_strand_release(w->s);
  assert_int_equal(weft_rt_destroy(w->rt), 0);
  close(fd);
  assert_int_equal(atomic_load(&w->closes), 1);
  assert_int_equal(atomic_load(&g_bad), 0);
}

static void test_drain(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("shutdown matrix: drain");
  run(WEFT_SHUTDOWN_DRAIN);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_cancel(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("shutdown matrix: cancel");
  run(WEFT_SHUTDOWN_CANCEL);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_drain),
      cmocka_unit_test(test_cancel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
