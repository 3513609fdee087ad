/*
 * test_udp: UDP sockets (weft_udp_*), on each backend.
 *
 *  - Echo: a weft socket echoes every datagram to its sender; a plain
 *    client sends 2000 datagrams (scaled) of 1..1400 bytes in bursts of 32
 *    and gets each back unchanged, in order, from the server's address.
 *  - weft to weft, IPv4 and IPv6: 1000 datagrams sent with callbacks
 *    (each exactly once, 0) all arrive, in order, from the sender's
 *    address; a zero-length datagram arrives as n == 0.
 *  - Truncation: with max_datagram 100, a 300-byte datagram arrives as
 *    its first 100 bytes with WEFT_UDP_TRUNC.
 *  - Refused: a send to the broadcast address without the broadcast flag
 *    gets -EACCES in its callback, and a send after it arrives.
 *  - Connected: after weft_udp_connect, a send with to NULL reaches the
 *    peer; datagrams to a port nobody holds come back as -ECONNREFUSED
 *    (to the receive callback, or a later send's callback); connect(NULL)
 *    disconnects (a send without to is then -EDESTADDRREQ).
 *  - Fairness: 200 datagrams wait on one socket and one on another of the
 *    same strand: the other's is delivered after at most one budget (64)
 *    of the first's, not after all of them.
 *  - Multicast: a socket that joined 239.255.0.1 on lo receives what is
 *    sent to the group; after leaving, leaving again is -EADDRNOTAVAIL.
 *    Skipped where the join is refused.
 *  - Close with sends queued: each send callback runs once with
 *    -ECANCELED, then the close callback once.
 *  - A receive callback that stops receiving at the first of ten waiting
 *    datagrams: no more calls until a restart, which delivers the other
 *    nine, in order.
 *  - The send queue's bytes are reused as it moves: a sender that keeps
 *    two datagrams queued sends 60 times the queue's size, every datagram
 *    intact and in order.
 *  - Bad input: every documented error of the UDP section; a shutdown
 *    with sockets open runs each close callback exactly once.
 */
#include <net/if.h>
#include <sys/un.h>

#include "testutil.h"

#define NWORKERS 2

static weft_rt *rt_make(unsigned workers) {
  weft_rt *rt;
  tu_rt_create(&rt, workers, 0);
  tu_assert_backend(rt);
  return rt;
}

static void rt_end(weft_rt *rt) {
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static socklen_t addr_len(const struct sockaddr_storage *ss) {
  return ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                   : sizeof(struct sockaddr_in);
}

static void loopback(struct sockaddr_storage *ss, int family, uint16_t port) {
  memset(ss, 0, sizeof *ss);
  ss->ss_family = (sa_family_t)family;
  if (family == AF_INET) {
    ((struct sockaddr_in *)ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ((struct sockaddr_in *)ss)->sin_port = htons(port);
  } else {
    ((struct sockaddr_in6 *)ss)->sin6_addr = in6addr_loopback;
    ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
  }
}

/* ------------------------------------------------- a socket and its state */

#define MAXGOT 4096

typedef struct sock {
  weft_udp *u;
  struct sockaddr_storage bound;
  tu_event closed, got_ev, sent_ev;
  /* receive: what came, on the strand */
  unsigned got, errs, trunc;
  long last_n;
  int last_err;
  unsigned lens[MAXGOT];
  unsigned char first[MAXGOT]; /* each datagram's first byte */
  struct sockaddr_storage from;
  bool echo; /* send each datagram back to its sender */
  /* sends: callbacks seen */
  unsigned sent_ok, sent_err, sent_cancelled;
  int last_send_err;
  /* fairness: another socket's count when this one got its first */
  struct sock *other;
  unsigned other_at_first;
  int open_rc;
} sock;

static void on_closed(void *data, weft_udp *u) {
  (void)u;
  tu_event_add(&((sock *)data)->closed, 1);
}

static void on_sent(void *arg, weft_udp *u, int status) {
  sock *s = arg;
  (void)u;
  if (status == 0)
    s->sent_ok++;
  else if (status == -ECANCELED)
    s->sent_cancelled++;
  else {
    s->sent_err++;
    s->last_send_err = status;
  }
  tu_event_add(&s->sent_ev, 1);
}

static void on_recv(void *arg, weft_udp *u, long n, const void *data,
                    const struct sockaddr *from, unsigned fromlen,
                    unsigned flags) {
  sock *s = arg;
  TU_CHECK(weft_strand_current() == weft_udp_strand(u));
  if (n < 0) {
    TU_CHECK(data == NULL && from == NULL);
    s->errs++;
    s->last_err = (int)n;
    tu_event_add(&s->got_ev, 1);
    return;
  }
  if (s->got == 0 && s->other)
    s->other_at_first = s->other->got;
  if (s->got < MAXGOT) {
    s->lens[s->got] = (unsigned)n;
    s->first[s->got] = n > 0 ? *(const unsigned char *)data : 0;
  }
  s->got++;
  s->last_n = n;
  if (flags & WEFT_UDP_TRUNC)
    s->trunc++;
  TU_CHECK(fromlen <= sizeof s->from);
  memcpy(&s->from, from, fromlen);
  if (s->echo)
    TU_CHECK_RC(weft_udp_send(u, data, (size_t)n, from, fromlen, NULL, NULL),
                0);
  tu_event_add(&s->got_ev, 1);
}

static void sock_setup(void *arg) {
  sock *s = arg;
  unsigned len = sizeof s->bound;
  s->open_rc = weft_udp_set_data(s->u, s, on_closed);
  if (!s->open_rc)
    s->open_rc = weft_udp_local_addr(s->u, (struct sockaddr *)&s->bound, &len);
}

static void sock_recv_start(void *arg) {
  sock *s = arg;
  TU_CHECK_RC(weft_udp_recv_start(s->u, on_recv, s), 0);
}

/* Opens s on a loopback address of family (port 0), on strand st (NULL:
 * its own), with data, close callback and its bound address set. */
static void sock_open(sock *s, weft_rt *rt, weft_strand *st, int family,
                      const weft_udp_opts *o) {
  memset(s, 0, sizeof *s);
  tu_event_init(&s->closed);
  tu_event_init(&s->got_ev);
  tu_event_init(&s->sent_ev);
  struct sockaddr_storage a;
  loopback(&a, family, 0);
  tu_assert_rc(
      weft_udp_open(rt, st, (struct sockaddr *)&a, addr_len(&a), o, &s->u), 0);
  s->open_rc = 1;
  tu_on_strand(weft_udp_strand(s->u), sock_setup, s);
  tu_assert_rc(s->open_rc, 0);
}

static void sock_fini(sock *s) {
  tu_event_destroy(&s->closed);
  tu_event_destroy(&s->got_ev);
  tu_event_destroy(&s->sent_ev);
}

static uint16_t sock_port(const sock *s) {
  return tu_addr_port((const struct sockaddr *)&s->bound);
}

/* A plain UDP socket on a loopback address, with a receive timeout. */
static int plain_udp(int family, struct sockaddr_storage *bound) {
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_storage a;
  loopback(&a, family, 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, addr_len(&a)), 0);
  struct timeval tv = {TU_WAIT_S, 0};
  assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  socklen_t len = sizeof *bound;
  assert_int_equal(getsockname(fd, (struct sockaddr *)bound, &len), 0);
  return fd;
}

/* ------------------------------------------------------------------ tests */

#define BURST 32

static void test_echo(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  sock sv;
  sock_open(&sv, rt, NULL, AF_INET, NULL);
  sv.echo = true;
  tu_on_strand(weft_udp_strand(sv.u), sock_recv_start, &sv);
  struct sockaddr_storage me;
  int fd = plain_udp(AF_INET, &me);
  unsigned total = (unsigned)TU_SCALED(2000, 256);
  uint64_t seed = 7;
  static unsigned char out[BURST][1400], in[1500];
  size_t lens[BURST];
  for (unsigned done = 0; done < total; done += BURST) {
    for (unsigned i = 0; i < BURST; i++) {
      lens[i] = 1 + tu_rand(&seed) % 1400;
      for (size_t k = 0; k < lens[i]; k++)
        out[i][k] = (unsigned char)(done + i + k);
      ssize_t n = sendto(fd, out[i], lens[i], 0, (struct sockaddr *)&sv.bound,
                         addr_len(&sv.bound));
      assert_int_equal(n, (ssize_t)lens[i]);
    }
    for (unsigned i = 0; i < BURST; i++) {
      struct sockaddr_storage from;
      socklen_t fl = sizeof from;
      ssize_t n = recvfrom(fd, in, sizeof in, 0, (struct sockaddr *)&from, &fl);
      if (n < 0)
        fail_msg("no echo of datagram %u: %s", done + i, strerror(errno));
      assert_int_equal(n, (ssize_t)lens[i]);
      assert_memory_equal(in, out[i], lens[i]);
      assert_int_equal(tu_addr_port((struct sockaddr *)&from), sock_port(&sv));
    }
  }
  close(fd);
  tu_assert_rc(weft_udp_close(sv.u), 0);
  tu_event_wait(&sv.closed, 1, "the close callback");
  rt_end(rt);
  sock_fini(&sv);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

#define NPAIR 1000

typedef struct burst {
  sock *from;
  const struct sockaddr_storage *to;
  unsigned base, n;
} burst;

/* On the sender's strand: n datagrams, the i-th of i % 200 bytes with
 * first byte i & 0xff (a zero-length one first). */
static void send_burst(void *arg) {
  burst *b = arg;
  static unsigned char buf[256];
  for (unsigned i = b->base; i < b->base + b->n; i++) {
    size_t len = i % 200;
    memset(buf, (int)(i & 0xff), len ? len : 1);
    TU_CHECK_RC(weft_udp_send(b->from->u, buf, len,
                              (const struct sockaddr *)b->to, addr_len(b->to),
                              on_sent, b->from),
                0);
  }
}

static void pair_run(int family) {
  weft_rt *rt = rt_make(NWORKERS);
  sock a, b;
  sock_open(&a, rt, NULL, family, NULL);
  sock_open(&b, rt, NULL, family, NULL);
  tu_on_strand(weft_udp_strand(b.u), sock_recv_start, &b);
  /* In bursts the socket buffer holds: loopback UDP drops what overflows. */
  for (unsigned sent = 0; sent < NPAIR; sent += 100) {
    burst bu = {&a, &b.bound, sent, 100};
    tu_on_strand(weft_udp_strand(a.u), send_burst, &bu);
    tu_event_wait(&b.got_ev, sent + 100, "a burst of datagrams");
  }
  tu_event_wait(&a.sent_ev, NPAIR, "every send callback");
  assert_int_equal(a.sent_ok, NPAIR);
  assert_int_equal(b.got, NPAIR);
  for (unsigned i = 0; i < NPAIR; i++) {
    assert_int_equal(b.lens[i], i % 200);
    if (i % 200)
      assert_int_equal(b.first[i], i & 0xff);
  }
  assert_int_equal(tu_addr_port((struct sockaddr *)&b.from), sock_port(&a));
  assert_int_equal(b.from.ss_family, family);
  rt_end(rt);
  assert_int_equal(tu_event_get(&a.closed), 1);
  assert_int_equal(tu_event_get(&b.closed), 1);
  sock_fini(&a);
  sock_fini(&b);
}

static void test_pair_v4(void **state) {
  (void)state;
  tu_reset_async_errors();
  pair_run(AF_INET);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_pair_v6(void **state) {
  (void)state;
  tu_reset_async_errors();
  int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage a;
  loopback(&a, AF_INET6, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, addr_len(&a)) != 0) {
    if (fd >= 0)
      close(fd);
    print_message("no IPv6 loopback: skipped\n");
    skip();
  }
  close(fd);
  pair_run(AF_INET6);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_truncation(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  weft_udp_opts o = {.max_datagram = 100};
  sock s;
  sock_open(&s, rt, NULL, AF_INET, &o);
  tu_on_strand(weft_udp_strand(s.u), sock_recv_start, &s);
  struct sockaddr_storage me;
  int fd = plain_udp(AF_INET, &me);
  unsigned char buf[300];
  memset(buf, 0xab, sizeof buf);
  assert_int_equal(sendto(fd, buf, sizeof buf, 0, (struct sockaddr *)&s.bound,
                          addr_len(&s.bound)),
                   300);
  tu_event_wait(&s.got_ev, 1, "the long datagram");
  assert_int_equal(s.last_n, 100);
  assert_int_equal(s.trunc, 1);
  assert_int_equal(s.first[0], 0xab);
  close(fd);
  rt_end(rt);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

typedef struct conn_call {
  sock *s;
  const struct sockaddr_storage *to; /* NULL: disconnect */
  int rc_connect, rc_send;
  unsigned errs, sent_err; /* the socket's, read on its strand */
  int last_err, last_send_err;
} conn_call;

static void connect_and_send(void *arg) {
  conn_call *c = arg;
  c->errs = c->s->errs;
  c->sent_err = c->s->sent_err;
  c->last_err = c->s->last_err;
  c->last_send_err = c->s->last_send_err;
  c->rc_connect = weft_udp_connect(c->s->u, (const struct sockaddr *)c->to,
                                   c->to ? addr_len(c->to) : 0);
  c->rc_send = weft_udp_send(c->s->u, "x", 1, NULL, 0, on_sent, c->s);
}

/* A send the kernel refuses: to the broadcast address without the
 * broadcast flag (-EACCES, on every Linux), then one to b, which the
 * refusal must not hold up. */
typedef struct refused {
  sock *a;
  struct sockaddr_storage *to;
} refused;

static void send_refused(void *arg) {
  refused *r = arg;
  struct sockaddr_in bc = {.sin_family = AF_INET,
                           .sin_port = htons(9),
                           .sin_addr.s_addr = htonl(INADDR_BROADCAST)};
  TU_CHECK_RC(weft_udp_send(r->a->u, "x", 1, (struct sockaddr *)&bc, sizeof bc,
                            on_sent, r->a),
              0);
  TU_CHECK_RC(weft_udp_send(r->a->u, "y", 1, (struct sockaddr *)r->to,
                            addr_len(r->to), on_sent, r->a),
              0);
}

static void test_refused_send(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  sock a, b;
  sock_open(&a, rt, NULL, AF_INET, NULL);
  sock_open(&b, rt, NULL, AF_INET, NULL);
  tu_on_strand(weft_udp_strand(b.u), sock_recv_start, &b);
  refused r = {&a, &b.bound};
  tu_on_strand(weft_udp_strand(a.u), send_refused, &r);
  tu_event_wait(&a.sent_ev, 2, "both send callbacks");
  tu_event_wait(&b.got_ev, 1, "the datagram after the refused one");
  assert_int_equal(a.sent_err, 1);
  assert_int_equal(a.last_send_err, -EACCES);
  assert_int_equal(a.sent_ok, 1);
  assert_int_equal(b.got, 1);
  assert_int_equal(b.first[0], 'y');
  rt_end(rt);
  sock_fini(&a);
  sock_fini(&b);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_connected(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  sock s;
  sock_open(&s, rt, NULL, AF_INET, NULL);
  tu_on_strand(weft_udp_strand(s.u), sock_recv_start, &s);
  /* To a plain socket: the datagram arrives. */
  struct sockaddr_storage peer;
  int fd = plain_udp(AF_INET, &peer);
  conn_call c = {&s, &peer, 1, 1, 0, 0, 0, 0};
  tu_on_strand(weft_udp_strand(s.u), connect_and_send, &c);
  tu_assert_rc(c.rc_connect, 0);
  tu_assert_rc(c.rc_send, 0);
  char b[4];
  assert_int_equal(recv(fd, b, sizeof b, 0), 1);
  close(fd);
  /* To a port nobody holds now: refused, told to the receive callback or
   * to a later send's callback. */
  struct sockaddr_storage dead;
  fd = plain_udp(AF_INET, &dead);
  close(fd);
  c.to = &dead;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  do {
    tu_on_strand(weft_udp_strand(s.u), connect_and_send, &c);
    tu_assert_rc(c.rc_connect, 0);
    tu_sleep_ms(5);
  } while (c.errs == 0 && c.sent_err == 0 && tu_now_ns() < deadline);
  assert_true(c.errs > 0 || c.sent_err > 0);
  if (c.errs)
    tu_assert_rc(c.last_err, -ECONNREFUSED);
  else
    tu_assert_rc(c.last_send_err, -ECONNREFUSED);
  /* Disconnected: a send needs an address again. */
  c.to = NULL;
  tu_on_strand(weft_udp_strand(s.u), connect_and_send, &c);
  tu_assert_rc(c.rc_connect, 0);
  tu_assert_rc(c.rc_send, -EDESTADDRREQ);
  rt_end(rt);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void both_start(void *arg) {
  sock **two = arg;
  sock_recv_start(two[0]);
  sock_recv_start(two[1]);
}

static void test_fairness(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(1); /* one shard: both sockets share it */
  weft_strand *st;
  tu_strand_create(rt, &st);
  /* One strand for both: each run of a socket reads at most one budget,
   * then its kick goes behind the other's. */
  sock flood, quiet;
  sock_open(&flood, rt, st, AF_INET, NULL);
  sock_open(&quiet, rt, st, AF_INET, NULL);
  quiet.other = &flood;
  struct sockaddr_storage me;
  int fd = plain_udp(AF_INET, &me);
  int sndbuf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  for (int i = 0; i < 200; i++)
    assert_int_equal(sendto(fd, "f", 1, 0, (struct sockaddr *)&flood.bound,
                            addr_len(&flood.bound)),
                     1);
  assert_int_equal(sendto(fd, "q", 1, 0, (struct sockaddr *)&quiet.bound,
                          addr_len(&quiet.bound)),
                   1);
  /* Both start in one handler, the flooded one first. */
  sock *two[2] = {&flood, &quiet};
  tu_on_strand(st, both_start, two);
  tu_event_wait(&quiet.got_ev, 1, "the quiet socket's datagram");
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  while (tu_event_get(&flood.got_ev) < 128 && tu_now_ns() < deadline)
    tu_sleep_ms(1);
  unsigned total = (unsigned)tu_event_get(&flood.got_ev);
  assert_true(total >= 128); /* enough waited to tell */
  if (quiet.other_at_first > 64)
    fail_msg("the quiet socket waited for %u of %u flood datagrams",
             quiet.other_at_first, total);
  close(fd);
  /* The strand outlives its sockets: released once both have closed. */
  tu_assert_rc(weft_udp_close(flood.u), 0);
  tu_assert_rc(weft_udp_close(quiet.u), 0);
  tu_event_wait(&flood.closed, 1, "the flooded socket's close");
  tu_event_wait(&quiet.closed, 1, "the quiet socket's close");
  weft_strand_release(st);
  rt_end(rt);
  sock_fini(&flood);
  sock_fini(&quiet);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void mc_join(void *arg) {
  sock *s = arg;
  struct sockaddr_in g = {.sin_family = AF_INET};
  inet_pton(AF_INET, "239.255.0.1", &g.sin_addr);
  s->open_rc = weft_udp_membership(s->u, (struct sockaddr *)&g, sizeof g,
                                   if_nametoindex("lo"), 1);
  if (!s->open_rc)
    sock_recv_start(s);
}

static void mc_leave(void *arg) {
  sock *s = arg;
  struct sockaddr_in g = {.sin_family = AF_INET};
  inet_pton(AF_INET, "239.255.0.1", &g.sin_addr);
  unsigned lo = if_nametoindex("lo");
  TU_CHECK_RC(weft_udp_membership(s->u, (struct sockaddr *)&g, sizeof g, lo, 0),
              0);
  TU_CHECK_RC(weft_udp_membership(s->u, (struct sockaddr *)&g, sizeof g, lo, 0),
              -EADDRNOTAVAIL);
}

static void test_multicast(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  weft_udp_opts o = {.flags = WEFT_UDP_REUSEADDR};
  struct sockaddr_in any = {.sin_family = AF_INET};
  sock s;
  memset(&s, 0, sizeof s);
  tu_event_init(&s.closed);
  tu_event_init(&s.got_ev);
  tu_event_init(&s.sent_ev);
  tu_assert_rc(
      weft_udp_open(rt, NULL, (struct sockaddr *)&any, sizeof any, &o, &s.u),
      0);
  s.open_rc = 1;
  tu_on_strand(weft_udp_strand(s.u), sock_setup, &s);
  tu_assert_rc(s.open_rc, 0);
  s.open_rc = 1;
  tu_on_strand(weft_udp_strand(s.u), mc_join, &s);
  if (s.open_rc != 0) {
    print_message("multicast join refused (%s): skipped\n",
                  weft_strerror(s.open_rc));
    rt_end(rt);
    sock_fini(&s);
    skip();
  }
  struct sockaddr_storage me;
  int fd = plain_udp(AF_INET, &me);
  struct in_addr lo = {htonl(INADDR_LOOPBACK)};
  assert_int_equal(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &lo, sizeof lo),
                   0);
  struct sockaddr_in g = {.sin_family = AF_INET,
                          .sin_port = htons(sock_port(&s))};
  inet_pton(AF_INET, "239.255.0.1", &g.sin_addr);
  assert_int_equal(sendto(fd, "mc", 2, 0, (struct sockaddr *)&g, sizeof g), 2);
  tu_event_wait(&s.got_ev, 1, "the multicast datagram");
  assert_int_equal(s.last_n, 2);
  tu_on_strand(weft_udp_strand(s.u), mc_leave, &s);
  close(fd);
  rt_end(rt);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void send_then_close(void *arg) {
  sock *s = arg;
  struct sockaddr_storage to;
  loopback(&to, AF_INET, 9);
  for (int i = 0; i < 10; i++)
    TU_CHECK_RC(weft_udp_send(s->u, "z", 1, (struct sockaddr *)&to,
                              addr_len(&to), on_sent, s),
                0);
  TU_CHECK_RC(weft_udp_close(s->u), 0);
  TU_CHECK_RC(weft_udp_close(s->u), -EALREADY);
  TU_CHECK_RC(weft_udp_send(s->u, "z", 1, (struct sockaddr *)&to, addr_len(&to),
                            on_sent, s),
              -EBADF);
}

static void test_close_queued(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  sock s;
  sock_open(&s, rt, NULL, AF_INET, NULL);
  tu_on_strand(weft_udp_strand(s.u), send_then_close, &s);
  tu_event_wait(&s.closed, 1, "the close callback");
  assert_int_equal(s.sent_cancelled, 10);
  assert_int_equal(s.sent_ok + s.sent_err, 0);
  rt_end(rt);
  assert_int_equal(tu_event_get(&s.closed), 1);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A receive callback that stops receiving at the first datagram of a
 * batch: the rest of the batch waits, and a restart delivers it first,
 * in order, none lost. */
static void on_recv_stop_first(void *arg, weft_udp *u, long n, const void *data,
                               const struct sockaddr *from, unsigned fromlen,
                               unsigned flags) {
  sock *s = arg;
  on_recv(arg, u, n, data, from, fromlen, flags);
  if (s->got == 1)
    TU_CHECK_RC(weft_udp_recv_stop(u), 0);
}

static void recv_start_stopping(void *arg) {
  sock *s = arg;
  TU_CHECK_RC(weft_udp_recv_start(s->u, on_recv_stop_first, s), 0);
}

static void test_stop_in_callback(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  sock s;
  sock_open(&s, rt, NULL, AF_INET, NULL);
  struct sockaddr_storage from;
  int fd = plain_udp(AF_INET, &from);
  for (unsigned char i = 0; i < 10; i++) /* all wait: one batch */
    assert_int_equal(
        sendto(fd, &i, 1, 0, (struct sockaddr *)&s.bound, addr_len(&s.bound)),
        1);
  tu_on_strand(weft_udp_strand(s.u), recv_start_stopping, &s);
  tu_event_wait(&s.got_ev, 1, "the first datagram");
  tu_sleep_ms(50);
  assert_int_equal(tu_event_get(&s.got_ev), 1); /* stopped */
  tu_on_strand(weft_udp_strand(s.u), sock_recv_start, &s);
  tu_event_wait(&s.got_ev, 10, "the other nine");
  for (unsigned i = 0; i < 10; i++)
    assert_int_equal(s.first[i], i);
  close(fd);
  tu_assert_rc(weft_udp_close(s.u), 0);
  tu_event_wait(&s.closed, 1, "the close callback");
  rt_end(rt);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* A sender that keeps two datagrams queued, each callback queueing the
 * next, through a queue of 2048 bytes: the queue's bytes are reused as it
 * moves, so all ROLL_N datagrams of ROLL_LEN bytes leave, intact, though
 * together they are 60 times the queue. */
#define ROLL_N 200u
#define ROLL_LEN 600u

typedef struct roll {
  weft_udp *u;
  struct sockaddr_storage to;
  unsigned queued, done;
  int err;
  tu_event all_sent;
} roll;

static void roll_sent(void *arg, weft_udp *u, int status);

static void roll_one(roll *r) {
  unsigned char b[ROLL_LEN];
  memset(b, (int)(r->queued & 0xff), sizeof b);
  memcpy(b, &r->queued, sizeof r->queued);
  int rc = weft_udp_send(r->u, b, sizeof b, (struct sockaddr *)&r->to,
                         addr_len(&r->to), roll_sent, r);
  if (rc && !r->err)
    r->err = rc;
  r->queued += rc == 0;
}

static void roll_sent(void *arg, weft_udp *u, int status) {
  roll *r = arg;
  (void)u;
  if (status && !r->err)
    r->err = status;
  if (++r->done == ROLL_N || r->err) {
    tu_event_add(&r->all_sent, 1);
    return;
  }
  if (r->queued < ROLL_N)
    roll_one(r);
}

static void roll_start(void *arg) {
  roll_one(arg);
  roll_one(arg);
}

static void test_send_queue_reuse(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS);
  weft_udp_opts o = {.send_queue = 2048};
  sock s;
  sock_open(&s, rt, NULL, AF_INET, &o);
  roll r = {.u = s.u};
  tu_event_init(&r.all_sent);
  int fd = plain_udp(AF_INET, &r.to);
  int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  tu_on_strand(weft_udp_strand(s.u), roll_start, &r);
  for (unsigned i = 0; i < ROLL_N; i++) {
    unsigned char b[ROLL_LEN + 1], want[ROLL_LEN];
    ssize_t n = recv(fd, b, sizeof b, 0);
    assert_int_equal(n, ROLL_LEN);
    unsigned seq;
    memcpy(&seq, b, sizeof seq);
    assert_int_equal(seq, i);
    memset(want, (int)(i & 0xff), sizeof want);
    memcpy(want, &seq, sizeof seq);
    assert_memory_equal(b, want, ROLL_LEN);
  }
  tu_event_wait(&r.all_sent, 1, "every send callback");
  assert_int_equal(r.err, 0);
  assert_int_equal(r.done, ROLL_N);
  close(fd);
  tu_assert_rc(weft_udp_close(s.u), 0);
  tu_event_wait(&s.closed, 1, "the close callback");
  rt_end(rt);
  tu_event_destroy(&r.all_sent);
  sock_fini(&s);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

typedef struct bad_ctx {
  sock *s4, *s6;
} bad_ctx;

static void bad_on_strand(void *arg) {
  sock *s = arg;
  weft_udp *u = s->u;
  static char big[65600];
  struct sockaddr_storage to6, to4;
  loopback(&to6, AF_INET6, 9);
  loopback(&to4, AF_INET, 9);
  TU_CHECK_RC(weft_udp_send(u, big, 65508, (struct sockaddr *)&to4,
                            addr_len(&to4), NULL, NULL),
              -EMSGSIZE);
  TU_CHECK_RC(weft_udp_send(u, "x", 1, (struct sockaddr *)&to6, addr_len(&to6),
                            NULL, NULL),
              -EAFNOSUPPORT);
  TU_CHECK_RC(weft_udp_send(u, "x", 1, (struct sockaddr *)&to4, 2, NULL, NULL),
              -EINVAL);
  TU_CHECK_RC(weft_udp_send(u, NULL, 1, (struct sockaddr *)&to4, addr_len(&to4),
                            NULL, NULL),
              -EINVAL);
  TU_CHECK_RC(weft_udp_send(u, "x", 1, NULL, 0, NULL, NULL), -EDESTADDRREQ);
  TU_CHECK_RC(weft_udp_recv_start(u, NULL, NULL), -EINVAL);
  TU_CHECK_RC(weft_udp_membership(u, NULL, 0, 0, 1), -EINVAL);
  TU_CHECK_RC(
      weft_udp_membership(u, (struct sockaddr *)&to6, addr_len(&to6), 0, 1),
      -EAFNOSUPPORT);
  /* The queue (1000 bytes here) refuses what would overflow it. */
  TU_CHECK_RC(weft_udp_send(u, big, 600, (struct sockaddr *)&to4,
                            addr_len(&to4), NULL, NULL),
              0);
  TU_CHECK_RC(weft_udp_send(u, big, 600, (struct sockaddr *)&to4,
                            addr_len(&to4), NULL, NULL),
              -ENOBUFS);
}

static void test_bad_input(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt = rt_make(NWORKERS), *other = rt_make(NWORKERS);
  weft_strand *os;
  tu_strand_create(other, &os);
  struct sockaddr_storage a;
  loopback(&a, AF_INET, 0);
  weft_udp *u;
  struct sockaddr_un un = {.sun_family = AF_UNIX};
  weft_udp_opts bad_flags = {.flags = 64}, bad_max = {.max_datagram = 70000};
  tu_assert_rc(
      weft_udp_open(NULL, NULL, (struct sockaddr *)&a, addr_len(&a), NULL, &u),
      -EINVAL);
  tu_assert_rc(weft_udp_open(rt, NULL, NULL, 0, NULL, &u), -EINVAL);
  tu_assert_rc(
      weft_udp_open(rt, NULL, (struct sockaddr *)&a, addr_len(&a), NULL, NULL),
      -EINVAL);
  tu_assert_rc(weft_udp_open(rt, NULL, (struct sockaddr *)&a, 4, NULL, &u),
               -EINVAL);
  tu_assert_rc(
      weft_udp_open(rt, NULL, (struct sockaddr *)&un, sizeof un, NULL, &u),
      -EAFNOSUPPORT);
  tu_assert_rc(weft_udp_open(rt, NULL, (struct sockaddr *)&a, addr_len(&a),
                             &bad_flags, &u),
               -EINVAL);
  tu_assert_rc(weft_udp_open(rt, NULL, (struct sockaddr *)&a, addr_len(&a),
                             &bad_max, &u),
               -EINVAL);
  tu_assert_rc(
      weft_udp_open(rt, os, (struct sockaddr *)&a, addr_len(&a), NULL, &u),
      -EXDEV);
  /* A port in use. */
  struct sockaddr_storage held;
  int fd = plain_udp(AF_INET, &held);
  tu_assert_rc(weft_udp_open(rt, NULL, (struct sockaddr *)&held,
                             addr_len(&held), NULL, &u),
               -EADDRINUSE);
  close(fd);
  weft_udp_opts small = {.send_queue = 1000};
  sock s;
  sock_open(&s, rt, NULL, AF_INET, &small);
  tu_on_strand(weft_udp_strand(s.u), bad_on_strand, &s);
  /* Off the strand. */
  tu_assert_rc(weft_udp_send(s.u, "x", 1, (struct sockaddr *)&a, addr_len(&a),
                             NULL, NULL),
               -EPERM);
  tu_assert_rc(weft_udp_recv_start(s.u, on_recv, &s), -EPERM);
  tu_assert_rc(weft_udp_set_data(s.u, NULL, NULL), -EPERM);
  tu_assert_rc(weft_udp_close(NULL), -EINVAL);
  assert_null(weft_udp_data(NULL));
  assert_null(weft_udp_strand(NULL));
  /* A shutdown closes it: its close callback once; open is refused. */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(
      weft_udp_open(rt, NULL, (struct sockaddr *)&a, addr_len(&a), NULL, &u),
      -ESHUTDOWN);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  assert_int_equal(tu_event_get(&s.closed), 1);
  sock_fini(&s);
  weft_strand_release(os);
  rt_end(other);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_echo),
      cmocka_unit_test(test_pair_v4),
      cmocka_unit_test(test_pair_v6),
      cmocka_unit_test(test_truncation),
      cmocka_unit_test(test_connected),
      cmocka_unit_test(test_refused_send),
      cmocka_unit_test(test_fairness),
      cmocka_unit_test(test_multicast),
      cmocka_unit_test(test_close_queued),
      cmocka_unit_test(test_send_queue_reuse),
      cmocka_unit_test(test_stop_in_callback),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
