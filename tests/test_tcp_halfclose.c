/*
 * test_tcp_halfclose: half-close and reset.
 *
 *  - Half-close: a weft client writes 256 KiB (scaled) and calls
 *    weft_tcp_shutdown at once: the server reads every byte, then 0 (EOF),
 *    and only then; the server can still write back 100 KiB and the client,
 *    whose sending side is shut, reads them, then EOF when the server
 *    closes. On the client after its shutdown: writes fail with -EPIPE and
 *    a second shutdown with -EALREADY; the write queued before the
 *    shutdown completes with 0.
 *  - EOF already queued: a plain client sends 5 bytes and FIN, and only
 *    once the FIN is in the weft socket (poll POLLRDHUP on it) does the
 *    first read start: it gets the 5 bytes, the next read 0.
 *  - Reset mid-transfer: a plain client with SO_LINGER {1, 0} reads a
 *    little of what a weft connection sends (writes kept queued over the
 *    socket buffers), then closes: RST. The weft write that fails gets
 *    -ECONNRESET or -EPIPE; every write callback runs exactly once and in
 *    order (0s, then failures); after a failed write weft_tcp_write fails
 *    with -EPIPE; the pending read gets -ECONNRESET or 0. SIGPIPE keeps its
 *    default disposition throughout, so a send without MSG_NOSIGNAL would
 *    kill the test.
 */
#include <signal.h>

#include "testutil.h"

#define NWORKERS 2
#define SMALL_BUF 4096

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void assert_sigpipe_default(void) {
  struct sigaction sa;
  assert_int_equal(sigaction(SIGPIPE, NULL, &sa), 0);
  if (sa.sa_handler != SIG_DFL)
    fail_msg("SIGPIPE is not at its default disposition: the test could "
             "not see a send without MSG_NOSIGNAL (weft must not change it)");
}

/* A connection end: what it reads is checked against a pattern. */
#define MAXW 16

struct end;
typedef struct wr {
  struct end *e;
  unsigned idx;
} wr;

typedef struct end {
  weft_tcp *c;
  unsigned char *rbuf;
  size_t rcap;
  uint64_t got, seed;
  long last; /* last read result */
  bool eof, reading;
  unsigned read_cbs, write_cbs, close_cbs, nwrites;
  int write_status[MAXW];
  int write_after_fail; /* weft_tcp_write in the first failed callback */
  wr w[MAXW];
  tu_event rd; /* +1 on EOF or a read error */
  tu_event wr; /* +1 per write callback */
  tu_event cl; /* +1 at the close callback or when connected */
} end;

static void end_init(end *e, uint64_t seed, size_t rcap) {
  memset(e, 0, sizeof *e);
  e->seed = seed;
  e->rcap = rcap;
  e->rbuf = malloc(rcap);
  assert_non_null(e->rbuf);
  e->write_after_fail = 1;
  for (unsigned i = 0; i < MAXW; i++)
    e->w[i] = (wr){e, i};
  tu_event_init(&e->rd);
  tu_event_init(&e->wr);
  tu_event_init(&e->cl);
}

static void end_destroy(end *e) {
  free(e->rbuf);
  tu_event_destroy(&e->rd);
  tu_event_destroy(&e->wr);
  tu_event_destroy(&e->cl);
}

static void end_read(end *e);

static void end_got(void *arg, weft_tcp *c, long n) {
  end *e = arg;
  TU_CHECK(on_strand_of(c) && c == e->c);
  TU_CHECK(e->reading);
  e->reading = false;
  e->read_cbs++;
  e->last = n;
  if (n <= 0) {
    e->eof = n == 0;
    tu_event_add(&e->rd, 1);
    return;
  }
  size_t bad = tu_pattern_check(e->rbuf, (size_t)n, e->seed, e->got);
  TU_CHECKF(bad == (size_t)n, "byte %" PRIu64 " differs", e->got + bad);
  e->got += (uint64_t)n;
  end_read(e);
}

static void end_read(end *e) {
  int rc = weft_tcp_read(e->c, e->rbuf, e->rcap, end_got, e);
  TU_CHECKF(rc == 0, "weft_tcp_read: %d (%s)", rc, weft_strerror(rc));
  e->reading = rc == 0;
}

static void end_written(void *arg, weft_tcp *c, int status) {
  wr *w = arg;
  end *e = w->e;
  TU_CHECK(on_strand_of(c) && c == e->c);
  TU_CHECKF(w->idx == e->write_cbs, "write %u completed as number %u", w->idx,
            e->write_cbs);
  if (status < 0 && e->write_after_fail == 1) {
    /* weft.h: -EPIPE after a failed write */
    static const char x = 'x';
    e->write_after_fail = weft_tcp_write(c, &x, 1, NULL, NULL);
  }
  if (e->write_cbs < MAXW)
    e->write_status[e->write_cbs] = status;
  e->write_cbs++;
  tu_event_add(&e->wr, 1);
}

/* Queues a write of len pattern bytes (from off) out of buf. */
static void end_write(end *e, const unsigned char *buf, size_t len) {
  assert_true(e->nwrites < MAXW);
  int rc = weft_tcp_write(e->c, buf, len, end_written, &e->w[e->nwrites]);
  TU_CHECKF(rc == 0, "weft_tcp_write: %d (%s)", rc, weft_strerror(rc));
  e->nwrites += rc == 0;
}

static void end_closed(void *arg, weft_tcp *c) {
  end *e = arg;
  TU_CHECK(on_strand_of(c) && c == e->c);
  TU_CHECK(!e->reading);
  TU_CHECK(e->write_cbs == e->nwrites);
  e->close_cbs++;
  tu_event_add(&e->cl, 1);
}

/* From the test thread: end_closed is set on the strand first. */
static void end_close(end *e, int abortive, unsigned closes_before) {
  tu_tcp_set_data(e->c, e, end_closed);
  tu_assert_rc(weft_tcp_close(e->c, abortive), 0);
  tu_event_wait(&e->cl, closes_before + 1, "the close callback");
  assert_int_equal(e->close_cbs, 1);
}

/* Accepts into a single slot. */
typedef struct accept_slot {
  _Atomic(weft_tcp *) c;
  tu_event ev;
} accept_slot;

static void accept_one(void *arg, weft_tcp *c) {
  accept_slot *s = arg;
  TU_CHECK(on_strand_of(c));
  weft_tcp *none = NULL;
  TU_CHECKF(atomic_compare_exchange_strong(&s->c, &none, c),
            "a second connection was accepted");
  tu_event_add(&s->ev, 1);
}

static void connected(void *arg, weft_tcp *c, int status) {
  end *e = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECKF(status == 0, "connect: %d (%s)", status, weft_strerror(status));
  e->c = c;
  tu_event_add(&e->cl, 1);
}

/* ------------------------------------------------------------ half-close */

typedef struct half {
  end cli, srv;
  unsigned char *d1, *d2;
  size_t n1, n2;
  int after_shutdown_write, second_shutdown;
} half;

static void srv_start_read(void *arg) { end_read(&((half *)arg)->srv); }

/* On the client's strand: write, shut down at once, then read. */
static void cli_send_and_shut(void *arg) {
  half *h = arg;
  end_write(&h->cli, h->d1, h->n1);
  TU_CHECK_RC(weft_tcp_shutdown(h->cli.c), 0);
  static const char x = 'x';
  h->after_shutdown_write = weft_tcp_write(h->cli.c, &x, 1, NULL, NULL);
  h->second_shutdown = weft_tcp_shutdown(h->cli.c);
  end_read(&h->cli);
}

static void srv_send_back(void *arg) {
  half *h = arg;
  end_write(&h->srv, h->d2, h->n2);
}

static void connect_pair(weft_rt *rt, uint16_t port, accept_slot *slot,
                         end *cli, end *srv) {
  struct sockaddr_in a;
  tu_addr_loopback(&a, port);
  weft_tcp *out = NULL;
  tu_assert_rc(weft_tcp_connect(rt, NULL, (struct sockaddr *)&a, sizeof a, 0,
                                connected, cli, &out),
               0);
  tu_event_wait(&cli->cl, 1, "the connect callback");
  assert_ptr_equal(out, cli->c);
  tu_event_wait(&slot->ev, 1, "the accept callback");
  srv->c = atomic_load(&slot->c);
}

static void test_half_close(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("half-close");
  assert_sigpipe_default();
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  static half h;
  h.n1 = TU_SCALED(256u << 10, 64u << 10);
  h.n2 = 100u << 10;
  h.d1 = malloc(h.n1);
  h.d2 = malloc(h.n2);
  assert_true(h.d1 && h.d2);
  tu_pattern_fill(h.d1, h.n1, 0xD1, 0);
  tu_pattern_fill(h.d2, h.n2, 0xD2, 0);
  end_init(&h.cli, 0xD2, 7001); /* reads what the server sends */
  end_init(&h.srv, 0xD1, 9001);
  accept_slot slot = {.c = NULL};
  tu_event_init(&slot.ev);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_one, &slot, &l);
  connect_pair(rt, port, &slot, &h.cli, &h.srv);

  tu_on_strand(weft_tcp_strand(h.srv.c), srv_start_read, &h);
  tu_on_strand(weft_tcp_strand(h.cli.c), cli_send_and_shut, &h);
  tu_assert_rc(h.after_shutdown_write, -EPIPE);
  tu_assert_rc(h.second_shutdown, -EALREADY);
  tu_event_wait(&h.srv.rd, 1, "the server to read EOF");
  if (!h.srv.eof || h.srv.got != h.n1)
    fail_msg("server: read %" PRIu64 " of %zu bytes, then %ld (expected EOF "
             "right after the last byte)",
             h.srv.got, h.n1, h.srv.last);
  tu_event_wait(&h.cli.wr, 1, "the client's write callback");
  assert_int_equal(h.cli.write_status[0], 0);

  /* the other direction still works */
  tu_on_strand(weft_tcp_strand(h.srv.c), srv_send_back, &h);
  tu_event_wait(&h.srv.wr, 1, "the server's write callback");
  assert_int_equal(h.srv.write_status[0], 0);
  end_close(&h.srv, 0, 0);
  tu_event_wait(&h.cli.rd, 1, "the client to read EOF");
  if (!h.cli.eof || h.cli.got != h.n2)
    fail_msg("client: read %" PRIu64 " of %zu bytes, then %ld (expected EOF "
             "right after the last byte)",
             h.cli.got, h.n2, h.cli.last);
  end_close(&h.cli, 0, 1);

  tu_listener_close(l);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  end_destroy(&h.cli);
  end_destroy(&h.srv);
  tu_event_destroy(&slot.ev);
  free(h.d1);
  free(h.d2);
  assert_sigpipe_default();
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------ EOF already queued */

static void fd_wait_rdhup(int fd, void *ctx) {
  *(int *)ctx = tu_sock_poll(fd, POLLRDHUP, TU_WAIT_S * 1000);
}

static void srv_read_only(void *arg) { end_read(arg); }

/* Data and FIN are both in the socket before the first read: the read
 * gets the data (a short read) and the next one 0. A short read does not
 * mean that nothing is left to report: the EOF came with the data. */
static void test_eof_already_queued(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("EOF already queued");
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  accept_slot slot = {.c = NULL};
  tu_event_init(&slot.ev);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_one, &slot, &l);
  int fd = tu_sock_connect(port, 0, 0);
  assert_true(fd >= 0);
  tu_event_wait(&slot.ev, 1, "the accept callback");
  static end srv;
  end_init(&srv, 0xE0F, 4096);
  srv.c = atomic_load(&slot.c);
  unsigned char data[5];
  tu_pattern_fill(data, sizeof data, 0xE0F, 0);
  assert_int_equal(tu_sock_send_all(fd, data, sizeof data), 0);
  assert_int_equal(shutdown(fd, SHUT_WR), 0);
  /* the FIN has reached the weft socket (found by its ports) */
  int rev = 0;
  assert_int_equal(tu_for_tcp_fds(port, tu_sock_port(fd), fd_wait_rdhup, &rev),
                   1);
  assert_true(rev > 0 && (rev & POLLRDHUP));
  tu_on_strand(weft_tcp_strand(srv.c), srv_read_only, &srv);
  tu_event_wait(&srv.rd, 1, "the read to report EOF");
  if (!srv.eof || srv.got != sizeof data)
    fail_msg("read %" PRIu64 " of %zu bytes, then %ld; expected EOF (0)",
             srv.got, sizeof data, srv.last);
  end_close(&srv, 0, 0);
  close(fd);
  tu_listener_close(l);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  end_destroy(&srv);
  tu_event_destroy(&slot.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ----------------------------------------------------- reset mid-transfer */

#define RST_NW 8
#define RST_CHUNK (64u << 10)
#define RST_READ (32u << 10)

typedef struct rst {
  end srv;
  unsigned char *data;
  int late_write_rc; /* variant 2: weft_tcp_write after the read failed */
} rst;

static void rst_start(void *arg) {
  rst *r = arg;
  end_read(&r->srv);
  for (unsigned i = 0; i < RST_NW; i++)
    end_write(&r->srv, r->data + i * RST_CHUNK, RST_CHUNK);
}

static void rst_start_read(void *arg) { end_read(&((rst *)arg)->srv); }

static void rst_write_after(void *arg) {
  rst *r = arg;
  r->late_write_rc =
      weft_tcp_write(r->srv.c, r->data, RST_CHUNK, end_written, &r->srv.w[0]);
  r->srv.nwrites += r->late_write_rc == 0;
}

/* A weft connection accepted from a plain client that will reset it. */
static int rst_setup(weft_rt **rt, weft_listener **l, accept_slot *slot,
                     rst *r) {
  tu_rt_create(rt, NWORKERS, 0);
  tu_assert_backend(*rt);
  atomic_init(&slot->c, NULL);
  tu_event_init(&slot->ev);
  uint16_t port = tu_tcp_listen(*rt, NULL, accept_one, slot, l);
  if (tu_shrink_listener_bufs(port, SMALL_BUF, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)port);
  int fd = tu_sock_connect(port, SMALL_BUF, 0);
  assert_true(fd >= 0);
  assert_int_equal(tu_sock_linger0(fd), 0);
  tu_event_wait(&slot->ev, 1, "the accept callback");
  end_init(&r->srv, 0, 4096);
  r->srv.c = atomic_load(&slot->c);
  r->data = malloc(RST_NW * RST_CHUNK);
  assert_non_null(r->data);
  tu_pattern_fill(r->data, RST_NW * RST_CHUNK, 0x55, 0);
  return fd;
}

static void rst_teardown(weft_rt *rt, weft_listener *l, accept_slot *slot,
                         rst *r) {
  end_close(&r->srv, 0, 0);
  tu_listener_close(l);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  end_destroy(&r->srv);
  tu_event_destroy(&slot->ev);
  free(r->data);
  assert_sigpipe_default();
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void check_read_after_reset(const end *e) {
  if (e->last != 0 && e->last != -ECONNRESET)
    fail_msg("the pending read ended with %ld (%s), expected -ECONNRESET or 0",
             e->last, weft_strerror((int)e->last));
}

/* Writes queued over the socket buffers when the RST comes. */
static void test_reset_mid_transfer(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("reset mid-transfer");
  assert_sigpipe_default();
  weft_rt *rt;
  weft_listener *l;
  accept_slot slot;
  static rst r;
  int fd = rst_setup(&rt, &l, &slot, &r);
  tu_on_strand(weft_tcp_strand(r.srv.c), rst_start, &r);
  unsigned char *buf = malloc(RST_READ);
  assert_non_null(buf);
  assert_int_equal(tu_sock_recv_all(fd, buf, RST_READ), 0);
  assert_int_equal(tu_pattern_check(buf, RST_READ, 0x55, 0), RST_READ);
  free(buf);
  close(fd); /* SO_LINGER {1, 0}: RST */
  tu_event_wait(&r.srv.wr, RST_NW, "every write callback");
  tu_event_wait(&r.srv.rd, 1, "the read callback");
  unsigned k0 = 0;
  while (k0 < RST_NW && r.srv.write_status[k0] == 0)
    k0++;
  if (k0 == RST_NW)
    fail_msg("all %u writes (%u KiB) succeeded, although the peer read %u "
             "KiB and reset the connection",
             RST_NW, RST_NW * RST_CHUNK >> 10, RST_READ >> 10);
  int first = r.srv.write_status[k0];
  if (first != -ECONNRESET && first != -EPIPE)
    fail_msg("the first failed write got %d (%s), expected -ECONNRESET or "
             "-EPIPE",
             first, weft_strerror(first));
  for (unsigned k = k0; k < RST_NW; k++)
    if (r.srv.write_status[k] >= 0)
      fail_msg("write %u completed with %d after write %u had failed", k,
               r.srv.write_status[k], k0);
  tu_assert_rc(r.srv.write_after_fail, -EPIPE);
  check_read_after_reset(&r.srv);
  rst_teardown(rt, l, &slot, &r);
}

/* The RST comes first, the read sees it, then a write: its send would
 * raise SIGPIPE without MSG_NOSIGNAL. */
static void test_write_after_reset(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("write after reset");
  assert_sigpipe_default();
  weft_rt *rt;
  weft_listener *l;
  accept_slot slot;
  static rst r;
  int fd = rst_setup(&rt, &l, &slot, &r);
  tu_on_strand(weft_tcp_strand(r.srv.c), rst_start_read, &r);
  close(fd); /* RST */
  tu_event_wait(&r.srv.rd, 1, "the read callback");
  check_read_after_reset(&r.srv);
  tu_on_strand(weft_tcp_strand(r.srv.c), rst_write_after, &r);
  if (r.late_write_rc == 0) {
    tu_event_wait(&r.srv.wr, 1, "the write callback");
    int st = r.srv.write_status[0];
    if (st != -EPIPE && st != -ECONNRESET)
      fail_msg("a write to a reset connection completed with %d (%s)", st,
               weft_strerror(st));
  } else if (r.late_write_rc != -EPIPE) {
    fail_msg("weft_tcp_write to a reset connection returned %d (%s), "
             "expected 0 (then a failed callback) or -EPIPE",
             r.late_write_rc, weft_strerror(r.late_write_rc));
  }
  rst_teardown(rt, l, &slot, &r);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_close),
      cmocka_unit_test(test_eof_already_queued),
      cmocka_unit_test(test_reset_mid_transfer),
      cmocka_unit_test(test_write_after_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
