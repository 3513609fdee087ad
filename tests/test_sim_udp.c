/*
 * test_sim_udp - UDP under simulation (weft/sim.h; linked with the
 * weft_sim library): sockets are ports of the simulated host, addresses
 * read as UDP ones on both ends, datagrams arrive whole and replay with
 * the seed, and lost ones (WEFT_SIM_FAULT_DROP) are what a client that
 * resends must cope with.
 *
 * The workload: a server that answers each datagram to its sender, and
 * CLIENTS clients, half of them connected to it, each sending MSGS
 * requests one at a time (a sequence number and a pattern that depends
 * on it, of varying length), resending the current one when no answer
 * comes within RETRY. The last client to finish starts the shutdown.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define CLIENTS 6
#define MSGS 40
#define RETRY 2000000ull /* ns */
#define HOUR (3600ull * 1000000000u)

struct world;

struct client {
  struct world *w;
  unsigned idx;
  weft_strand *s;
  weft_udp *u;
  weft_timer *retry;
  bool connected;
  uint32_t seq; /* the request waiting for its answer */
  unsigned resends, closed;
};

struct world {
  weft_rt *rt;
  int family;
  weft_udp *server;
  struct sockaddr_storage addr; /* the server's, as it reads */
  unsigned addrlen, finished, served;
  struct client cl[CLIENTS];
};

static unsigned msg_len(uint32_t seq) { return 8 + (seq * 37) % 900; }

static void msg_fill(unsigned char *b, uint32_t client, uint32_t seq) {
  memcpy(b, &client, 4);
  memcpy(b + 4, &seq, 4);
  for (unsigned i = 8; i < msg_len(seq); i++)
    b[i] = (unsigned char)(client * 31 + seq * 7 + i);
}

static bool msg_ok(const unsigned char *b, long n, uint32_t *client,
                   uint32_t *seq) {
  if (n < 8)
    return false;
  memcpy(client, b, 4);
  memcpy(seq, b + 4, 4);
  unsigned char want[1024];
  msg_fill(want, *client, *seq);
  return (unsigned long)n == msg_len(*seq) && !memcmp(b, want, (size_t)n);
}

static bool same_addr(const struct sockaddr *a, unsigned alen,
                      const struct sockaddr_storage *b, unsigned blen) {
  return alen == blen && !memcmp(a, b, alen);
}

static void on_request(void *arg, weft_udp *u, long n, const void *data,
                       const struct sockaddr *from, unsigned fromlen,
                       unsigned flags) {
  struct world *w = arg;
  TU_CHECK(n >= 0 && flags == 0);
  TU_CHECK(from->sa_family == w->family);
  w->served++;
  TU_CHECK(weft_udp_send(u, data, (size_t)n, from, fromlen, NULL, NULL) == 0);
}

static void send_current(struct client *k) {
  unsigned char b[1024];
  msg_fill(b, k->idx, k->seq);
  const struct sockaddr *to =
      k->connected ? NULL : (const struct sockaddr *)&k->w->addr;
  TU_CHECK(weft_udp_send(k->u, b, msg_len(k->seq), to,
                         k->connected ? 0 : k->w->addrlen, NULL, NULL) == 0);
}

static void on_retry(void *arg, int status, uint64_t missed) {
  struct client *k = arg;
  (void)missed;
  if (status || k->seq == MSGS)
    return;
  k->resends++;
  send_current(k);
  TU_CHECK(weft_timer_start(k->retry, RETRY, 0, on_retry, k) == 0);
}

static void client_done(struct client *k) {
  struct world *w = k->w;
  weft_timer_cancel(k->retry);
  TU_CHECK(weft_udp_close(k->u) == 0);
  if (++w->finished == CLIENTS) { /* one thread drives a simulation */
    TU_CHECK(weft_udp_close(w->server) == 0);
    TU_CHECK(weft_rt_shutdown(w->rt, WEFT_SHUTDOWN_NOWAIT) == 0);
  }
}

static void on_reply(void *arg, weft_udp *u, long n, const void *data,
                     const struct sockaddr *from, unsigned fromlen,
                     unsigned flags) {
  struct client *k = arg;
  (void)u;
  uint32_t client, seq;
  TU_CHECK(flags == 0);
  TU_CHECK(msg_ok(data, n, &client, &seq));
  TU_CHECK(client == k->idx);
  TU_CHECK(same_addr(from, fromlen, &k->w->addr, k->w->addrlen));
  if (seq != k->seq) { /* an answer to a resend of one answered already */
    TU_CHECK(seq < k->seq);
    return;
  }
  if (++k->seq == MSGS) {
    client_done(k);
    return;
  }
  send_current(k);
  TU_CHECK(weft_timer_start(k->retry, RETRY, 0, on_retry, k) == 0);
}

static void on_client_closed(void *data, weft_udp *u) {
  struct client *k = data;
  (void)u;
  k->closed++;
}

static void client_start(void *arg) {
  struct client *k = arg;
  struct world *w = k->w;
  TU_CHECK(weft_udp_set_data(k->u, k, on_client_closed) == 0);
  TU_CHECK(weft_udp_recv_start(k->u, on_reply, k) == 0);
  if (k->connected)
    TU_CHECK(weft_udp_connect(k->u, (struct sockaddr *)&w->addr, w->addrlen) ==
             0);
  send_current(k);
  TU_CHECK(weft_timer_start(k->retry, RETRY, 0, on_retry, k) == 0);
}

static socklen_t any_addr(int family, uint16_t port,
                          struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof(*ss));
  if (family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    a->sin6_port = htons(port);
    return sizeof(*a);
  }
  struct sockaddr_in *a = (struct sockaddr_in *)ss;
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a->sin_port = htons(port);
  return sizeof(*a);
}

/* The server's address (its port was picked), then the clients. */
static void server_start(void *arg) {
  struct world *w = arg;
  w->addrlen = sizeof(w->addr);
  TU_CHECK(weft_udp_local_addr(w->server, (struct sockaddr *)&w->addr,
                               &w->addrlen) == 0);
  TU_CHECK(weft_udp_recv_start(w->server, on_request, w) == 0);
  for (unsigned i = 0; i < CLIENTS; i++)
    TU_CHECK(weft_post(w->cl[i].s, client_start, &w->cl[i]) == 0);
}

static void on_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx; /* reported, as they should be: test_sim_stall looks closer */
}

/* One run: its simulation's state, and how many requests were resent. */
static void run(uint64_t seed, unsigned faults, int family, weft_sim_info *info,
                unsigned *resends) {
  struct world *w = calloc(1, sizeof(*w));
  assert_non_null(w);
  w->family = family;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  cfg.sim_faults = faults;
  cfg.sim_fault_odds = 16;
  cfg.on_stall = on_stall;
  assert_int_equal(weft_rt_create(&w->rt, &cfg), 0);
  struct sockaddr_storage ss;
  socklen_t len = any_addr(family, 0, &ss);
  weft_strand *srv;
  assert_int_equal(weft_strand_create(w->rt, &srv), 0);
  assert_int_equal(
      weft_udp_open(w->rt, srv, (struct sockaddr *)&ss, len, NULL, &w->server),
      0);
  for (unsigned i = 0; i < CLIENTS; i++) {
    struct client *k = &w->cl[i];
    k->w = w;
    k->idx = i;
    k->connected = i % 2;
    assert_int_equal(weft_strand_create(w->rt, &k->s), 0);
    len = any_addr(family, 0, &ss);
    assert_int_equal(
        weft_udp_open(w->rt, k->s, (struct sockaddr *)&ss, len, NULL, &k->u),
        0);
    assert_int_equal(weft_timer_create(w->rt, k->s, &k->retry), 0);
  }
  assert_int_equal(weft_post(srv, server_start, w), 0);
  int r = weft_rt_wait(w->rt, HOUR);
  if (r != 0 || *tu_async_errors())
    printf("# seed %" PRIu64 " (faults %u, family %d) failed: wait %d, %u "
           "finished\n",
           seed, faults, family, r, w->finished);
  assert_int_equal(r, 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(weft_rt_sim_info(w->rt, info), 0);
  *resends = 0;
  for (unsigned i = 0; i < CLIENTS; i++) {
    struct client *k = &w->cl[i];
    assert_int_equal(k->seq, MSGS);
    assert_int_equal(k->closed, 1);
    *resends += k->resends;
    weft_timer_destroy(k->retry);
    weft_strand_release(k->s);
  }
  weft_strand_release(srv);
  assert_int_equal(weft_rt_destroy(w->rt), 0);
  /* The picked port reads as one of the host's, on the loopback address. */
  struct sockaddr_storage want;
  uint16_t port =
      ntohs(family == AF_INET ? ((struct sockaddr_in *)&w->addr)->sin_port
                              : ((struct sockaddr_in6 *)&w->addr)->sin6_port);
  assert_true(port >= 32768);
  assert_int_equal(w->addrlen, any_addr(family, port, &want));
  assert_memory_equal(&w->addr, &want, w->addrlen);
  free(w);
}

/* Without faults nothing is lost: no client resends; the same seed
 * gives the same run; seeds differ. */
static void test_echo(void **state) {
  (void)state;
  weft_sim_info a, b;
  unsigned ra, rb;
  run(1, 0, AF_INET, &a, &ra);
  run(1, 0, AF_INET, &b, &rb);
  assert_int_equal(a.log_hash, b.log_hash);
  unsigned n = (unsigned)TU_SCALED(300, 20), distinct = 0;
  uint64_t prev = 0;
  for (unsigned i = 0; i < n; i++) {
    run(100 + i, 0, i % 4 ? AF_INET : AF_INET6, &a, &ra);
    assert_int_equal(ra, 0);
    distinct += a.log_hash != prev;
    prev = a.log_hash;
  }
  assert_int_equal(distinct, n);
  printf("# UDP: %u seeds (a quarter over IPv6), nothing lost\n", n);
}

/* Lost datagrams, delays and stalls: every request is answered in the
 * end, by resending; the same seed replays the same losses. */
static void test_losses(void **state) {
  (void)state;
  const unsigned faults =
      WEFT_SIM_FAULT_DROP | WEFT_SIM_FAULT_DELAY | WEFT_SIM_FAULT_STALL;
  weft_sim_info a, b;
  unsigned ra, rb;
  run(7, faults, AF_INET, &a, &ra);
  run(7, faults, AF_INET, &b, &rb);
  assert_int_equal(a.log_hash, b.log_hash);
  assert_int_equal(ra, rb);
  unsigned n = (unsigned)TU_SCALED(300, 20);
  uint64_t resends = 0, injected = 0;
  for (unsigned i = 0; i < n; i++) {
    run(1000 + i, faults, i % 4 ? AF_INET : AF_INET6, &a, &ra);
    resends += ra;
    injected += a.faults;
  }
  printf("# UDP with losses: %u seeds, %" PRIu64 " faults, %" PRIu64
         " resends\n",
         n, injected, resends);
  assert_true(resends > 0);
  /* Drops alone, so that the resends are theirs (a stall longer than
   * RETRY resends too). */
  resends = injected = 0;
  for (unsigned i = 0; i < n / 4; i++) {
    run(5000 + i, WEFT_SIM_FAULT_DROP, AF_INET, &a, &ra);
    resends += ra;
    injected += a.faults;
  }
  assert_true(injected > 0);
  assert_true(resends >= injected / 2);
}

static int g_status[2] = {1, 1};
static void sent(void *arg, weft_udp *u, int status) {
  (void)u;
  *(int *)arg = status;
}

static void nobody_fn(void *arg) {
  weft_udp *u = arg;
  struct sockaddr_storage to;
  socklen_t len = any_addr(AF_INET, 9, &to); /* nobody holds port 9 */
  TU_CHECK(weft_udp_send(u, "x", 1, (struct sockaddr *)&to, len, sent,
                         &g_status[0]) == 0);
  TU_CHECK(weft_udp_connect(u, (struct sockaddr *)&to, len) == 0);
  TU_CHECK(weft_udp_send(u, "y", 1, NULL, 0, sent, &g_status[1]) == 0);
  struct sockaddr_storage group;
  len = any_addr(AF_INET, 0, &group);
  ((struct sockaddr_in *)&group)->sin_addr.s_addr = htonl(0xe0000001);
  TU_CHECK(weft_udp_membership(u, (struct sockaddr *)&group, len, 0, 1) ==
           -ENOTSUP);
}

static unsigned g_picked;
static void picked_port(void *arg) {
  struct sockaddr_storage ss;
  unsigned len = sizeof(ss);
  TU_CHECK(weft_udp_local_addr(arg, (struct sockaddr *)&ss, &len) == 0);
  g_picked = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* A datagram to a port nobody holds is lost, as UDP's is; a connected
 * socket hears of the refusal. A port is held once, and a port 0 picks
 * one nobody holds; there are no multicast groups on one simulated host. */
static void test_nobody_there(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 3;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  struct sockaddr_storage ss;
  socklen_t len = any_addr(AF_INET, 4000, &ss);
  weft_udp *u, *dup, *first, *picked;
  assert_int_equal(
      weft_udp_open(rt, NULL, (struct sockaddr *)&ss, len, NULL, &u), 0);
  assert_int_equal(
      weft_udp_open(rt, NULL, (struct sockaddr *)&ss, len, NULL, &dup),
      -EADDRINUSE);
  /* A port 0 passes over the first ephemeral port, held explicitly. */
  len = any_addr(AF_INET, 32768, &ss);
  assert_int_equal(
      weft_udp_open(rt, NULL, (struct sockaddr *)&ss, len, NULL, &first), 0);
  len = any_addr(AF_INET, 0, &ss);
  assert_int_equal(
      weft_udp_open(rt, NULL, (struct sockaddr *)&ss, len, NULL, &picked), 0);
  assert_int_equal(weft_post(weft_udp_strand(picked), picked_port, picked), 0);
  assert_int_equal(weft_post(weft_udp_strand(u), nobody_fn, u), 0);
  assert_int_equal(weft_rt_wait(rt, RETRY), -ETIMEDOUT);
  assert_int_equal(weft_rt_shutdown(rt, 0), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(g_status[0], 0);
  assert_int_equal(g_status[1], -ECONNREFUSED);
  assert_int_equal(g_picked, 32769);
  assert_int_equal(weft_rt_destroy(rt), 0);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_echo),
      cmocka_unit_test(test_losses),
      cmocka_unit_test(test_nobody_there),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
