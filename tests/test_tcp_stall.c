/*
 * test_tcp_stall.c - the promise for sockets: while every worker is stuck
 * in a handler (blocked in a syscall, or spinning), connections keep
 * echoing. The stuck handlers wait for the echoes to finish (bounded), so
 * the test asserts progress during the stall, not a speed.
 *
 * Every connection has read once before the stall, so with io_uring its
 * pending receive was submitted by a thread that is then stuck: its
 * completion still has to reach the spare thread that holds the shard now
 * (io_uring.c, tcp_recv.c: a completion is finished by its submitter).
 *
 * Reply, then stuck: with one worker, a handler writes its echo and posts
 * a handler that gets stuck to another strand, which the same thread runs
 * next. With io_uring the echo is a ring entry that leaves at the thread's
 * next kernel entry (tcp.c, send_submit), which the stuck handler delays:
 * the echo must still arrive while that handler runs (the monitor hands
 * the shard, ring included, to a spare, which submits it).
 */
#include "testutil.h"

#define WORKERS 2
#define CONNS 8
#define ROUNDS 20

struct econn {
  weft_tcp *c;
  char buf[256];
};

static tu_count g_closed;
static atomic_bool g_echo_done;
static tu_count g_stuck_returned;
static tu_count g_stuck_entered;

static void on_closed(void *arg, weft_tcp *c) {
  (void)c;
  free(arg);
  atomic_fetch_add(&g_closed, 1);
}

static void on_read(void *arg, weft_tcp *c, long n);

static void on_written(void *arg, weft_tcp *c, int status) {
  struct econn *e = arg;
  if (status == 0 && weft_tcp_read(c, e->buf, sizeof e->buf, on_read, e) == 0)
    return;
  weft_tcp_close(c, 0);
}

static void stuck(void *arg);
static weft_strand *g_stall_strand; /* reply, then stuck: its strand */

static void on_read(void *arg, weft_tcp *c, long n) {
  struct econn *e = arg;
  if (n > 0 && weft_tcp_write(c, e->buf, (size_t)n, on_written, e) == 0) {
    if (g_stall_strand && n >= 5 && memcmp(e->buf, "stall", 5) == 0)
      TU_CHECK_RC(weft_post(g_stall_strand, stuck, NULL), 0);
    return;
  }
  weft_tcp_close(c, 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct econn *e = calloc(1, sizeof *e);
  TU_CHECK(e != NULL);
  e->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, e, on_closed), 0); /* on_closed frees e */
  TU_CHECK_RC(weft_tcp_read(c, e->buf, sizeof e->buf, on_read, e), 0);
}

static int g_pipe[2]; /* written when the echoes are done */

/* Stuck until the echoes are done (at most TU_WAIT_S): in one blocking
 * call (poll on a pipe: the thread does not enter the kernel again until
 * then) or spinning, by arg. */
static void stuck(void *arg) {
  bool spin = arg != NULL;
  uint64_t end = tu_deadline_ns(TU_WAIT_S);
  atomic_fetch_add(&g_stuck_entered, 1);
  if (!spin) {
    struct pollfd p = {.fd = g_pipe[0], .events = POLLIN};
    while (!atomic_load(&g_echo_done) && tu_now_ns() < end)
      poll(&p, 1, TU_WAIT_S * 1000);
  }
  while (!atomic_load(&g_echo_done) && tu_now_ns() < end) {
  }
  atomic_fetch_add(&g_stuck_returned, 1);
}

static void echo_round(int *fds, int round) {
  for (int i = 0; i < CONNS; i++) {
    char msg[64], back[64];
    int len = snprintf(msg, sizeof msg, "conn %d round %d", i, round);
    assert_int_equal(tu_sock_send_all(fds[i], msg, (size_t)len), 0);
    assert_int_equal(tu_sock_recv_all(fds[i], back, (size_t)len), 0);
    assert_memory_equal(msg, back, (size_t)len);
  }
}

/* A runtime of workers threads, the counters reset, the pipe open. */
static weft_rt *setup(unsigned workers) {
  weft_rt *rt;
  tu_rt_create(&rt, workers, 0);
  tu_assert_backend(rt);
  atomic_store(&g_closed, 0);
  atomic_store(&g_echo_done, false);
  atomic_store(&g_stuck_returned, 0);
  atomic_store(&g_stuck_entered, 0);
  assert_int_equal(pipe(g_pipe), 0);
  return rt;
}

static void run(bool spin) {
  weft_rt *rt = setup(WORKERS);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, on_accept, NULL, &l);
  int fds[CONNS];
  for (int i = 0; i < CONNS; i++) {
    fds[i] = tu_sock_connect(port, 0, 0);
    assert_true(fds[i] >= 0);
  }
  tu_phase("echo before the stall");
  echo_round(fds, -1);

  tu_phase("every worker stuck");
  weft_strand *s[WORKERS];
  for (int i = 0; i < WORKERS; i++) {
    tu_strand_create(rt, &s[i]);
    assert_int_equal(weft_post(s[i], stuck, spin ? (void *)1 : NULL), 0);
  }
  /* Both running before the first echo: otherwise a worker that has not
   * taken its stuck handler yet could serve every echo, with no handoff
   * (seen under ASan once the receive got faster). */
  tu_wait_count(&g_stuck_entered, WORKERS, "every stuck handler to start");
  for (int r = 0; r < ROUNDS; r++)
    echo_round(fds, r);
  /* The stuck handlers return only after this: every round above
   * completed while they ran. */
  assert_int_equal(atomic_load(&g_stuck_returned), 0);
  atomic_store(&g_echo_done, true);
  assert_int_equal(write(g_pipe[1], "x", 1), 1);
  tu_wait_count(&g_stuck_returned, WORKERS, "stuck handlers return");
  close(g_pipe[0]);
  close(g_pipe[1]);

  for (int i = 0; i < CONNS; i++)
    close(fds[i]);
  tu_wait_count(&g_closed, CONNS, "server connections closed");
  for (int i = 0; i < WORKERS; i++)
    weft_strand_release(s[i]);
  assert_int_equal(weft_listener_close(l, NULL, NULL), 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_stats st;
  tu_stats(rt, &st);
  assert_true(st.total.handoffs >= 1);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_reply_then_stuck(void **state) {
  (void)state;
  weft_rt *rt = setup(1);
  tu_strand_create(rt, &g_stall_strand);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, on_accept, NULL, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_phase("reply, then stuck");
  char back[5];
  assert_int_equal(tu_sock_send_all(fd, "stall", 5), 0);
  assert_int_equal(tu_sock_recv_all(fd, back, 5), 0);
  assert_memory_equal(back, "stall", 5);
  /* The echo came while the stuck handler ran (it returns only after
   * this), or before it began. */
  assert_int_equal(atomic_load(&g_stuck_returned), 0);
  atomic_store(&g_echo_done, true);
  assert_int_equal(write(g_pipe[1], "x", 1), 1);
  tu_wait_count(&g_stuck_returned, 1, "the stuck handler returns");
  close(g_pipe[0]);
  close(g_pipe[1]);
  close(fd);
  tu_wait_count(&g_closed, 1, "server connection closed");
  weft_strand_release(g_stall_strand);
  g_stall_strand = NULL;
  assert_int_equal(weft_listener_close(l, NULL, NULL), 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  assert_int_equal(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_stuck_sleeping(void **state) {
  (void)state;
  run(false);
}

static void test_stuck_spinning(void **state) {
  (void)state;
  run(true);
}

/* ------------------------------------------- a report names the callback */

/* A read callback that sleeps 20 ms is reported naming it (weft_stall's
 * handler: "the function it is in"), not weft's socket handler that
 * called it. */
static atomic_uintptr_t g_named;
static tu_event g_slept_read;

static void name_stall(const weft_stall *st, void *ctx) {
  (void)ctx;
  uintptr_t none = 0;
  atomic_compare_exchange_strong(&g_named, &none, (uintptr_t)st->handler);
}

static char g_rbuf[16];

static void sleepy_read(void *arg, weft_tcp *c, long n) {
  (void)arg;
  (void)n;
  tu_sleep_ms(20);
  weft_tcp_close(c, 0);
  tu_event_add(&g_slept_read, 1);
}

static void accept_sleepy(void *arg, weft_tcp *c) {
  (void)arg;
  TU_CHECK_RC(weft_tcp_read(c, g_rbuf, sizeof(g_rbuf), sleepy_read, NULL), 0);
}

static void test_report_names_read_callback(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("a stall in a read callback names it");
  atomic_store(&g_named, 0);
  tu_event_init(&g_slept_read);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  cfg.stall_threshold_ns = 1000000;
  cfg.on_stall = name_stall;
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_sleepy, NULL, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  assert_int_equal(tu_sock_send_all(fd, "x", 1), 0);
  tu_event_wait(&g_slept_read, 1, "the sleepy read callback");
  tu_listener_close(l);
  assert_int_equal(weft_rt_destroy(rt), 0); /* the monitor has stopped */
  close(fd);
  assert_true(atomic_load(&g_named) == (uintptr_t)sleepy_read);
  tu_event_destroy(&g_slept_read);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stuck_sleeping),
      cmocka_unit_test(test_stuck_spinning),
      cmocka_unit_test(test_reply_then_stuck),
      cmocka_unit_test(test_report_names_read_callback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
