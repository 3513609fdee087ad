/*
 * test_tcp_close_race: weft_tcp_close racing the operations in flight.
 * weft.h: "every operation in flight completes exactly once, with
 * -ECANCELED when the close ended it, before the close callback; the
 * kernel has released every buffer by then."
 *
 * 10^5 iterations (scaled), on 4 lanes at once (4 workers). Each makes a
 * connected pair (a weft connection and a plain socket), puts operations in
 * flight and closes the weft side:
 *   - how the pair is made: accepted by a weft listener whose sockets have
 *     small buffers, or weft_tcp_connect to a plain listener (in some
 *     iterations closed at once, racing the connect itself);
 *   - what is in flight: a read into a heap buffer, and/or writes of 1, 16,
 *     16 and 16 KiB against a peer that never reads (more than the socket
 *     buffers hold, so the last write is surely still queued);
 *   - where the close comes from: the handler that started the operations,
 *     a later handler on the strand, or another thread; graceful or
 *     abortive; in some iterations the peer sends data just before the
 *     close, so that the read may complete first.
 * The close callback is set (weft_tcp_set_data) in the accept or connect
 * callback. Checked: every callback exactly once and each operation's
 * callback before the close callback; no callback after the close
 * callback; the close callback gets the data given; a read that had no
 * data to complete it ends with -ECANCELED, one that completed got the
 * peer's bytes; writes complete in order, and the last one (which cannot
 * fit in the kernel) with -ECANCELED. The read buffer is freed in the close
 * callback (ASan: a late callback or copy into it is a use after free), or
 * else filled with a canary and kept a while, then checked after the peer
 * sent data: a kernel still reading into it would break the canary. At the
 * end stats.tcp_live == 0.
 */
#include "testutil.h"

#define NWORKERS 4
#define NLANES 4
#define SMALL_BUF 4096
#define RBUF 4096
#define NWRITES 4
#define WCHUNK 16384
#define WFIRST 1024
#define PEER_DATA 64
#define GRAVE 16
#define CANARY 0xC5

/* variant bits */
#define V_READ 0x01u
#define V_WRITE 0x02u
#define V_CONNECT 0x04u     /* weft_tcp_connect instead of accept */
#define V_EARLY 0x08u       /* close right after weft_tcp_connect returns */
#define V_DATA 0x10u        /* the peer sends data just before the close */
#define V_ABORT 0x20u       /* abortive close */
#define V_GRAVE 0x40u       /* read buffer kept (canary) instead of freed */
#define V_SITE_NOW 0x80u    /* close in the handler that started the ops */
#define V_SITE_LATER 0x100u /* close in a later handler on the strand */
/* neither site bit: close from the lane thread */

typedef struct rec {
  unsigned variant;
  _Atomic(weft_tcp *) c;
  atomic_uint connect_cbs, read_cbs, write_cbs, close_cbs, late;
  atomic_uint early_read; /* V_EARLY: the read was accepted */
  atomic_int connect_status, order_bad;
  atomic_long read_res;
  atomic_int write_res[NWRITES];
  atomic_uint lport;
  unsigned char *rbuf, *wbuf;
  struct lane *lane;
} rec;

typedef struct lane {
  unsigned id;
  weft_rt *rt;
  weft_listener *l;
  uint16_t wport;        /* the weft listener */
  int plfd;              /* the plain listener, for V_CONNECT */
  struct sockaddr_in pl; /* its address */
  _Atomic(rec *) cur;
  tu_event ev; /* +1 when an iteration's ops started, +1 at its close */
  uint64_t evs, rng;
  rec *recs;
  uint64_t nrecs;
  unsigned char *grave[GRAVE];
  unsigned ngrave;
} lane;

static weft_rt *g_rt;
static rec *g_recs;
static uint64_t g_total;
static unsigned char g_canary[RBUF];
static unsigned char g_peer_data[PEER_DATA];

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void note_late(rec *r, const char *what) {
  if (atomic_load(&r->close_cbs) != 0) {
    atomic_fetch_add(&r->late, 1);
    TU_CHECKF(false, "iteration %u: %s callback after the close callback",
              (unsigned)(r - g_recs), what);
  }
}

/* ------------------------------------------------------------- callbacks */

static void closed_cb(void *arg, weft_tcp *c) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(weft_tcp_data(c) == r); /* weft_tcp_set_data's, as given */
  unsigned want_w = r->variant & V_WRITE ? NWRITES : 0;
  unsigned want_r = r->variant & V_EARLY ? atomic_load(&r->early_read)
                                         : !!(r->variant & V_READ);
  TU_CHECKF(atomic_load(&r->read_cbs) == want_r &&
                atomic_load(&r->write_cbs) == want_w,
            "iteration %u (variant %#x): close callback ran after %u of %u "
            "read and %u of %u write callbacks",
            (unsigned)(r - g_recs), r->variant, atomic_load(&r->read_cbs),
            want_r, atomic_load(&r->write_cbs), want_w);
  TU_CHECK(!(r->variant & V_CONNECT) || atomic_load(&r->connect_cbs) == 1);
  if (atomic_fetch_add(&r->close_cbs, 1) != 0)
    TU_CHECKF(false, "iteration %u: second close callback",
              (unsigned)(r - g_recs));
  if (r->variant & V_GRAVE) {
    memset(r->rbuf, CANARY, RBUF); /* the lane checks it later */
  } else {
    free(r->rbuf); /* weft.h: the kernel has released it by now */
    r->rbuf = NULL;
  }
  free(r->wbuf);
  r->wbuf = NULL;
  tu_event_add(&r->lane->ev, 1);
}

static void read_cb(void *arg, weft_tcp *c, long n) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  note_late(r, "read");
  atomic_fetch_add(&r->read_cbs, 1);
  atomic_store(&r->read_res, n);
  bool data_ok = (r->variant & V_DATA) && n > 0 && n <= PEER_DATA &&
                 memcmp(r->rbuf, g_peer_data, (size_t)n) == 0;
  TU_CHECKF(n == -ECANCELED || data_ok,
            "iteration %u (variant %#x): read completed with %ld (%s)%s",
            (unsigned)(r - g_recs), r->variant, n, weft_strerror((int)n),
            n > 0 ? ", bytes the peer did not send" : "");
}

static void write_cb(void *arg, weft_tcp *c, int status) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  note_late(r, "write");
  unsigned k = atomic_fetch_add(&r->write_cbs, 1);
  if (k >= NWRITES)
    return;
  atomic_store(&r->write_res[k], status);
  TU_CHECKF(status == 0 || status == -ECANCELED,
            "iteration %u: write %u completed with %d (%s)",
            (unsigned)(r - g_recs), k, status, weft_strerror(status));
  /* in order: after a cancelled write, no later one can have been sent */
  if (k > 0 && status == 0 && atomic_load(&r->write_res[k - 1]) != 0)
    atomic_fetch_add(&r->order_bad, 1);
}

static void do_close(rec *r, weft_tcp *c) {
  int rc = weft_tcp_close(c, !!(r->variant & V_ABORT));
  TU_CHECKF(rc == 0, "iteration %u: weft_tcp_close: %d (%s)",
            (unsigned)(r - g_recs), rc, weft_strerror(rc));
}

static void later_close(void *arg) {
  rec *r = arg;
  do_close(r, atomic_load(&r->c));
}

/* On the connection's strand: puts the variant's operations in flight and,
 * for V_SITE_NOW, closes at once. */
static void start_ops(rec *r, weft_tcp *c) {
  atomic_store(&r->c, c);
  if (r->variant & V_READ) {
    int rc = weft_tcp_read(c, r->rbuf, RBUF, read_cb, r);
    TU_CHECKF(rc == 0, "weft_tcp_read: %d (%s)", rc, weft_strerror(rc));
  }
  for (unsigned k = 0; (r->variant & V_WRITE) && k < NWRITES; k++) {
    /* the first one small: it may be sent before the close */
    size_t len = k == 0 ? WFIRST : WCHUNK;
    int rc = weft_tcp_write(c, r->wbuf + k * WCHUNK, len, write_cb, r);
    TU_CHECKF(rc == 0, "weft_tcp_write %u: %d (%s)", k, rc, weft_strerror(rc));
  }
  if (r->variant & V_SITE_NOW)
    do_close(r, c);
  tu_event_add(&r->lane->ev, 1);
}

static void accept_cb(void *arg, weft_tcp *c) {
  lane *ln = arg;
  TU_CHECK(on_strand_of(c));
  rec *r = atomic_load(&ln->cur);
  TU_CHECKF(r != NULL && atomic_load(&r->c) == NULL,
            "lane %u: a connection nobody made was accepted", ln->id);
  if (r == NULL || atomic_load(&r->c) != NULL) {
    weft_tcp_close(c, 1);
    return;
  }
  TU_CHECK_RC(weft_tcp_set_data(c, r, closed_cb), 0);
  start_ops(r, c);
}

static void connect_cb(void *arg, weft_tcp *c, int status) {
  rec *r = arg;
  TU_CHECK(on_strand_of(c));
  note_late(r, "connect");
  /* V_EARLY: after the close, which weft.h allows (the close callback set
   * by the end of the connect callback runs, after it) */
  TU_CHECK_RC(weft_tcp_set_data(c, r, closed_cb), 0);
  atomic_fetch_add(&r->connect_cbs, 1);
  atomic_store(&r->connect_status, status);
  if (r->variant & V_EARLY) {
    /* closed right after the connect: it may have connected first */
    TU_CHECKF(status == 0 || status == -ECANCELED,
              "iteration %u: connect closed at once: %d (%s)",
              (unsigned)(r - g_recs), status, weft_strerror(status));
    int rc = status == 0 ? weft_tcp_read(c, r->rbuf, RBUF, read_cb, r) : 1;
    TU_CHECKF(rc == 0 || rc == -EBADF || rc == 1,
              "read after a close during connect: %d (%s)", rc,
              weft_strerror(rc));
    atomic_store(&r->early_read, rc == 0);
    return;
  }
  TU_CHECKF(status == 0, "iteration %u: connect: %d (%s)",
            (unsigned)(r - g_recs), status, weft_strerror(status));
  struct sockaddr_storage a;
  unsigned alen = sizeof a;
  if (status == 0 && weft_tcp_local_addr(c, (struct sockaddr *)&a, &alen) == 0)
    atomic_store(&r->lport, tu_addr_port((struct sockaddr *)&a));
  start_ops(r, c);
}

/* ------------------------------------------------------------------ lanes */

static unsigned pick_variant(lane *ln) {
  uint64_t x = tu_rand(&ln->rng);
  unsigned v;
  if (x % 4 == 0) {
    v = V_CONNECT | V_READ;
    if ((x >> 2) % 4 == 0) /* closed while connecting */
      return v | V_EARLY | ((x >> 4) & 1 ? V_ABORT : 0);
  } else {
    unsigned ops = (unsigned)((x >> 2) % 3);
    v = ops == 0 ? V_READ : ops == 1 ? V_WRITE : V_READ | V_WRITE;
  }
  unsigned site = (unsigned)((x >> 5) % 3);
  v |= site == 0 ? V_SITE_NOW : site == 1 ? V_SITE_LATER : 0;
  if ((x >> 8) & 1)
    v |= V_ABORT;
  if ((v & V_READ) && (x >> 9) % 3 == 0)
    v |= V_DATA;
  if ((v & V_READ) && ((x >> 11) & 1))
    v |= V_GRAVE;
  return v;
}

static void grave_push(lane *ln, unsigned char *b) {
  unsigned slot = ln->ngrave++ % GRAVE;
  unsigned char *old = ln->grave[slot];
  ln->grave[slot] = b;
  if (old == NULL)
    return;
  TU_CHECKF(memcmp(old, g_canary, RBUF) == 0,
            "lane %u: a read buffer changed after its connection's close "
            "callback: the kernel was still reading into it",
            ln->id);
  free(old);
}

/* Accepts on the plain listener until the connection from lport comes;
 * others (left by V_EARLY iterations) are reset. The port comes from
 * accept: the weft side may have reset the connection already. */
static int accept_from(lane *ln, uint16_t lport) {
  for (;;) {
    int ev = tu_sock_poll(ln->plfd, POLLIN, TU_WAIT_S * 1000);
    TU_CHECKF(ev > 0, "lane %u: no connection from port %u to accept", ln->id,
              (unsigned)lport);
    if (ev <= 0)
      return -1;
    struct sockaddr_storage a;
    socklen_t alen = sizeof a;
    int fd = accept4(ln->plfd, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC);
    if (fd < 0 && (errno == EAGAIN || errno == ECONNABORTED))
      continue;
    TU_CHECKF(fd >= 0, "lane %u: accept: %s", ln->id, strerror(errno));
    if (fd < 0 || tu_addr_port((struct sockaddr *)&a) == lport)
      return fd;
    tu_sock_linger0(fd);
    close(fd);
  }
}

/* Resets whatever waits on the plain listener (left by V_EARLY). */
static void plain_drain(lane *ln) {
  for (int fd; (fd = accept4(ln->plfd, NULL, NULL, SOCK_NONBLOCK)) >= 0;) {
    tu_sock_linger0(fd);
    close(fd);
  }
}

static bool wait_ev(lane *ln, const char *what) {
  if (tu_event_wait_bg(&ln->ev, ++ln->evs, what))
    return true;
  rec *r = atomic_load(&ln->cur);
  TU_CHECKF(false,
            "lane %u, iteration %u (variant %#x): connect callbacks %u, read "
            "callbacks %u, write callbacks %u, close callbacks %u",
            ln->id, (unsigned)(r - g_recs), r->variant,
            atomic_load(&r->connect_cbs), atomic_load(&r->read_cbs),
            atomic_load(&r->write_cbs), atomic_load(&r->close_cbs));
  return false;
}

/* Makes the pair for r and returns the plain side (-1: none, or failed). */
static int make_pair(lane *ln, rec *r, bool *ok) {
  if (!(r->variant & V_CONNECT)) {
    int fd = tu_sock_connect(ln->wport, SMALL_BUF, 0);
    /* closed at once by the weft side: it may reset the connection before
     * connect() has returned here */
    bool reset =
        (r->variant & V_SITE_NOW) && (fd == -ECONNRESET || fd == -EPIPE);
    TU_CHECKF(fd >= 0 || reset, "lane %u: connect: %s", ln->id, strerror(-fd));
    *ok = (fd >= 0 || reset) &&
          wait_ev(ln, "the accepted connection's ops to start");
    return fd;
  }
  weft_tcp *out = NULL;
  int rc = weft_tcp_connect(ln->rt, NULL, (struct sockaddr *)&ln->pl,
                            sizeof ln->pl, 0, connect_cb, r, &out);
  TU_CHECKF(rc == 0, "weft_tcp_connect: %d (%s)", rc, weft_strerror(rc));
  *ok = rc == 0;
  if (rc != 0)
    return -1;
  if (r->variant & V_EARLY) {
    do_close(r, out);
    return -1;
  }
  *ok = wait_ev(ln, "the connection's ops to start");
  int fd = *ok ? accept_from(ln, (uint16_t)atomic_load(&r->lport)) : -1;
  *ok = *ok && fd >= 0;
  return fd;
}

static bool lane_iter(lane *ln, rec *r) {
  r->lane = ln;
  r->variant = pick_variant(ln);
  r->rbuf = r->variant & V_READ ? malloc(RBUF) : NULL;
  r->wbuf = r->variant & V_WRITE ? malloc(NWRITES * WCHUNK) : NULL;
  atomic_store(&ln->cur, r);
  bool ok;
  int pfd = make_pair(ln, r, &ok);
  if (!ok) {
    if (pfd >= 0)
      close(pfd);
    return false;
  }
  if (pfd >= 0 && (r->variant & V_DATA))
    (void)send(pfd, g_peer_data, PEER_DATA, MSG_NOSIGNAL);
  weft_tcp *c = atomic_load(&r->c);
  if (!(r->variant & (V_SITE_NOW | V_SITE_LATER | V_EARLY)))
    do_close(r, c);
  else if (r->variant & V_SITE_LATER)
    TU_CHECK(weft_post(weft_tcp_strand(c), later_close, r) == 0);
  ok = wait_ev(ln, "the close callback");
  if (pfd >= 0) {
    if (r->variant & V_GRAVE) /* into the buffer, if weft still reads */
      (void)send(pfd, g_peer_data, PEER_DATA, MSG_NOSIGNAL | MSG_DONTWAIT);
    tu_sock_linger0(pfd);
    close(pfd);
  }
  if (ok && (r->variant & V_GRAVE))
    grave_push(ln, r->rbuf);
  if (r->variant & V_EARLY)
    plain_drain(ln);
  return ok;
}

static void *lane_main(void *arg) {
  lane *ln = arg;
  for (uint64_t i = 0; i < ln->nrecs; i++)
    if (!lane_iter(ln, &ln->recs[i]))
      break;
  for (unsigned k = 0; k < GRAVE; k++)
    grave_push(ln, NULL);
  plain_drain(ln);
  return NULL;
}

/* --------------------------------------------------------------- checking */

typedef struct tally {
  uint64_t bad, reads_cancelled, reads_data, writes_sent, writes_cancelled,
      early_connected, early_cancelled, from_thread, graceful;
} tally;

static bool rec_ok(const rec *r, tally *t) {
  unsigned v = r->variant;
  bool ok = atomic_load(&r->close_cbs) == 1 && atomic_load(&r->late) == 0;
  if ((v & V_READ) && !(v & V_EARLY)) {
    long n = atomic_load(&r->read_res);
    ok = ok && atomic_load(&r->read_cbs) == 1;
    t->reads_cancelled += n == -ECANCELED;
    t->reads_data += n > 0;
  }
  if (v & V_WRITE) {
    ok = ok && atomic_load(&r->write_cbs) == NWRITES &&
         atomic_load(&r->order_bad) == 0 &&
         atomic_load(&r->write_res[NWRITES - 1]) == -ECANCELED;
    for (unsigned k = 0; k < NWRITES; k++) {
      t->writes_sent += atomic_load(&r->write_res[k]) == 0;
      t->writes_cancelled += atomic_load(&r->write_res[k]) == -ECANCELED;
    }
  }
  if (v & V_CONNECT)
    ok = ok && atomic_load(&r->connect_cbs) == 1;
  if (v & V_EARLY) {
    t->early_connected += atomic_load(&r->connect_status) == 0;
    t->early_cancelled += atomic_load(&r->connect_status) == -ECANCELED;
  }
  t->from_thread += !(v & (V_SITE_NOW | V_SITE_LATER));
  t->graceful += !(v & V_ABORT);
  return ok;
}

static void check_recs(void) {
  tally t = {0};
  for (uint64_t i = 0; i < g_total; i++) {
    const rec *r = &g_recs[i];
    if (rec_ok(r, &t) || t.bad++ >= 10)
      continue;
    print_error("iteration %" PRIu64 " (variant %#x): close callbacks %u, "
                "late callbacks %u, read callbacks %u (result %ld), write "
                "callbacks %u (last %d, out of order %d), connect callbacks "
                "%u (status %d)\n",
                i, r->variant, atomic_load(&r->close_cbs),
                atomic_load(&r->late), atomic_load(&r->read_cbs),
                atomic_load(&r->read_res), atomic_load(&r->write_cbs),
                atomic_load(&r->write_res[NWRITES - 1]),
                atomic_load(&r->order_bad), atomic_load(&r->connect_cbs),
                atomic_load(&r->connect_status));
  }
  print_message("[ INFO     ] %" PRIu64 " iterations: reads cancelled %" PRIu64
                ", with data %" PRIu64 "; writes sent %" PRIu64
                ", cancelled %" PRIu64 "; closed while connecting: connected "
                "%" PRIu64 ", cancelled %" PRIu64
                "; closed from a thread %" PRIu64 ", graceful %" PRIu64 "\n",
                g_total, t.reads_cancelled, t.reads_data, t.writes_sent,
                t.writes_cancelled, t.early_connected, t.early_cancelled,
                t.from_thread, t.graceful);
  if (t.bad)
    fail_msg("%" PRIu64 " of %" PRIu64 " iterations broke the close contract",
             t.bad, g_total);
  assert_true(t.reads_cancelled > 0);
  assert_true(t.writes_cancelled > 0);
}

/* ------------------------------------------------------------------- test */

static void listener_done(void *arg) { tu_event_add(arg, 1); }

static void lane_setup(lane *ln, unsigned id, uint64_t first, uint64_t n) {
  memset(ln, 0, sizeof *ln);
  ln->id = id;
  ln->rt = g_rt;
  ln->rng = 0xC105Eull * (id + 1);
  ln->recs = &g_recs[first];
  ln->nrecs = n;
  tu_event_init(&ln->ev);
  ln->wport = tu_tcp_listen(g_rt, NULL, accept_cb, ln, &ln->l);
  /* accepted sockets get small buffers: 49 KiB of writes cannot fit */
  if (tu_shrink_listener_bufs(ln->wport, SMALL_BUF, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)ln->wport);
  uint16_t pport = 0;
  ln->plfd = tu_sock_listen(128, &pport);
  assert_true(ln->plfd >= 0);
  assert_int_equal(fcntl(ln->plfd, F_SETFL, O_NONBLOCK), 0);
  tu_addr_loopback(&ln->pl, pport);
}

static void lane_teardown(lane *ln) {
  tu_event done;
  tu_event_init(&done);
  tu_assert_rc(weft_listener_close(ln->l, listener_done, &done), 0);
  tu_event_wait(&done, 1, "the listener's done callback");
  tu_event_destroy(&done);
  tu_event_destroy(&ln->ev);
  close(ln->plfd);
}

/* A lane that does not end still uses the connections and records: a
 * failure with no way back (its own bounded waits report first). */
static void join_or_abort(pthread_t t) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 2 * TU_WAIT_S;
  if (pthread_timedjoin_np(t, NULL, &dl) != 0) {
    fprintf(stderr, "a lane did not end within %d s: aborting\n",
            2 * TU_WAIT_S);
    abort();
  }
}

static void test_close_race(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("close race: setup");
  g_total = TU_SCALED(100000, 2000);
  g_recs = calloc(g_total, sizeof *g_recs);
  assert_non_null(g_recs);
  memset(g_canary, CANARY, sizeof g_canary);
  tu_pattern_fill(g_peer_data, PEER_DATA, 0xDA7A, 0);
  tu_rt_create(&g_rt, NWORKERS, 0);
  tu_assert_backend(g_rt);

  static lane lanes[NLANES];
  pthread_t th[NLANES];
  uint64_t first = 0;
  for (unsigned i = 0; i < NLANES; i++) {
    uint64_t n = g_total / NLANES + (i < g_total % NLANES ? 1 : 0);
    lane_setup(&lanes[i], i, first, n);
    first += n;
  }
  tu_phase("close race: running");
  for (unsigned i = 0; i < NLANES; i++)
    tu_thread_start(&th[i], lane_main, &lanes[i]);
  for (unsigned i = 0; i < NLANES; i++)
    join_or_abort(th[i]);
  TU_ASSERT_NO_ASYNC_ERRORS();

  tu_phase("close race: checking");
  check_recs();
  for (unsigned i = 0; i < NLANES; i++)
    lane_teardown(&lanes[i]);
  tu_stat_wait w = {g_rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(g_rt), 0);
  for (uint64_t i = 0; i < g_total; i++)
    free(g_recs[i].wbuf); /* left only by failed iterations */
  free(g_recs);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_close_race),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
