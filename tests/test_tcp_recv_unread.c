/*
 * test_tcp_recv_unread: connections that receive but are not read. With
 * io_uring their bytes land in the shard's provided buffers (weft.h,
 * weft_stats.recv_bufs_held): a connection holds a few at most, and when
 * many such connections hold them all, the others still receive. Checked,
 * on both backends:
 *   - phase 1: HOGS_FEW peers send until their socket is full, to
 *     connections that read their 8-byte hello and then nothing more.
 *     recv_bufs_held stays under HOLD_BOUND per connection (without the
 *     cap it reaches a whole shard's ring of 128);
 *   - phase 2: HOGS_MANY more do the same, which is more than the rings
 *     hold: with io_uring, some receive finds no buffer (recv_nobufs), and
 *     an echo connection still answers every round;
 *   - phase 3: every unread connection reads to end of file: each gets
 *     every byte its peer sent, in order; afterwards no buffer is held.
 */
#include "testutil.h"

#define NWORKERS 2
#define HOGS_FEW 3
#define HOGS_MANY 40
#define HOGS (HOGS_FEW + HOGS_MANY)
#define SMALL_BUF 16384 /* the unread side's SO_RCVBUF (doubled: 32 KiB) */
/* The cap (8 buffers), plus what the receive takes in the pass that
 * crosses it and before the cancel lands: the socket's receive buffer
 * (32 KiB, 8 buffers) and what the peer's send buffer (the same) pushes
 * after it. Observed: 8-22 per connection. */
#define HOLD_BOUND 32
#define ECHO_ROUNDS 50
#define SEED 0x5EED

enum { K_HOG = 1, K_ECHO = 2 };

typedef struct sconn {
  weft_tcp *c;
  unsigned char hdr[8];
  size_t hdr_got;
  uint32_t kind, id;
  unsigned char buf[4096];
  uint64_t got;
  bool bad;
} sconn;

static sconn *g_hog[HOGS];
static tu_event g_hello; /* +1 per hello read */
static tu_event g_eof;   /* +1 per unread connection read to its end */
static tu_event g_closed;

static void closed(void *arg, weft_tcp *c) {
  (void)c;
  free(arg);
  tu_event_add(&g_closed, 1);
}

static void on_data(void *arg, weft_tcp *c, long n);

static void read_more(sconn *s) {
  int rc = weft_tcp_read(s->c, s->buf, sizeof s->buf, on_data, s);
  TU_CHECKF(rc == 0, "weft_tcp_read: %d (%s)", rc, weft_strerror(rc));
}

static void on_echoed(void *arg, weft_tcp *c, int status) {
  (void)c;
  sconn *s = arg;
  TU_CHECKF(status == 0, "echo write: %d (%s)", status, weft_strerror(status));
  read_more(s);
}

static void on_data(void *arg, weft_tcp *c, long n) {
  sconn *s = arg;
  if (s->kind == K_ECHO) {
    if (n <= 0) {
      weft_tcp_close(c, 0);
      return;
    }
    int rc = weft_tcp_write(c, s->buf, (size_t)n, on_echoed, s);
    TU_CHECKF(rc == 0, "echo weft_tcp_write: %d (%s)", rc, weft_strerror(rc));
    return;
  }
  TU_CHECKF(n >= 0, "unread connection %u: read %ld (%s)", s->id, n,
            weft_strerror((int)n));
  if (n > 0) {
    size_t ok = tu_pattern_check(s->buf, (size_t)n, SEED + s->id, s->got);
    TU_CHECKF(ok == (size_t)n, "unread connection %u: byte %" PRIu64 " differs",
              s->id, s->got + ok);
    s->got += (uint64_t)n;
    read_more(s);
    return;
  }
  tu_event_add(&g_eof, 1);
}

static void on_hello(void *arg, weft_tcp *c, long n) {
  sconn *s = arg;
  TU_CHECKF(n > 0, "hello: read %ld (%s)", n, weft_strerror((int)n));
  if (n <= 0)
    return;
  s->hdr_got += (size_t)n;
  if (s->hdr_got < sizeof s->hdr) {
    int rc = weft_tcp_read(c, s->hdr + s->hdr_got, sizeof s->hdr - s->hdr_got,
                           on_hello, s);
    TU_CHECK(rc == 0);
    return;
  }
  memcpy(&s->kind, s->hdr, 4);
  memcpy(&s->id, s->hdr + 4, 4);
  if (s->kind == K_HOG) {
    TU_CHECK(s->id < HOGS && g_hog[s->id] == NULL);
    if (s->id < HOGS)
      g_hog[s->id] = s; /* read again in phase 3 */
  } else {
    read_more(s);
  }
  tu_event_add(&g_hello, 1);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  sconn *s = calloc(1, sizeof *s);
  TU_CHECK(s != NULL);
  s->c = c;
  TU_CHECK_RC(weft_tcp_set_data(c, s, closed), 0); /* closed frees s */
  int rc = weft_tcp_read(c, s->hdr, sizeof s->hdr, on_hello, s);
  TU_CHECK(rc == 0);
}

static void resume(void *arg) { read_more(arg); }

static void listener_done(void *arg) { tu_event_add(arg, 1); }

/* A peer: hello, then as many pattern bytes as the socket takes without
 * blocking, then end of file. Returns the bytes sent after the hello. */
static uint64_t hog_fill(int fd, uint32_t id) {
  unsigned char hello[8];
  uint32_t kind = K_HOG;
  memcpy(hello, &kind, 4);
  memcpy(hello + 4, &id, 4);
  assert_int_equal(tu_sock_send_all(fd, hello, sizeof hello), 0);
  unsigned char buf[4096];
  uint64_t sent = 0;
  for (;;) {
    tu_pattern_fill(buf, sizeof buf, SEED + id, sent);
    ssize_t n = send(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n < 0)
      fail_msg("hog %u send: %s", id, strerror(errno));
    sent += (uint64_t)n;
  }
  assert_int_equal(shutdown(fd, SHUT_WR), 0);
  return sent;
}

/* Peers from..to-1: connected, filled, at end of file. */
static void connect_hogs(uint16_t port, uint32_t from, uint32_t to, int *fds,
                         uint64_t *sent) {
  for (uint32_t i = from; i < to; i++) {
    fds[i] = tu_sock_connect(port, 0, SMALL_BUF);
    assert_true(fds[i] >= 0);
    sent[i] = hog_fill(fds[i], i);
  }
}

static weft_stats stats(weft_rt *rt) {
  weft_stats st;
  memset(&st, 0, sizeof st);
  tu_assert_rc(weft_rt_stats(rt, &st), 0);
  return st;
}

/* The most buffers held over a few looks, 10 ms apart. */
static uint64_t held_max(weft_rt *rt) {
  uint64_t m = 0;
  for (int i = 0; i < 20; i++) {
    weft_stats st = stats(rt);
    if (st.recv_bufs_held > m)
      m = st.recv_bufs_held;
    tu_sleep_ms(10);
  }
  return m;
}

static void echo_rounds(int fd) {
  for (int r = 0; r < ECHO_ROUNDS; r++) {
    char msg[100], back[100];
    memset(msg, 'a' + r % 26, sizeof msg);
    assert_int_equal(tu_sock_send_all(fd, msg, sizeof msg), 0);
    assert_int_equal(tu_sock_recv_all(fd, back, sizeof back), 0);
    assert_memory_equal(msg, back, sizeof msg);
  }
}

static void test_recv_unread(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_event_init(&g_hello);
  tu_event_init(&g_eof);
  tu_event_init(&g_closed);
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  bool uring = weft_rt_backend(rt) == WEFT_BACKEND_URING;
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, on_accept, NULL, &l);
  if (tu_shrink_listener_bufs(port, 0, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)port);

  static int fds[HOGS];
  static uint64_t sent[HOGS];
  tu_phase("a few unread connections");
  connect_hogs(port, 0, HOGS_FEW, fds, sent);
  tu_event_wait(&g_hello, HOGS_FEW, "the hellos of the first connections");
  uint64_t held = held_max(rt);
  print_message("[ INFO     ] %d unread connections hold at most %" PRIu64
                " buffers\n",
                HOGS_FEW, held);
  assert_true(held <= (uint64_t)HOGS_FEW * HOLD_BOUND);
  if (!uring)
    assert_int_equal(held, 0);

  tu_phase("more unread connections than the rings hold");
  connect_hogs(port, HOGS_FEW, HOGS, fds, sent);
  tu_event_wait(&g_hello, HOGS, "the hellos of every unread connection");
  weft_stats st = stats(rt);
  print_message("[ INFO     ] %d unread connections: %" PRIu64
                " buffers held, %" PRIu64 " receives found none\n",
                HOGS, st.recv_bufs_held, st.recv_nobufs);
  if (uring)
    assert_true(st.recv_nobufs >= 1);
  int efd = tu_sock_connect(port, 0, 0);
  assert_true(efd >= 0);
  unsigned char hello[8];
  uint32_t kind = K_ECHO, id = 0;
  memcpy(hello, &kind, 4);
  memcpy(hello + 4, &id, 4);
  assert_int_equal(tu_sock_send_all(efd, hello, sizeof hello), 0);
  echo_rounds(efd);

  tu_phase("every unread connection reads to its end");
  for (int i = 0; i < HOGS; i++) {
    assert_non_null(g_hog[i]);
    assert_int_equal(weft_post(weft_tcp_strand(g_hog[i]->c), resume, g_hog[i]),
                     0);
  }
  tu_event_wait(&g_eof, HOGS, "end of file on every unread connection");
  for (int i = 0; i < HOGS; i++)
    assert_int_equal(g_hog[i]->got, sent[i]);
  echo_rounds(efd);
  st = stats(rt);
  assert_int_equal(st.recv_bufs_held, 0);

  for (int i = 0; i < HOGS; i++) {
    tu_assert_rc(weft_tcp_close(g_hog[i]->c, 0), 0);
    close(fds[i]);
  }
  close(efd);
  tu_event_wait(&g_closed, HOGS + 1, "every connection's close callback");
  tu_event ev;
  tu_event_init(&ev);
  tu_assert_rc(weft_listener_close(l, listener_done, &ev), 0);
  tu_event_wait(&ev, 1, "the listener's done callback");
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_event_destroy(&ev);
  tu_event_destroy(&g_hello);
  tu_event_destroy(&g_eof);
  tu_event_destroy(&g_closed);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recv_unread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
