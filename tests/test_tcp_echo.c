/*
 * test_tcp_echo: bytes pushed through weft connections arrive complete, in
 * order and unchanged, although both sides send in pieces (partial sends).
 *
 *  - Plain clients: blocking-style POSIX clients with 4 KiB socket buffers
 *    send a pattern stream to a weft echo server whose accepted sockets have
 *    small buffers too (set on the listener, inherited); the server reads
 *    into a ring of buffers and echoes each read with weft_tcp_writev of
 *    three random-sized pieces (some empty). Each client checks every byte
 *    it gets back against the pattern, and the FNV-1a hashes and lengths of
 *    what it sent and received. Several connections at once on 4 workers,
 *    with the default listener (one socket per shard) and WEFT_LISTEN_SINGLE
 *    (one socket).
 *  - weft clients: weft_tcp_connect clients (on their own strand or on one
 *    given) send with weft_tcp_writev of three odd-sized iovecs separated by
 *    garbage gaps, the iovec array overwritten right after the call (weft
 *    copies it), then weft_tcp_shutdown; they check the echo byte by byte
 *    and that it ends with EOF exactly after the last byte. Also over IPv6
 *    loopback when the machine has it, and while workers stall (an
 *    unrelated strand's handlers and some of the clients' read callbacks
 *    run for milliseconds: the monitor hands their shards, with their
 *    sockets, to spare threads).
 *  Every callback runs on its connection's strand; write callbacks come in
 *  the order of the writes; at the end every connection and listener has
 *  been freed (stats.tcp_live == 0).
 */
#include "testutil.h"

#define NWORKERS 4
#define NCONN 4
#define SMALL_BUF 4096
#define ECHO_NBUF 4
#define ECHO_BUFSZ 40001

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

/* ---------------------------------------------------------- echo server */

typedef struct echo_srv {
  weft_listener *l;
  struct sockaddr_storage addr; /* where clients connect */
  unsigned addrlen;
  tu_event accepted, closed, listener_done;
  atomic_uint seq;
} echo_srv;

struct echo_conn;
typedef struct echo_slot {
  struct echo_conn *ec;
  unsigned idx;
  unsigned char *buf;
} echo_slot;

typedef struct echo_conn {
  echo_srv *srv;
  weft_tcp *c;
  echo_slot slot[ECHO_NBUF];
  unsigned first, inuse; /* ring of buffers being written back, in order */
  bool reading, eof, closing;
  uint64_t rng;
} echo_conn;

static void echo_closed(void *arg, weft_tcp *c) {
  echo_conn *ec = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(!ec->reading);
  for (unsigned i = 0; i < ECHO_NBUF; i++)
    free(ec->slot[i].buf);
  tu_event *closed = &ec->srv->closed;
  free(ec);
  tu_event_add(closed, 1);
}

static void echo_fail(echo_conn *ec, const char *what, long v) {
  TU_CHECKF(false, "echo server: %s: %ld (%s)", what, v, weft_strerror((int)v));
  if (!ec->closing) {
    ec->closing = true;
    int rc = weft_tcp_close(ec->c, 1);
    TU_CHECKF(rc == 0, "echo server: close: %d", rc);
  }
}

static void echo_maybe_finish(echo_conn *ec) {
  if (ec->eof && ec->inuse == 0 && !ec->reading && !ec->closing) {
    ec->closing = true;
    int rc = weft_tcp_close(ec->c, 0);
    TU_CHECKF(rc == 0, "echo server: close: %d (%s)", rc, weft_strerror(rc));
  }
}

static void echo_read_next(echo_conn *ec);

static void echo_written(void *arg, weft_tcp *c, int status) {
  echo_slot *s = arg;
  echo_conn *ec = s->ec;
  TU_CHECK(on_strand_of(c));
  if (ec->closing) {
    TU_CHECKF(status == 0 || status == -ECANCELED,
              "echo server: write after a failure: %d", status);
    return;
  }
  if (status != 0) {
    echo_fail(ec, "write callback", status);
    return;
  }
  TU_CHECKF(s->idx == ec->first && ec->inuse > 0,
            "echo server: write of buffer %u completed, but buffer %u was "
            "written before it and has not completed",
            s->idx, ec->first);
  ec->first = (ec->first + 1) % ECHO_NBUF;
  ec->inuse--;
  echo_read_next(ec);
  echo_maybe_finish(ec);
}

/* Echoes n bytes of slot w as three pieces of random size, some empty. */
static void echo_send(echo_conn *ec, unsigned w, size_t n) {
  unsigned char *p = ec->slot[w].buf;
  size_t a = (size_t)(tu_rand(&ec->rng) % (n + 1));
  size_t b = (size_t)(tu_rand(&ec->rng) % (n - a + 1));
  struct iovec iov[3] = {{p, a}, {p + a, b}, {p + a + b, n - a - b}};
  int rc = weft_tcp_writev(ec->c, iov, 3, echo_written, &ec->slot[w]);
  explicit_bzero(iov, sizeof iov); /* weft copied the array */
  if (rc != 0)
    echo_fail(ec, "weft_tcp_writev", rc);
}

static void echo_got(void *arg, weft_tcp *c, long n) {
  echo_conn *ec = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECK(ec->reading);
  ec->reading = false;
  if (ec->closing) {
    TU_CHECKF(n == -ECANCELED || n >= 0, "echo server: read: %ld", n);
    return;
  }
  if (n < 0) {
    echo_fail(ec, "read callback", n);
    return;
  }
  if (n == 0) {
    /* FIN once the echo queued so far is sent */
    ec->eof = true;
    int rc = weft_tcp_shutdown(c);
    TU_CHECKF(rc == 0, "echo server: shutdown: %d (%s)", rc, weft_strerror(rc));
    echo_maybe_finish(ec);
    return;
  }
  unsigned w = (ec->first + ec->inuse) % ECHO_NBUF;
  ec->inuse++;
  echo_send(ec, w, (size_t)n);
  echo_read_next(ec);
}

static void echo_read_next(echo_conn *ec) {
  if (ec->reading || ec->eof || ec->closing || ec->inuse == ECHO_NBUF)
    return;
  unsigned w = (ec->first + ec->inuse) % ECHO_NBUF;
  size_t len = ECHO_BUFSZ - (size_t)(tu_rand(&ec->rng) % 1024);
  int rc = weft_tcp_read(ec->c, ec->slot[w].buf, len, echo_got, ec);
  if (rc != 0)
    echo_fail(ec, "weft_tcp_read", rc);
  else
    ec->reading = true;
}

static void echo_accept(void *arg, weft_tcp *c) {
  echo_srv *srv = arg;
  TU_CHECK(on_strand_of(c));
  echo_conn *ec = calloc(1, sizeof *ec);
  TU_CHECK(ec != NULL);
  if (ec == NULL) {
    weft_tcp_close(c, 1);
    return;
  }
  ec->srv = srv;
  ec->c = c;
  /* echo_closed frees ec */
  TU_CHECK_RC(weft_tcp_set_data(c, ec, echo_closed), 0);
  ec->rng = 0xEC40ull + atomic_fetch_add(&srv->seq, 1);
  for (unsigned i = 0; i < ECHO_NBUF; i++) {
    ec->slot[i] = (echo_slot){ec, i, malloc(ECHO_BUFSZ)};
    TU_CHECK(ec->slot[i].buf != NULL);
  }
  tu_event_add(&srv->accepted, 1);
  echo_read_next(ec);
}

static void listener_done(void *arg) { tu_event_add(arg, 1); }

/* Starts the echo server on 127.0.0.1 (or ::1) port 0 and shrinks the
 * buffers of the sockets it will accept. Returns false if the address
 * family is not available here (IPv6 only). */
static bool echo_start(echo_srv *srv, weft_rt *rt, int family, unsigned flags) {
  memset(srv, 0, sizeof *srv);
  tu_event_init(&srv->accepted);
  tu_event_init(&srv->closed);
  tu_event_init(&srv->listener_done);
  atomic_init(&srv->seq, 0);
  weft_listen_opts opts = {.backlog = 0, .flags = flags};
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
  a6.sin6_addr = in6addr_loopback;
  struct sockaddr_in a4;
  tu_addr_loopback(&a4, 0);
  const struct sockaddr *a =
      family == AF_INET6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4;
  unsigned alen = family == AF_INET6 ? sizeof a6 : sizeof a4;
  int rc = weft_tcp_listen(rt, a, alen, &opts, echo_accept, srv, &srv->l);
  if (family == AF_INET6 && rc == -EADDRNOTAVAIL)
    return false;
  if (rc != 0)
    fail_msg("weft_tcp_listen: %d (%s)", rc, weft_strerror(rc));
  srv->addrlen = sizeof srv->addr;
  tu_assert_rc(
      weft_listener_addr(srv->l, (struct sockaddr *)&srv->addr, &srv->addrlen),
      0);
  assert_int_equal(srv->addr.ss_family, family);
  uint16_t port = tu_addr_port((struct sockaddr *)&srv->addr);
  assert_true(port != 0);
  /* weft.h: one listening socket per shard, or one with LISTEN_SINGLE */
  int n = tu_shrink_listener_bufs(port, SMALL_BUF, 0);
  if (n != (flags & WEFT_LISTEN_SINGLE ? 1 : NWORKERS))
    fail_msg("found %d listening sockets on port %u, expected %d", n,
             (unsigned)port, flags & WEFT_LISTEN_SINGLE ? 1 : NWORKERS);
  return true;
}

static void echo_stop(echo_srv *srv, weft_rt *rt, unsigned nconn) {
  tu_event_wait(&srv->closed, nconn, "the server side to close");
  assert_int_equal(tu_event_get(&srv->accepted), nconn);
  tu_assert_rc(weft_listener_close(srv->l, listener_done, &srv->listener_done),
               0);
  tu_event_wait(&srv->listener_done, 1, "the listener's done callback");
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_event_destroy(&srv->accepted);
  tu_event_destroy(&srv->closed);
  tu_event_destroy(&srv->listener_done);
}

static weft_rt *rt_start(void) {
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  return rt;
}

static void rt_stop(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

/* ------------------------------------------------------- plain clients */

typedef struct pclient {
  uint16_t port;
  uint64_t seed, total;
  uint64_t sent, got, h_sent, h_got;
  bool eof;
  unsigned char *tmp, *rbuf;
} pclient;

#define PC_CHUNK 8192

static bool pclient_send(pclient *pc, int fd, uint64_t *rng) {
  size_t want = 1 + (size_t)(tu_rand(rng) % PC_CHUNK);
  if (want > pc->total - pc->sent)
    want = (size_t)(pc->total - pc->sent);
  tu_pattern_fill(pc->tmp, want, pc->seed, pc->sent);
  ssize_t n = send(fd, pc->tmp, want, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return true;
  TU_CHECKF(n > 0, "client send: %s", strerror(errno));
  if (n <= 0)
    return false;
  pc->h_sent = tu_fnv1a(pc->h_sent, pc->tmp, (size_t)n);
  pc->sent += (uint64_t)n;
  if (pc->sent == pc->total && shutdown(fd, SHUT_WR) != 0) {
    TU_CHECKF(false, "client shutdown: %s", strerror(errno));
    return false;
  }
  return true;
}

static bool pclient_recv(pclient *pc, int fd) {
  ssize_t n = recv(fd, pc->rbuf, PC_CHUNK, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return true;
  TU_CHECKF(n >= 0, "client recv: %s", strerror(errno));
  if (n < 0)
    return false;
  if (n == 0) {
    TU_CHECKF(pc->got == pc->total,
              "client: EOF after %" PRIu64 " of %" PRIu64 " echoed bytes",
              pc->got, pc->total);
    pc->eof = true;
    return pc->got == pc->total;
  }
  size_t bad = tu_pattern_check(pc->rbuf, (size_t)n, pc->seed, pc->got);
  TU_CHECKF(bad == (size_t)n && pc->got + (uint64_t)n <= pc->sent,
            "client: echo differs at offset %" PRIu64 " (%" PRIu64
            " bytes sent so far)",
            pc->got + bad, pc->sent);
  if (bad != (size_t)n || pc->got + (uint64_t)n > pc->sent)
    return false;
  pc->h_got = tu_fnv1a(pc->h_got, pc->rbuf, (size_t)n);
  pc->got += (uint64_t)n;
  return true;
}

static void *pclient_main(void *arg) {
  pclient *pc = arg;
  uint64_t rng = pc->seed;
  pc->h_sent = pc->h_got = TU_FNV_INIT;
  int fd = tu_sock_connect(pc->port, SMALL_BUF, SMALL_BUF);
  TU_CHECKF(fd >= 0, "client connect: %s", strerror(-fd));
  if (fd < 0)
    return NULL;
  bool ok = true;
  while (ok && !pc->eof) {
    short ev = POLLIN | (pc->sent < pc->total ? POLLOUT : 0);
    int r = tu_sock_poll(fd, ev, TU_WAIT_S * 1000 / 2);
    TU_CHECKF(r > 0,
              "client: nothing to send or receive for %d s (sent %" PRIu64
              ", got %" PRIu64 " of %" PRIu64 ")",
              TU_WAIT_S / 2, pc->sent, pc->got, pc->total);
    if (r <= 0)
      break;
    if ((r & POLLOUT) && pc->sent < pc->total)
      ok = pclient_send(pc, fd, &rng);
    if (ok && (r & (POLLIN | POLLHUP | POLLERR)))
      ok = pclient_recv(pc, fd);
  }
  close(fd);
  return NULL;
}

/* The clients and callbacks use this test's stack frame: a client that
 * does not end is a failure with no way back. */
static void join_or_abort(pthread_t t) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += TU_WAIT_S;
  int rc = pthread_timedjoin_np(t, NULL, &dl);
  if (rc != 0) {
    fprintf(stderr, "a plain client did not end within %d s: aborting\n",
            TU_WAIT_S);
    abort();
  }
}

static void run_plain_clients(unsigned flags, uint64_t total) {
  tu_reset_async_errors();
  tu_phase(flags ? "plain clients, LISTEN_SINGLE" : "plain clients");
  weft_rt *rt = rt_start();
  echo_srv srv;
  echo_start(&srv, rt, AF_INET, flags);
  pclient pc[NCONN];
  pthread_t th[NCONN];
  for (unsigned i = 0; i < NCONN; i++) {
    pc[i] = (pclient){.port = tu_addr_port((struct sockaddr *)&srv.addr),
                      .seed = 0x5EED00ull + i + flags * 100,
                      .total = total / NCONN + i * 1031,
                      .tmp = malloc(PC_CHUNK),
                      .rbuf = malloc(PC_CHUNK)};
    assert_true(pc[i].tmp && pc[i].rbuf);
    tu_thread_start(&th[i], pclient_main, &pc[i]);
  }
  for (unsigned i = 0; i < NCONN; i++)
    join_or_abort(th[i]);
  for (unsigned i = 0; i < NCONN; i++) {
    if (pc[i].got != pc[i].total || pc[i].sent != pc[i].total ||
        pc[i].h_got != pc[i].h_sent || !pc[i].eof)
      fail_msg("client %u: sent %" PRIu64 " (hash %016" PRIx64
               "), got back %" PRIu64 " (hash %016" PRIx64 ") of %" PRIu64
               ", EOF %d",
               i, pc[i].sent, pc[i].h_sent, pc[i].got, pc[i].h_got, pc[i].total,
               (int)pc[i].eof);
    free(pc[i].tmp);
    free(pc[i].rbuf);
  }
  echo_stop(&srv, rt, NCONN);
  rt_stop(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_plain_clients(void **state) {
  (void)state;
  run_plain_clients(0, TU_SCALED(48u << 20, 3u << 20));
  run_plain_clients(WEFT_LISTEN_SINGLE, TU_SCALED(16u << 20, 1u << 20));
}

/* --------------------------------------------------------- weft clients */

#define WC_NSLOT 8
#define WC_PIECE 9001
#define WC_GAP 7
#define WC_RBUF 65536

struct wclient;
typedef struct wslot {
  struct wclient *wc;
  uint64_t seq;
  unsigned char buf[3 * WC_PIECE + 2 * WC_GAP];
} wslot;

typedef struct wclient {
  weft_strand *own; /* the strand given to connect, or NULL */
  weft_tcp *c;
  uint16_t srv_port;
  uint64_t seed, total, queued, got, wseq_next, wseq_done, rng;
  unsigned inflight;
  bool eof, shut, closing, closed;
  int connect_status;
  wslot *slot[WC_NSLOT];
  unsigned char *rbuf;
  tu_event *done;
  unsigned stall_every, nreads; /* a 3 ms read callback every so often */
  atomic_bool finished;         /* its close callback has run */
} wclient;

static void wc_check_strand(wclient *wc, weft_tcp *c) {
  TU_CHECK(on_strand_of(c));
  TU_CHECK(wc->own == NULL || weft_strand_current() == wc->own);
}

static void wc_closed(void *arg, weft_tcp *c) {
  wclient *wc = arg;
  wc_check_strand(wc, c);
  TU_CHECK(wc->inflight == 0 && !wc->closed);
  wc->closed = true;
  atomic_store(&wc->finished, true);
  tu_event_add(wc->done, 1);
}

static void wc_close(wclient *wc, int abortive) {
  if (wc->closing)
    return;
  wc->closing = true;
  int rc = weft_tcp_close(wc->c, abortive);
  TU_CHECKF(rc == 0, "client close: %d (%s)", rc, weft_strerror(rc));
}

static void wc_maybe_close(wclient *wc) {
  if (wc->eof && wc->inflight == 0)
    wc_close(wc, 0);
}

static void wc_written(void *arg, weft_tcp *c, int status);

/* Queues one weft_tcp_writev of three odd-sized pieces with gaps. */
static bool wc_write_one(wclient *wc) {
  wslot *s = wc->slot[wc->wseq_next % WC_NSLOT];
  struct iovec iov[3];
  unsigned char *p = s->buf;
  uint64_t off = wc->queued;
  s->seq = wc->wseq_next;
  memset(s->buf, 0xEE, sizeof s->buf);
  for (unsigned k = 0; k < 3; k++) {
    size_t len = (size_t)(tu_rand(&wc->rng) % WC_PIECE) | 1;
    if (len > wc->total - off)
      len = (size_t)(wc->total - off);
    tu_pattern_fill(p, len, wc->seed, off);
    iov[k] = (struct iovec){p, len};
    p += len + WC_GAP;
    off += len;
  }
  int rc = weft_tcp_writev(wc->c, iov, 3, wc_written, s);
  explicit_bzero(iov, sizeof iov); /* weft copied the array */
  TU_CHECKF(rc == 0, "client writev: %d (%s)", rc, weft_strerror(rc));
  if (rc != 0)
    return false;
  wc->wseq_next++;
  wc->queued = off;
  wc->inflight++;
  return true;
}

static void wc_pump(wclient *wc) {
  while (!wc->closing && wc->inflight < WC_NSLOT && wc->queued < wc->total)
    if (!wc_write_one(wc)) {
      wc_close(wc, 1);
      return;
    }
  if (wc->queued == wc->total && !wc->shut && !wc->closing) {
    wc->shut = true; /* FIN after the queued writes */
    int rc = weft_tcp_shutdown(wc->c);
    TU_CHECKF(rc == 0, "client shutdown: %d (%s)", rc, weft_strerror(rc));
  }
}

static void wc_written(void *arg, weft_tcp *c, int status) {
  wslot *s = arg;
  wclient *wc = s->wc;
  wc_check_strand(wc, c);
  TU_CHECKF(status == 0 || (wc->closing && status == -ECANCELED),
            "client write callback: %d (%s)", status, weft_strerror(status));
  TU_CHECKF(s->seq == wc->wseq_done,
            "client: write #%" PRIu64 " completed before write #%" PRIu64,
            s->seq, wc->wseq_done);
  wc->wseq_done++;
  wc->inflight--;
  if (status != 0)
    wc_close(wc, 1);
  wc_pump(wc);
  wc_maybe_close(wc);
}

static void wc_read(wclient *wc);

static void wc_got(void *arg, weft_tcp *c, long n) {
  wclient *wc = arg;
  wc_check_strand(wc, c);
  if (wc->closing) {
    TU_CHECKF(n == -ECANCELED || n >= 0, "client read: %ld", n);
    return;
  }
  if (n <= 0) {
    TU_CHECKF(n == 0, "client read callback: %ld (%s)", n,
              weft_strerror((int)n));
    TU_CHECKF(n != 0 || wc->got == wc->total,
              "client: EOF after %" PRIu64 " of %" PRIu64 " echoed bytes",
              wc->got, wc->total);
    wc->eof = true;
    if (n < 0)
      wc_close(wc, 1);
    wc_maybe_close(wc);
    return;
  }
  size_t bad = tu_pattern_check(wc->rbuf, (size_t)n, wc->seed, wc->got);
  TU_CHECKF(bad == (size_t)n && wc->got + (uint64_t)n <= wc->queued,
            "client: echo differs at offset %" PRIu64 " (%" PRIu64
            " bytes queued so far)",
            wc->got + bad, wc->queued);
  wc->got += (uint64_t)n;
  if (bad != (size_t)n) {
    wc_close(wc, 1);
    return;
  }
  wc_read(wc);
  if (wc->stall_every && ++wc->nreads % wc->stall_every == 0)
    tu_sleep_ms(3); /* runs long: the monitor hands this shard off */
}

static void wc_read(wclient *wc) {
  size_t len = WC_RBUF - (size_t)(tu_rand(&wc->rng) % 4096);
  int rc = weft_tcp_read(wc->c, wc->rbuf, len, wc_got, wc);
  TU_CHECKF(rc == 0, "client read: %d (%s)", rc, weft_strerror(rc));
  if (rc != 0)
    wc_close(wc, 1);
}

static void wc_connected(void *arg, weft_tcp *c, int status) {
  wclient *wc = arg;
  wc_check_strand(wc, c);
  wc->c = c;
  wc->connect_status = status;
  TU_CHECK_RC(weft_tcp_set_data(c, wc, wc_closed), 0);
  TU_CHECKF(status == 0, "connect: %d (%s)", status, weft_strerror(status));
  if (status != 0) {
    /* weft.h: a failed connection closes itself once this returns; a close
     * from inside this callback is still accepted */
    wc_close(wc, 1);
    return;
  }
  /* Small send buffer, so that weft's writes are sent in pieces too; the
   * socket is found by its address (the API does not give descriptors). */
  struct sockaddr_storage a;
  unsigned alen = sizeof a;
  int rc = weft_tcp_local_addr(c, (struct sockaddr *)&a, &alen);
  TU_CHECKF(rc == 0, "weft_tcp_local_addr: %d", rc);
  int bufs[2] = {SMALL_BUF, 0};
  int n = tu_for_tcp_fds(tu_addr_port((struct sockaddr *)&a), wc->srv_port,
                         tu_fd_set_bufs, bufs);
  TU_CHECKF(n == 1, "found %d sockets for a weft client connection", n);
  wc_read(wc);
  wc_pump(wc);
}

/* On a client's strand: its state, for a failure message. */
static void wc_dump(void *arg) {
  wclient *wc = arg;
  fprintf(stderr,
          "weft client (%s strand): connect %d, queued %" PRIu64 " of %" PRIu64
          ", write callbacks %" PRIu64 " of %" PRIu64 ", got back %" PRIu64
          ", EOF %d, shut %d, closing %d\n",
          wc->own ? "given" : "own", wc->connect_status, wc->queued, wc->total,
          wc->wseq_done, wc->wseq_next, wc->got, (int)wc->eof, (int)wc->shut,
          (int)wc->closing);
}

/* The clients' callbacks use this test's stack frame: a client that does
 * not finish is a failure with no way back. */
static void dump_and_abort(wclient *wc, weft_tcp **out) {
  for (unsigned i = 0; i < NCONN; i++) /* not those freed already */
    if (!atomic_load(&wc[i].finished))
      weft_post(weft_tcp_strand(out[i]), wc_dump, &wc[i]);
  tu_sleep_ms(2000); /* time for the dumps; we abort anyway */
  fprintf(stderr, "aborting: the clients' callbacks still use this frame\n");
  abort();
}

/* stall_every: 0, or every how many reads a client's read callback runs
 * 3 ms (after it has started the next read). */
static void run_weft_clients(weft_rt *rt, echo_srv *srv, uint64_t total,
                             unsigned stall_every) {
  wclient wc[NCONN];
  weft_tcp *out[NCONN];
  tu_event done;
  tu_event_init(&done);
  for (unsigned i = 0; i < NCONN; i++) {
    wc[i] = (wclient){.srv_port = tu_addr_port((struct sockaddr *)&srv->addr),
                      .seed = 0xC11E47ull + i,
                      .rng = 77 + i,
                      .total = total / NCONN + i * 977,
                      .connect_status = 1,
                      .rbuf = malloc(WC_RBUF),
                      .done = &done,
                      .stall_every = stall_every};
    assert_non_null(wc[i].rbuf);
    for (unsigned k = 0; k < WC_NSLOT; k++) {
      wc[i].slot[k] = calloc(1, sizeof(wslot));
      assert_non_null(wc[i].slot[k]);
      wc[i].slot[k]->wc = &wc[i];
    }
    if (i % 2)
      tu_strand_create(rt, &wc[i].own);
    tu_assert_rc(weft_tcp_connect(rt, wc[i].own, (struct sockaddr *)&srv->addr,
                                  srv->addrlen, 0, wc_connected, &wc[i],
                                  &out[i]),
                 0);
  }
  if (!tu_event_wait_bg(&done, NCONN, "the weft clients to finish"))
    dump_and_abort(wc, out);
  for (unsigned i = 0; i < NCONN; i++) {
    assert_ptr_equal(out[i], wc[i].c);
    if (wc[i].got != wc[i].total || wc[i].queued != wc[i].total || !wc[i].eof ||
        wc[i].connect_status != 0)
      fail_msg("weft client %u: connect %d, queued %" PRIu64
               ", got back %" PRIu64 " of %" PRIu64 ", EOF %d",
               i, wc[i].connect_status, wc[i].queued, wc[i].got, wc[i].total,
               (int)wc[i].eof);
    for (unsigned k = 0; k < WC_NSLOT; k++)
      free(wc[i].slot[k]);
    free(wc[i].rbuf);
    if (wc[i].own)
      weft_strand_release(wc[i].own);
  }
  tu_event_destroy(&done);
}

static void test_weft_clients(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("weft clients");
  weft_rt *rt = rt_start();
  echo_srv srv;
  echo_start(&srv, rt, AF_INET, 0);
  run_weft_clients(rt, &srv, TU_SCALED(32u << 20, 2u << 20), 0);
  echo_stop(&srv, rt, NCONN);
  rt_stop(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static bool have_ipv6_loopback(void) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  struct sockaddr_in6 a = {.sin6_family = AF_INET6};
  a.sin6_addr = in6addr_loopback;
  bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static void test_weft_clients_ipv6(void **state) {
  (void)state;
  if (!have_ipv6_loopback()) {
    print_message("[ SKIP     ] no IPv6 loopback on this machine\n");
    skip();
  }
  tu_reset_async_errors();
  tu_phase("weft clients over IPv6");
  weft_rt *rt = rt_start();
  echo_srv srv;
  assert_true(echo_start(&srv, rt, AF_INET6, 0));
  run_weft_clients(rt, &srv, TU_SCALED(4u << 20, 1u << 20), 0);
  echo_stop(&srv, rt, NCONN);
  rt_stop(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------- with stalled workers */

/* A strand whose handlers each run 5 ms (far past a stall threshold of
 * 50 us), one after the other: the monitor keeps handing the shard of the
 * thread inside one to a spare thread. The echo, unrelated, must go on
 * meanwhile; and the clients' own read callbacks run 3 ms every 16th time, so
 * that shards are handed off while a connection's handler runs, with its next
 * read just started. */
typedef struct staller {
  weft_strand *s;
  atomic_bool stop;
  tu_count runs;
  tu_event done;
} staller;

static void stall_handler(void *arg) {
  staller *st = arg;
  if (atomic_load(&st->stop)) {
    tu_event_add(&st->done, 1);
    return;
  }
  tu_sleep_ms(5);
  atomic_fetch_add(&st->runs, 1);
  TU_CHECK_RC(weft_post(st->s, stall_handler, st), 0);
}

static void count_handoff(const weft_stall *stall, void *ctx) {
  if (stall->handed_off)
    atomic_fetch_add((tu_count *)ctx, 1);
}

static void run_with_stalls(void) {
  static tu_count handoffs;
  atomic_store(&handoffs, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = NWORKERS;
  cfg.stall_threshold_ns = 50000; /* the least: many handoffs */
  cfg.on_stall = count_handoff;
  cfg.on_stall_ctx = &handoffs;
  weft_rt *rt;
  tu_assert_rc(weft_rt_create(&rt, &cfg), 0);
  tu_assert_backend(rt);
  static staller st;
  memset(&st, 0, sizeof st);
  tu_event_init(&st.done);
  tu_strand_create(rt, &st.s);
  tu_assert_rc(weft_post(st.s, stall_handler, &st), 0);
  echo_srv srv;
  echo_start(&srv, rt, AF_INET, 0);
  run_weft_clients(rt, &srv, TU_SCALED(16u << 20, 2u << 20), 16);
  atomic_store(&st.stop, true);
  tu_event_wait(&st.done, 1, "the stalling strand to stop");
  weft_strand_release(st.s);
  echo_stop(&srv, rt, NCONN);
  rt_stop(rt);
  print_message("[ INFO     ] %" PRIu64 " stalled handlers, %" PRIu64
                " handoffs meanwhile\n",
                atomic_load(&st.runs), atomic_load(&handoffs));
  assert_true(atomic_load(&handoffs) > 0); /* else this tested nothing */
  tu_event_destroy(&st.done);
}

static void test_weft_clients_with_stalls(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("weft clients, workers stalled");
  for (unsigned round = 0; round < 3; round++)
    run_with_stalls();
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_clients),
      cmocka_unit_test(test_weft_clients),
      cmocka_unit_test(test_weft_clients_ipv6),
      cmocka_unit_test(test_weft_clients_with_stalls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
