/*
 * test_tcp_write_nocb: writes without a callback keep the order and the
 * errors of the writes around them. net.h: a write's "fn (may be NULL)
 * runs once when they are sent or failed"; writes leave in the order
 * they were queued; after a failed write, later writes fail with -EPIPE.
 * With epoll, such a write into a connection with nothing queued goes to
 * the socket within the call and holds no write state (tcp_send.c,
 * send_at_once); the rest of a partial send is queued like any write.
 *
 * in_order: an accepted connection with small socket buffers, a peer
 * that does not read yet. On the strand, writes of 1 byte to 96 KiB, one
 * or two iovecs each, mostly without a callback, 768 KiB in all (scaled,
 * below the default high watermark), then a shutdown. Checked:
 *   - with epoll, a first callback-less write of 1 byte leaves nothing
 *     queued, and one of 96 KiB that the socket cannot take whole leaves
 *     some of it queued (0 < queued < 96 KiB);
 *   - the peer reads every byte in order, then EOF;
 *   - each callback runs once, with 0, in the order of its writes.
 * after_reset: the peer resets the connection; the server's read sees
 * the error. A callback-less write then returns 0 (it fails as a queued
 * write does, with nobody to tell), and a write made once it has left the
 * queue returns -EPIPE, its callback never called.
 * Run on both backends.
 */
#include "testutil.h"

#define SMALL_BUF 4096
#define BIG_LEN (96u << 10)
#define SEED 0x0CB5

typedef struct nocb {
  weft_tcp *c;
  unsigned char *data;
  size_t total, off;
  uint64_t writes_cb, cbs;
  size_t q_small, q_big; /* queued after the first two writes */
  int rc_first, rc_next;
  unsigned turns;
  tu_event done; /* +1 when every callback ran and the FIN was asked */
} nocb;

static void written(void *arg, weft_tcp *c, int status) {
  nocb *n = arg;
  (void)c;
  TU_CHECKF(status == 0, "write callback %" PRIu64 ": %d (%s)", n->cbs, status,
            weft_strerror(status));
  n->cbs++;
  if (n->cbs == n->writes_cb && n->off == n->total)
    tu_event_add(&n->done, 1);
}

/* Writes [off, off + len) of the stream, as one iovec or two. */
static int write_part(nocb *n, size_t len, bool cb, bool two) {
  struct iovec v[2] = {{n->data + n->off, two ? len / 2 : len},
                       {n->data + n->off + len / 2, len - len / 2}};
  int rc = weft_tcp_writev(n->c, v, two ? 2 : 1, cb ? written : NULL, n);
  TU_CHECKF(rc == 0, "write at %zu: %d (%s)", n->off, rc, weft_strerror(rc));
  n->off += len;
  n->writes_cb += cb;
  return rc;
}

static void writer(void *arg) {
  nocb *n = arg;
  write_part(n, 1, false, false);
  n->q_small = weft_tcp_queued(n->c);
  write_part(n, BIG_LEN, false, false);
  n->q_big = weft_tcp_queued(n->c);
  static const size_t lens[] = {1, 700, 4096, 9000, 65536, 3, 96u << 10};
  for (unsigned i = 0; n->off < n->total; i++) {
    size_t len = lens[i % (sizeof lens / sizeof lens[0])];
    if (len > n->total - n->off)
      len = n->total - n->off;
    if (write_part(n, len, i % 3 == 1, i % 2 == 1 && len > 1))
      return;
  }
  TU_CHECK_RC(weft_tcp_shutdown(n->c), 0);
  if (n->cbs == n->writes_cb)
    tu_event_add(&n->done, 1);
}

static void accepted(void *arg, weft_tcp *c) {
  atomic_store((_Atomic(weft_tcp *) *)arg, c);
}

/* A runtime of two workers and a connection accepted from a plain peer
 * (*fd), with small socket buffers on both sides if shrink; n cleared. */
static weft_rt *setup(nocb *n, bool shrink, int *fd, weft_listener **l) {
  static _Atomic(weft_tcp *) slot;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  tu_assert_backend(rt);
  memset(n, 0, sizeof *n);
  tu_event_init(&n->done);
  atomic_store(&slot, NULL);
  uint16_t port = tu_tcp_listen(rt, NULL, accepted, (void *)&slot, l);
  if (shrink && tu_shrink_listener_bufs(port, SMALL_BUF, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)port);
  *fd = tu_sock_connect(port, shrink ? SMALL_BUF : 0, 0);
  assert_true(*fd >= 0);
  uint64_t end = tu_deadline_ns(TU_WAIT_S);
  while (!atomic_load(&slot) && tu_now_ns() < end)
    tu_sleep_ms(1);
  assert_non_null(atomic_load(&slot));
  n->c = atomic_load(&slot);
  return rt;
}

static void closed(void *arg, weft_tcp *c) {
  (void)c;
  tu_event_add(arg, 1);
}

static void listener_done(void *arg) { tu_event_add(arg, 1); }

static void finish(weft_rt *rt, weft_tcp *c, weft_listener *l, int fd) {
  tu_event ev;
  tu_event_init(&ev);
  tu_tcp_set_data(c, &ev, closed);
  tu_assert_rc(weft_tcp_close(c, 0), 0);
  tu_event_wait(&ev, 1, "the close callback");
  tu_assert_rc(weft_listener_close(l, listener_done, &ev), 0);
  tu_event_wait(&ev, 2, "the listener's done callback");
  close(fd);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_event_destroy(&ev);
}

static void test_in_order(void **state) {
  (void)state;
  int fd;
  weft_listener *l;
  static nocb n;
  weft_rt *rt = setup(&n, true, &fd, &l);
  n.total = TU_SCALED(768u << 10, 256u << 10);
  n.data = malloc(n.total);
  assert_non_null(n.data);
  tu_pattern_fill(n.data, n.total, SEED, 0);
  tu_on_strand(weft_tcp_strand(n.c), writer, &n);
  uint64_t got = tu_recv_pattern(fd, SEED, n.total);
  tu_event_wait(&n.done, 1, "every write callback and the shutdown");
  assert_int_equal(got, n.total);
  assert_int_equal(n.cbs, n.writes_cb);
  if (weft_rt_backend(rt) == WEFT_BACKEND_EPOLL) {
    assert_int_equal(n.q_small, 0);
    if (n.q_big == 0 || n.q_big >= BIG_LEN)
      fail_msg("%zu of a %u-byte write queued: it did not go in part", n.q_big,
               BIG_LEN);
  }
  finish(rt, n.c, l, fd);
  tu_event_destroy(&n.done);
  free(n.data);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---- after_reset -------------------------------------------------------- */

static const char msg[] = "after the reset";
static tu_count g_late_cbs;

static void late_cb(void *arg, weft_tcp *c, int status) {
  (void)arg;
  (void)c;
  (void)status;
  atomic_fetch_add(&g_late_cbs, 1);
}

/* Once the failed write has left the queue (with io_uring its send fails
 * in a later turn), the next write is refused. */
static void next_turn(void *arg) {
  nocb *n = arg;
  if (weft_tcp_queued(n->c) && n->turns++ < 100000) {
    TU_CHECK_RC(weft_post(weft_tcp_strand(n->c), next_turn, n), 0);
    return;
  }
  n->rc_next = weft_tcp_write(n->c, msg, sizeof msg, late_cb, NULL);
  tu_event_add(&n->done, 1);
}

static void read_failed(void *arg, weft_tcp *c, long r) {
  nocb *n = arg;
  TU_CHECKF(r < 0, "the read after the reset returned %ld", r);
  n->rc_first = weft_tcp_write(c, msg, sizeof msg, NULL, NULL);
  TU_CHECK_RC(weft_post(weft_tcp_strand(c), next_turn, n), 0);
}

static void start_read(void *arg) {
  nocb *n = arg;
  static char rbuf[64];
  TU_CHECK_RC(weft_tcp_read(n->c, rbuf, sizeof rbuf, read_failed, n), 0);
}

static void test_after_reset(void **state) {
  (void)state;
  int fd;
  weft_listener *l;
  static nocb n;
  weft_rt *rt = setup(&n, false, &fd, &l);
  n.rc_first = n.rc_next = 1;
  tu_on_strand(weft_tcp_strand(n.c), start_read, &n);
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
  close(fd); /* RST */
  tu_event_wait(&n.done, 1, "the write in the turn after the read");
  assert_int_equal(n.rc_first, 0);
  assert_int_equal(n.rc_next, -EPIPE);
  finish(rt, n.c, l, -1);
  assert_int_equal(atomic_load(&g_late_cbs), 0);
  tu_event_destroy(&n.done);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_in_order),
      cmocka_unit_test(test_after_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
