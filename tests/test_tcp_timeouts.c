/*
 * test_tcp_timeouts: weft_tcp_set_timeouts closes a connection whose idle,
 * read or write deadline passes; operations in flight complete with
 * -ETIMEDOUT, then the close callback runs, once; never before the
 * deadline.
 *
 *  - idle 40 ms, a read pending, a silent client: the read gets -ETIMEDOUT
 *    no sooner than 40 ms after the setting, then one close callback.
 *  - idle 200 ms with a client that sends a byte every 5 ms for 150 ms:
 *    not closed meanwhile; then silent: closed no sooner than 200 ms after
 *    the last byte was sent. (The idle time is long beside the gaps: a
 *    client thread held off the CPU for longer than it would be closed,
 *    which a loaded 2-CPU machine can do for 40 ms.) (weft counts from the
 * read's completion, which comes after the send and before the read's callback:
 * a stamp taken in the callback may be later than weft's.)
 *  - read 30 ms (no idle): a read with nothing to get fails with
 *    -ETIMEDOUT no sooner than 30 ms after it was made.
 *  - write 40 ms: a client that does not read, a 64 MiB write: the write
 *    completes with -ETIMEDOUT, then the close callback.
 *  - settings turned off (all 0) after idle 20 ms: still open after 100 ms.
 *  - bad input: NULL (-EINVAL), off the strand (-EPERM), after close
 *    (-EBADF).
 *  - an abortive close queued before the idle timeout's firing: the peer
 *    gets a reset and the read -ECANCELED (the user's close, not the
 *    timeout's).
 * No upper bound on lateness is asserted: the machine may be loaded.
 */
#include "testutil.h"

#define MS 1000000ull
#define BIG ((size_t)64 << 20)
#define ACTIVE_IDLE (200 * MS)

enum { V_IDLE, V_ACTIVE, V_READ, V_WRITE, V_OFF };

typedef struct srv {
  int variant;
  weft_tcp *c;
  uint64_t set_at, last_sent_at, read_started, failed_at;
  long read_status;
  int write_status;
  tu_count reads, closes, writes;
  tu_event closed, failed, ready;
  char buf[64];
  unsigned char *big;
} srv;

static void srv_close(void *data, weft_tcp *c) {
  srv *s = data;
  (void)c;
  atomic_fetch_add(&s->closes, 1);
  tu_event_add(&s->closed, 1);
}

static void srv_read(void *arg, weft_tcp *c, long n) {
  srv *s = arg;
  uint64_t now = weft_now_ns();
  atomic_fetch_add(&s->reads, 1);
  if (n > 0) {
    s->read_started = now;
    TU_CHECK_RC(weft_tcp_read(c, s->buf, sizeof(s->buf), srv_read, s), 0);
    return;
  }
  s->read_status = n;
  s->failed_at = now;
  tu_event_add(&s->failed, 1);
}

static void srv_written(void *arg, weft_tcp *c, int status) {
  srv *s = arg;
  (void)c;
  s->write_status = status;
  s->failed_at = weft_now_ns();
  atomic_fetch_add(&s->writes, 1);
  tu_event_add(&s->failed, 1);
}

static void srv_accept(void *arg, weft_tcp *c) {
  srv *s = arg;
  s->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, s, srv_close), 0);
  uint64_t idle = 0, rd = 0, wr = 0;
  switch (s->variant) {
  case V_IDLE:
    idle = 40 * MS;
    break;
  case V_ACTIVE:
    idle = ACTIVE_IDLE;
    break;
  case V_READ:
    rd = 30 * MS;
    break;
  case V_WRITE:
    wr = 40 * MS;
    break;
  default:
    idle = 20 * MS;
    break;
  }
  s->set_at = weft_now_ns();
  TU_CHECK_RC(weft_tcp_set_timeouts(c, idle, rd, wr), 0);
  if (s->variant == V_OFF)
    TU_CHECK_RC(weft_tcp_set_timeouts(c, 0, 0, 0), 0);
  if (s->variant == V_WRITE) {
    TU_CHECK_RC(weft_tcp_write(c, s->big, BIG, srv_written, s), 0);
  } else {
    s->read_started = weft_now_ns();
    TU_CHECK_RC(weft_tcp_read(c, s->buf, sizeof(s->buf), srv_read, s), 0);
  }
  tu_event_add(&s->ready, 1);
}

static void run_variant(int variant) {
  srv s;
  memset(&s, 0, sizeof(s));
  s.variant = variant;
  tu_event_init(&s.closed);
  tu_event_init(&s.failed);
  tu_event_init(&s.ready);
  if (variant == V_WRITE) {
    s.big = calloc(1, BIG);
    assert_non_null(s.big);
  }
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, srv_accept, &s, &l);
  int fd = tu_sock_connect(port, variant == V_WRITE ? 4096 : 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&s.ready, 1, "the accept callback");
  if (variant == V_ACTIVE) {
    for (int i = 0; i < 30; i++) {
      s.last_sent_at = weft_now_ns();
      assert_int_equal(tu_sock_send_all(fd, "x", 1), 0);
      tu_sleep_ms(5);
    }
    assert_int_equal(atomic_load(&s.closes), 0); /* kept alive */
  }
  if (variant == V_OFF) {
    tu_sleep_ms(100);
    assert_int_equal(atomic_load(&s.closes), 0);
    assert_int_equal(atomic_load(&s.reads), 0);
    tu_assert_rc(weft_tcp_close(s.c, 0), 0);
  }
  tu_event_wait(&s.closed, 1, "the close callback");
  tu_listener_close(l);
  assert_int_equal(weft_rt_destroy(rt), 0);
  close(fd);
  assert_int_equal(atomic_load(&s.closes), 1);
  switch (variant) {
  case V_IDLE:
    assert_int_equal(s.read_status, -ETIMEDOUT);
    assert_true(s.failed_at >= s.set_at + 40 * MS);
    break;
  case V_ACTIVE:
    assert_int_equal(s.read_status, -ETIMEDOUT);
    assert_true(atomic_load(&s.reads) > 1);
    assert_true(s.failed_at >= s.last_sent_at + ACTIVE_IDLE);
    break;
  case V_READ:
    assert_int_equal(s.read_status, -ETIMEDOUT);
    assert_true(s.failed_at >= s.read_started + 30 * MS);
    break;
  case V_WRITE:
    assert_int_equal(atomic_load(&s.writes), 1);
    assert_int_equal(s.write_status, -ETIMEDOUT);
    assert_true(s.failed_at >= s.set_at + 40 * MS);
    break;
  default:
    assert_int_equal(s.read_status, -ECANCELED); /* closed by the test */
    break;
  }
  print_message("[ INFO     ] variant %d: closed %.1f ms after the setting\n",
                variant, (double)(s.failed_at - s.set_at) / 1e6);
  free(s.big);
  tu_event_destroy(&s.closed);
  tu_event_destroy(&s.failed);
  tu_event_destroy(&s.ready);
}

static void test_idle(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: idle");
  run_variant(V_IDLE);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_active(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: idle, kept alive by traffic");
  run_variant(V_ACTIVE);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_read(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: read");
  run_variant(V_READ);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_write(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: write");
  run_variant(V_WRITE);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_off(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: turned off");
  run_variant(V_OFF);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------------------------- bad input */

typedef struct bad {
  tu_event closed;
  int after_close;
} bad;

static void bad_close(void *data, weft_tcp *c) {
  bad *b = data;
  (void)c;
  tu_event_add(&b->closed, 1);
}

static void bad_accept(void *arg, weft_tcp *c) {
  bad *b = arg;
  TU_CHECK_RC(weft_tcp_set_data(c, b, bad_close), 0);
  TU_CHECK_RC(weft_tcp_set_timeouts(NULL, MS, 0, 0), -EINVAL);
  TU_CHECK_RC(weft_tcp_close(c, 0), 0);
  b->after_close = weft_tcp_set_timeouts(c, MS, 0, 0);
}

static void accept_keep(void *arg, weft_tcp *c) {
  *(weft_tcp * _Atomic *)arg = c;
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("timeouts: bad input");
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  bad b;
  memset(&b, 0, sizeof(b));
  tu_event_init(&b.closed);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, bad_accept, &b, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&b.closed, 1, "the close callback");
  assert_int_equal(b.after_close, -EBADF);
  close(fd);
  tu_listener_close(l);
  weft_tcp *_Atomic kept = NULL;
  port = tu_tcp_listen(rt, NULL, accept_keep, (void *)&kept, &l);
  fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  while (!atomic_load(&kept))
    tu_sleep_ms(1);
  assert_int_equal(weft_tcp_set_timeouts(atomic_load(&kept), MS, 0, 0), -EPERM);
  tu_listener_close(l);
  assert_int_equal(weft_rt_destroy(rt), 0); /* closes it */
  close(fd);
  tu_event_destroy(&b.closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* An abortive close made on the strand while the idle timeout's firing
 * is already queued behind it: the close is the user's (the peer sees a
 * reset, the read gets -ECANCELED), not the timeout's (a FIN, and
 * -ETIMEDOUT). The strand is held by the accept callback past both
 * deadlines, so the user's timer (15 ms) and the idle timeout (20 ms)
 * queue their firings in that order. */
static weft_timer *g_ab_timer;
static weft_tcp *g_ab_conn;
static long g_ab_read = 1;
static int g_ab_close_rc = 1;
static tu_event g_ab_closed;
static char g_ab_buf[16];

static void ab_closed(void *data, weft_tcp *c) {
  (void)data;
  (void)c;
  weft_timer_destroy(g_ab_timer);
  tu_event_add(&g_ab_closed, 1);
}

static void ab_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  (void)c;
  g_ab_read = n;
}

static void ab_fire(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  if (!status)
    g_ab_close_rc = weft_tcp_close(g_ab_conn, 1);
}

static void ab_accept(void *arg, weft_tcp *c) {
  (void)arg;
  g_ab_conn = c;
  TU_CHECK_RC(weft_tcp_set_data(c, NULL, ab_closed), 0);
  uint64_t t0 = weft_now_ns();
  TU_CHECK_RC(
      weft_timer_create(weft_rt_current(), weft_tcp_strand(c), &g_ab_timer), 0);
  TU_CHECK_RC(weft_timer_start_at(g_ab_timer, t0 + 15 * MS, 0, ab_fire, NULL),
              0);
  TU_CHECK_RC(weft_tcp_set_timeouts(c, 20 * MS, 0, 0), 0);
  TU_CHECK_RC(weft_tcp_read(c, g_ab_buf, sizeof(g_ab_buf), ab_read, NULL), 0);
  while (weft_now_ns() < t0 + 40 * MS) {
  }
}

static void test_abort_before_timeout(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_event_init(&g_ab_closed);
  weft_rt *rt;
  tu_rt_create(&rt, 1, 0);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, ab_accept, NULL, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&g_ab_closed, 1, "the close callback");
  char b[8];
  ssize_t n = recv(fd, b, sizeof(b), 0);
  int err = errno;
  assert_int_equal(g_ab_close_rc, 0);
  assert_int_equal(g_ab_read, -ECANCELED);
  assert_int_equal(n, -1);
  assert_int_equal(err, ECONNRESET);
  close(fd);
  tu_listener_close(l);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_event_destroy(&g_ab_closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idle),
      cmocka_unit_test(test_active),
      cmocka_unit_test(test_read),
      cmocka_unit_test(test_write),
      cmocka_unit_test(test_off),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_abort_before_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
