/*
 * test_tcp_fd_reuse: a closed connection's descriptor number is reused at
 * once (by accepted sockets and by the plain client sockets of this very
 * process) while operations of the closed connection are still being
 * cancelled; nothing of the old connection may leak into the new one.
 *
 * 4 client threads open 5*10^4 connections (scaled) to a weft listener,
 * each sending four 16-byte records {id, its own port, magic}, then waiting
 * for the server to close. The server side reads them into a heap buffer
 * and is closed while a read is pending: in the accept callback right
 * after the first read (peer port % 3 == 0), in the read callback after
 * the first record (== 1), or from the client thread (== 2); some closes
 * are abortive. Checked:
 *   - every record a server connection receives carries its own peer's
 *     port (weft_tcp_peer_addr) and one id: no data meant for one
 *     connection reaches another;
 *   - no callback of a connection after its close callback, each read's
 *     callback exactly once before it, one close callback per connection;
 *   - the read buffer is freed in the close callback (ASan: a late callback
 *     or copy into it is a use after free); at the end stats.tcp_live == 0.
 */
#include "testutil.h"

#define NWORKERS 4
#define NCLIENTS 4
#define NMSG 4
#define RBUF 128

typedef struct msg {
  uint64_t id;
  uint32_t port;
  uint32_t magic;
} msg;
#define MAGIC 0x5EC0DE11u

typedef struct rec {
  _Atomic(weft_tcp *) c;
  uint16_t port; /* the peer's, from weft_tcp_peer_addr */
  unsigned policy;
  uint64_t id;   /* from the first record */
  unsigned nmsg; /* records received */
  unsigned char *buf;
  size_t have;
  bool reading, server_closes, closing;
  atomic_uint reads, read_cbs, close_cbs, late, foreign;
} rec;

static weft_rt *g_rt;
static rec *g_recs;
static uint64_t g_total;
static atomic_uint_fast64_t g_next;
static _Atomic(rec *) g_by_port[65536];
static tu_event g_accepted, g_closed;
static uint16_t g_port;

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void check_not_closed(rec *r, const char *what) {
  if (atomic_load(&r->close_cbs) != 0) {
    atomic_fetch_add(&r->late, 1);
    TU_CHECKF(false, "connection %u: %s callback after the close callback",
              (unsigned)(r - g_recs), what);
  }
}

static void closed_cb(void *arg, weft_tcp *c) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECKF(atomic_load(&r->read_cbs) == atomic_load(&r->reads),
            "connection %u: close callback after %u of %u read callbacks",
            (unsigned)(r - g_recs), atomic_load(&r->read_cbs),
            atomic_load(&r->reads));
  TU_CHECK(atomic_fetch_add(&r->close_cbs, 1) == 0);
  free(r->buf); /* weft.h: the kernel has released it */
  r->buf = NULL;
  tu_event_add(&g_closed, 1);
}

static void server_close(rec *r, weft_tcp *c) {
  if (r->closing)
    return;
  r->closing = true;
  int rc = weft_tcp_close(c, (r - g_recs) % 2);
  TU_CHECKF(rc == 0, "weft_tcp_close: %d (%s)", rc, weft_strerror(rc));
}

static void read_cb(void *arg, weft_tcp *c, long n);

static void start_read(rec *r, weft_tcp *c) {
  if (r->have >= RBUF) /* more than the peer sent: checked elsewhere */
    return;
  int rc = weft_tcp_read(c, r->buf + r->have, RBUF - r->have, read_cb, r);
  TU_CHECKF(rc == 0 || (rc == -EBADF && !r->server_closes),
            "weft_tcp_read: %d (%s)", rc, weft_strerror(rc));
  if (rc == 0) {
    atomic_fetch_add(&r->reads, 1);
    r->reading = true;
  }
}

/* Checks the complete records received so far. */
static void check_records(rec *r) {
  for (; (r->nmsg + 1) * sizeof(msg) <= r->have; r->nmsg++) {
    msg m;
    memcpy(&m, r->buf + r->nmsg * sizeof(msg), sizeof m);
    if (r->nmsg == 0)
      r->id = m.id;
    if (m.magic != MAGIC || m.port != r->port || m.id != r->id ||
        r->nmsg >= NMSG) {
      atomic_fetch_add(&r->foreign, 1);
      TU_CHECKF(false,
                "connection %u (peer port %u, id %#" PRIx64 "): record %u "
                "is {id %#" PRIx64 ", port %u, magic %#x}: data of another "
                "connection",
                (unsigned)(r - g_recs), (unsigned)r->port, r->id, r->nmsg, m.id,
                (unsigned)m.port, (unsigned)m.magic);
    }
  }
}

static void read_cb(void *arg, weft_tcp *c, long n) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  check_not_closed(r, "read");
  atomic_fetch_add(&r->read_cbs, 1);
  TU_CHECK(r->reading);
  r->reading = false;
  if (n <= 0) {
    /* cancelled by the close; EOF or RST only after the client's close */
    TU_CHECKF(n == -ECANCELED ||
                  (r->policy == 2 && (n == 0 || n == -ECONNRESET)),
              "connection %u (close policy %u): read: %ld (%s)",
              (unsigned)(r - g_recs), r->policy, n, weft_strerror((int)n));
    return;
  }
  TU_CHECK((size_t)n <= RBUF - r->have);
  r->have += (size_t)n;
  check_records(r);
  if (r->closing)
    return;
  start_read(r, c); /* a read pending at the close */
  if (r->policy == 1 && r->nmsg >= 1)
    server_close(r, c);
}

static void accept_cb(void *arg, weft_tcp *c) {
  (void)arg;
  TU_CHECK(on_strand_of(c));
  uint64_t i = atomic_fetch_add(&g_next, 1);
  TU_CHECKF(i < g_total, "more connections accepted than made");
  if (i >= g_total) {
    weft_tcp_close(c, 1);
    return;
  }
  rec *r = &g_recs[i];
  atomic_store(&r->c, c);
  /* before anything closes c: the client thread too (policy 2) */
  TU_CHECK_RC(weft_tcp_set_data(c, r, closed_cb), 0);
  struct sockaddr_storage a;
  unsigned alen = sizeof a;
  int rc = weft_tcp_peer_addr(c, (struct sockaddr *)&a, &alen);
  TU_CHECKF(rc == 0, "weft_tcp_peer_addr: %d (%s)", rc, weft_strerror(rc));
  r->port = tu_addr_port((struct sockaddr *)&a);
  r->policy = r->port % 3;
  r->server_closes = r->policy != 2;
  r->buf = malloc(RBUF);
  TU_CHECK(r->buf != NULL);
  start_read(r, c);
  if (r->policy == 0)
    server_close(r, c);
  else if (r->policy == 2)
    atomic_store(&g_by_port[r->port], r);
  tu_event_add(&g_accepted, 1);
}

/* ---------------------------------------------------------------- clients */

/* The server side of the client on port, once accepted (NULL: timed out). */
static rec *wait_server_side(uint16_t port) {
  for (;;) {
    uint64_t seen = tu_event_get(&g_accepted);
    rec *r = atomic_exchange(&g_by_port[port], NULL);
    if (r != NULL)
      return r;
    if (!tu_event_wait_bg(&g_accepted, seen + 1, "the server side"))
      return NULL;
  }
}

static bool client_one(unsigned id, uint64_t seq) {
  int fd = tu_sock_connect(g_port, 0, 0);
  /* a server side closed (abortively) in its accept callback may reset
   * the connection before connect() has returned here */
  if (fd == -ECONNRESET || fd == -EPIPE)
    return true;
  TU_CHECKF(fd >= 0, "client connect: %s", strerror(-fd));
  if (fd < 0)
    return false;
  uint16_t lport = tu_sock_port(fd);
  msg m[NMSG];
  for (unsigned k = 0; k < NMSG; k++)
    m[k] = (msg){((uint64_t)id << 40) | seq, lport, MAGIC};
  int rc = tu_sock_send_all(fd, m, sizeof m);
  /* the server may have closed already (close policies 0 and 1) */
  TU_CHECKF(rc == 0 || (lport % 3 != 2 && (rc == -EPIPE || rc == -ECONNRESET)),
            "client send: %s", strerror(-rc));
  bool ok = true;
  if (lport % 3 == 2) {
    rec *r = wait_server_side(lport);
    ok = r != NULL;
    rc = ok ? weft_tcp_close(atomic_load(&r->c), (int)(seq % 2)) : 0;
    TU_CHECKF(rc == 0, "weft_tcp_close from a client thread: %d (%s)", rc,
              weft_strerror(rc));
  }
  rc = ok ? tu_sock_wait_closed(fd, TU_WAIT_S * 1000, NULL) : 0;
  TU_CHECKF(rc == 0 || rc == -ECONNRESET,
            "client (port %u): the server side did not close: %s",
            (unsigned)lport, strerror(-rc));
  tu_sock_linger0(fd);
  close(fd);
  return ok && (rc == 0 || rc == -ECONNRESET);
}

typedef struct client {
  unsigned id;
  uint64_t n;
} client;

static void *client_main(void *arg) {
  client *cl = arg;
  for (uint64_t k = 0; k < cl->n; k++)
    if (!client_one(cl->id, k))
      break;
  return NULL;
}

/* ------------------------------------------------------------------- test */

static void check_all(void) {
  uint64_t bad = 0, records = 0, policy[3] = {0};
  for (uint64_t i = 0; i < g_total; i++) {
    rec *r = &g_recs[i];
    records += r->nmsg;
    policy[r->policy % 3]++;
    bool ok = atomic_load(&r->close_cbs) == 1 && atomic_load(&r->late) == 0 &&
              atomic_load(&r->foreign) == 0 &&
              atomic_load(&r->read_cbs) == atomic_load(&r->reads) &&
              atomic_load(&r->reads) >= 1;
    if (!ok && bad++ < 10)
      print_error("connection %" PRIu64 " (port %u, policy %u): close "
                  "callbacks %u, late callbacks %u, foreign records %u, "
                  "reads %u, read callbacks %u\n",
                  i, (unsigned)r->port, r->policy, atomic_load(&r->close_cbs),
                  atomic_load(&r->late), atomic_load(&r->foreign),
                  atomic_load(&r->reads), atomic_load(&r->read_cbs));
  }
  print_message("[ INFO     ] %" PRIu64
                " connections (closed at accept %" PRIu64
                ", after a record %" PRIu64 ", from a thread %" PRIu64
                "), %" PRIu64 " records received\n",
                g_total, policy[0], policy[1], policy[2], records);
  if (bad)
    fail_msg("%" PRIu64 " of %" PRIu64 " connections went wrong", bad, g_total);
}

static void listener_done(void *arg) { tu_event_add(arg, 1); }

static void test_fd_reuse(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("fd reuse: setup");
  g_total = TU_SCALED(50000, 2000);
  g_recs = calloc(g_total, sizeof *g_recs);
  assert_non_null(g_recs);
  atomic_store(&g_next, 0);
  tu_event_init(&g_accepted);
  tu_event_init(&g_closed);
  tu_rt_create(&g_rt, NWORKERS, 0);
  tu_assert_backend(g_rt);
  weft_listener *l;
  g_port = tu_tcp_listen(g_rt, NULL, accept_cb, NULL, &l);

  tu_phase("fd reuse: running");
  client cl[NCLIENTS];
  pthread_t th[NCLIENTS];
  for (unsigned i = 0; i < NCLIENTS; i++) {
    cl[i] = (client){i + 1, g_total / NCLIENTS + (i < g_total % NCLIENTS)};
    tu_thread_start(&th[i], client_main, &cl[i]);
  }
  for (unsigned i = 0; i < NCLIENTS; i++)
    tu_thread_join(th[i], "client");
  TU_ASSERT_NO_ASYNC_ERRORS();
  tu_event_wait(&g_closed, g_total, "every server side to close");
  check_all();

  tu_event done;
  tu_event_init(&done);
  tu_assert_rc(weft_listener_close(l, listener_done, &done), 0);
  tu_event_wait(&done, 1, "the listener's done callback");
  tu_stat_wait w = {g_rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(g_rt), 0);
  assert_int_equal(atomic_load(&g_next), g_total);
  tu_event_destroy(&done);
  tu_event_destroy(&g_accepted);
  tu_event_destroy(&g_closed);
  free(g_recs);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fd_reuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
