/*
 * test_sim - simulated runtimes (weft.h, "Simulation"; linked with the
 * weft_sim library): a seed gives one run, handler for handler, and its
 * log; other seeds give other interleavings; virtual time jumps to the
 * next deadline; the waits, a cancelling shutdown and what a simulation
 * refuses behave as documented; WEFT_SIM_SEED overrides the seed a
 * configuration sets (the crash line's replay); a crash names its seed;
 * a client's port is one nobody holds, after the ephemeral ports wrap
 * too (test_client_ports_wrap).
 *
 * The workload is a small bank: accounts on strands of their own, each
 * sending a chain of transfers to others (a debit on its strand, then a
 * credit posted to the other's), a timer per account with deadlines that
 * tie across accounts, and a blocking job per account whose done runs on
 * the account's strand. The last credit starts the shutdown. The test
 * keeps its own log of which handler ran for which account, in order,
 * independent of weft's.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#define ACCOUNTS 8
#define TRANSFERS 20
#define START_BALANCE 1000
#define LOG_MAX 1024

enum { K_DEBIT = 1, K_CREDIT, K_TICK, K_JOB, K_DONE };

struct bank;

struct account {
  struct bank *b;
  unsigned idx;
  weft_strand *s;
  weft_timer *t;
  long balance; /* on s only */
  unsigned sent;
  uint64_t rng; /* tu_rand */
  unsigned ticks;
  long job_result;
};

struct credit {
  struct account *to;
  long amount;
};

struct bank {
  weft_rt *rt;
  struct account acct[ACCOUNTS];
  unsigned credits, credits_due;
  uint32_t log[LOG_MAX];
  unsigned nlog;
  uint64_t t0;                /* weft_now_ns when the timers were started */
  uint64_t tick_at[ACCOUNTS]; /* weft_now_ns at each account's first tick */
};

/* What a run left behind, to compare runs. */
struct result {
  uint64_t log_hash; /* of the test's own log */
  unsigned nlog;
  weft_sim_info info;
  long total;
};

/* A simulation runs every handler on the waiting thread: plain writes. */
static void note(struct bank *b, unsigned kind, unsigned idx) {
  if (b->nlog < LOG_MAX)
    b->log[b->nlog++] = kind << 8 | idx;
}

static void credit_fn(void *arg) {
  struct credit *c = arg;
  struct bank *b = c->to->b;
  TU_CHECK(weft_strand_current() == c->to->s);
  c->to->balance += c->amount;
  note(b, K_CREDIT, c->to->idx);
  free(c);
  if (++b->credits == b->credits_due)
    TU_CHECK(weft_rt_shutdown(b->rt, WEFT_SHUTDOWN_NOWAIT) == 0);
}

/* One debit, then the next one queued behind whatever else the strand has:
 * a chain per account, interleaving with the others'. */
static void debit_fn(void *arg) {
  struct account *a = arg;
  struct bank *b = a->b;
  TU_CHECK(weft_strand_current() == a->s);
  unsigned to = (a->idx + 1 + tu_rand(&a->rng) % (ACCOUNTS - 1)) % ACCOUNTS;
  struct credit *c = malloc(sizeof(*c));
  TU_CHECK(c != NULL);
  c->to = &b->acct[to];
  c->amount = 1 + tu_rand(&a->rng) % 50;
  a->balance -= c->amount;
  note(b, K_DEBIT, a->idx);
  TU_CHECK(weft_post(c->to->s, credit_fn, c) == 0);
  if (++a->sent < TRANSFERS)
    TU_CHECK(weft_post(a->s, debit_fn, a) == 0);
}

static void tick_fn(void *arg, int status, uint64_t missed) {
  struct account *a = arg;
  (void)missed;
  if (status)
    return; /* the shutdown's -ECANCELED: the timer's last call */
  if (!a->ticks++)
    a->b->tick_at[a->idx] = weft_now_ns();
  note(a->b, K_TICK, a->idx);
}

static long job_work(void *arg) {
  struct account *a = arg;
  note(a->b, K_JOB, a->idx);
  return (long)a->idx * 7;
}

static void job_done(void *arg, long result) {
  struct account *a = arg;
  TU_CHECK(weft_strand_current() == a->s);
  a->job_result = result;
  note(a->b, K_DONE, a->idx);
}

static uint64_t fnv(const uint32_t *w, unsigned n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned i = 0; i < n; i++) {
    h ^= w[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static void run_bank(uint64_t seed, struct result *out) {
  struct bank *b = calloc(1, sizeof(*b));
  assert_non_null(b);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  assert_int_equal(weft_rt_create(&b->rt, &cfg), 0);
  b->credits_due = ACCOUNTS * TRANSFERS;
  b->t0 = weft_now_ns(); /* the clock stands still outside the waits */
  for (unsigned i = 0; i < ACCOUNTS; i++) {
    struct account *a = &b->acct[i];
    a->b = b;
    a->idx = i;
    a->balance = START_BALANCE;
    a->rng = 0x9e3779b97f4a7c15ull * (i + 1);
    assert_int_equal(weft_strand_create(b->rt, &a->s), 0);
    assert_int_equal(weft_timer_create(b->rt, a->s, &a->t), 0);
    /* Deadlines tie in pairs: 10 us, 10 us, 20 us, 20 us, ... */
    assert_int_equal(
        weft_timer_start(a->t, 10000 * (i / 2 + 1), 15000, tick_fn, a), 0);
    assert_int_equal(weft_blocking(b->rt, job_work, a, a->s, job_done, NULL),
                     0);
    assert_int_equal(weft_post(a->s, debit_fn, a), 0);
  }
  /* The last credit starts the shutdown; the wait runs the simulation. */
  assert_int_equal(weft_rt_wait(b->rt, 60ull * 1000000000u), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  assert_int_equal(weft_rt_sim_info(b->rt, &out->info), 0);
  out->total = 0;
  for (unsigned i = 0; i < ACCOUNTS; i++) {
    struct account *a = &b->acct[i];
    out->total += a->balance;
    assert_int_equal(a->sent, TRANSFERS);
    assert_int_equal(a->job_result, (long)i * 7);
    assert_true(a->ticks >= 1);
    /* Never early; late by the wheel's granularity and steps. */
    uint64_t due = 10000 * (i / 2 + 1);
    assert_true(b->tick_at[i] >= b->t0 + due);
    assert_true(b->tick_at[i] < b->t0 + due + 1000000);
    weft_timer_destroy(a->t);
    weft_strand_release(a->s);
  }
  assert_int_equal(b->credits, ACCOUNTS * TRANSFERS);
  out->log_hash = fnv(b->log, b->nlog);
  out->nlog = b->nlog;
  assert_int_equal(weft_rt_destroy(b->rt), 0);
  free(b);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? 2 * cap : 65536;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (!got)
      break;
    n += got;
  }
  fclose(f);
  *len = n;
  return buf;
}

/* The same seed twice: the same calls in the same order at the same
 * virtual times, by the test's log, weft's hash and weft's written log. */
static void test_same_seed_same_run(void **state) {
  (void)state;
  char p1[] = "/tmp/weft-sim-log-XXXXXX", p2[] = "/tmp/weft-sim-log-XXXXXX";
  int f1 = mkstemp(p1), f2 = mkstemp(p2);
  assert_true(f1 >= 0 && f2 >= 0);
  close(f1);
  close(f2);
  struct result r1, r2;
  setenv("WEFT_SIM_LOG", p1, 1);
  run_bank(42, &r1);
  setenv("WEFT_SIM_LOG", p2, 1);
  run_bank(42, &r2);
  unsetenv("WEFT_SIM_LOG");
  assert_int_equal(r1.total, ACCOUNTS * START_BALANCE);
  assert_int_equal(r1.info.seed, 42);
  assert_true(r1.info.handlers > ACCOUNTS * TRANSFERS * 2);
  assert_int_equal(r1.log_hash, r2.log_hash);
  assert_int_equal(r1.nlog, r2.nlog);
  assert_int_equal(r1.info.log_hash, r2.info.log_hash);
  assert_int_equal(r1.info.handlers, r2.info.handlers);
  assert_int_equal(r1.info.steps, r2.info.steps);
  assert_int_equal(r1.info.now_ns, r2.info.now_ns);
  size_t n1, n2;
  char *l1 = slurp(p1, &n1), *l2 = slurp(p2, &n2);
  assert_true(n1 > 0);
  assert_int_equal(n1, n2);
  assert_memory_equal(l1, l2, n1);
  /* A line per call, and one per user function a trampoline of weft's
   * calls (a timer's, a job's done). */
  uint64_t lines = 0;
  for (size_t i = 0; i < n1; i++)
    lines += l1[i] == '\n';
  assert_true(lines >= r1.info.handlers);
  free(l1);
  free(l2);
  unlink(p1);
  unlink(p2);
}

/* Another process (this program again, --hash SEED): other addresses
 * (ASLR, malloc), the same run. */
static void run_in_child(const char *what, uint64_t seed, char *out,
                         size_t len) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "/proc/%d/exe --hash %s %" PRIu64, (int)getpid(),
           what, seed);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, len - 1, f);
  out[n] = 0;
  assert_int_equal(pclose(f), 0);
}

static uint64_t run_net(uint64_t seed, unsigned faults, unsigned odds,
                        weft_sim_info *info);

static void print_hash(const char *what, uint64_t seed) {
  struct result r;
  if (strcmp(what, "net") == 0)
    r.log_hash = run_net(seed, 0, 0, &r.info);
  else
    run_bank(seed, &r);
  printf("%016" PRIx64 " %016" PRIx64 " %" PRIu64 " %" PRIu64 "\n", r.log_hash,
         r.info.log_hash, r.info.handlers, r.info.now_ns);
}

/* The bank and the echo test (below), each run twice in processes of
 * their own. */
static void test_same_seed_other_process(void **state) {
  (void)state;
  const char *what[] = {"bank", "net"};
  for (int i = 0; i < 2; i++) {
    char a[256], b[256];
    run_in_child(what[i], 42, a, sizeof(a));
    run_in_child(what[i], 42, b, sizeof(b));
    assert_true(strlen(a) > 40);
    assert_string_equal(a, b);
    run_in_child(what[i], 43, b, sizeof(b));
    assert_string_not_equal(a, b);
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Seeds 1..N: every run keeps the bank's invariants, and the runs' orders
 * differ (the test's own log: which account's handler ran, in order). */
static void test_seeds_differ(void **state) {
  (void)state;
  unsigned n = (unsigned)TU_SCALED(1000, 100);
  uint64_t *orders = calloc(n, sizeof(*orders));
  uint64_t *hashes = calloc(n, sizeof(*hashes));
  assert_true(orders && hashes);
  for (unsigned i = 0; i < n; i++) {
    struct result r;
    run_bank(i + 1, &r);
    assert_int_equal(r.total, ACCOUNTS * START_BALANCE);
    orders[i] = r.log_hash;
    hashes[i] = r.info.log_hash;
  }
  unsigned distinct[2] = {1, 1};
  uint64_t *sets[2] = {orders, hashes};
  for (int k = 0; k < 2; k++) {
    qsort(sets[k], n, sizeof(uint64_t), cmp_u64);
    for (unsigned i = 1; i < n; i++)
      distinct[k] += sets[k][i] != sets[k][i - 1];
  }
  printf("# %u seeds: %u distinct orders, %u distinct weft logs\n", n,
         distinct[0], distinct[1]);
  assert_true(distinct[0] >= n * 9 / 10);
  assert_true(distinct[1] >= distinct[0]);
  free(orders);
  free(hashes);
}

/* ---- the network: Unix sockets --------------------------------------- */

#define CLIENTS 6
#define MSGS 12
#define MSG_LEN 16
#define BIG_LEN 20000 /* each client's last message: many pieces */

struct echo_conn {
  char buf[256];
};

struct net;

struct net_client {
  struct net *n;
  unsigned idx, sent;
  char out[BIG_LEN], in[BIG_LEN];
  size_t len, got;
  bool failed; /* a connect that failed, or a connection that broke */
};

struct net {
  weft_rt *rt;
  weft_listener *l;
  unsigned faults;              /* WEFT_SIM_FAULT_* */
  struct sockaddr_storage addr; /* the listener's */
  unsigned addrlen;
  uint16_t port; /* TCP: the listener's */
  struct net_client cl[CLIENTS];
  unsigned ended, accepted, server_closed, echoed, failed;
  uint32_t log[1024];
  unsigned nlog;
};

static struct net *g_net;          /* the server's callbacks count here */
static unsigned g_net_echoed;      /* the last run's echoes */
static int g_net_family = AF_UNIX; /* or AF_INET: TCP, simulated */

/* The port of a TCP connection's local or peer address (0: not TCP). */
static uint16_t conn_port(weft_tcp *c, bool peer) {
  struct sockaddr_storage a;
  unsigned len = sizeof(a);
  int r = peer ? weft_tcp_peer_addr(c, (struct sockaddr *)&a, &len)
               : weft_tcp_local_addr(c, (struct sockaddr *)&a, &len);
  if (r || a.ss_family != AF_INET)
    return 0;
  struct sockaddr_in *in = (struct sockaddr_in *)&a;
  TU_CHECK(in->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
  return ntohs(in->sin_port);
}

static void net_note(struct net *n, unsigned kind, unsigned idx) {
  if (n->nlog < 1024)
    n->log[n->nlog++] = kind << 8 | idx;
}

static void echo_read(void *arg, weft_tcp *c, long n);

static void echo_written(void *arg, weft_tcp *c, int status) {
  struct echo_conn *e = arg;
  if (status < 0 || weft_tcp_read(c, e->buf, sizeof(e->buf), echo_read, e))
    weft_tcp_close(c, 0);
}

static void echo_read(void *arg, weft_tcp *c, long n) {
  struct echo_conn *e = arg;
  if (n > 0 && weft_tcp_write(c, e->buf, (size_t)n, echo_written, e) == 0)
    return;
  weft_tcp_close(c, 0);
}

static void echo_closed(void *data, weft_tcp *c) {
  (void)c;
  free(data);
  g_net->server_closed++;
}

static void echo_accept(void *arg, weft_tcp *c) {
  struct net *n = arg;
  struct echo_conn *e = malloc(sizeof(*e));
  TU_CHECK(e != NULL);
  TU_CHECK(weft_tcp_set_data(c, e, echo_closed) == 0);
  if (g_net_family == AF_INET) { /* a TCP connection's addresses */
    TU_CHECK(conn_port(c, false) == n->port);
    TU_CHECK(conn_port(c, true) != 0 && conn_port(c, true) != n->port);
    TU_CHECK(weft_tcp_nodelay(c, 1) == 0);
  }
  n->accepted++;
  net_note(n, 1, 0);
  if (weft_tcp_read(c, e->buf, sizeof(e->buf), echo_read, e))
    weft_tcp_close(c, 0);
}

/* A client is done: its connection closed, or its connect failed at
 * once. The last one starts the shutdown. */
static void client_ended(struct net *n) {
  if (++n->ended == CLIENTS)
    TU_CHECK(weft_rt_shutdown(n->rt, WEFT_SHUTDOWN_NOWAIT) == 0);
}

static void client_closed(void *data, weft_tcp *c) {
  struct net_client *k = data;
  (void)c;
  net_note(k->n, 2, k->idx);
  k->n->failed += k->failed;
  client_ended(k->n);
}

/* An error or an early end: only a fault may cause one. */
static void client_fail(struct net_client *k, weft_tcp *c, const char *what,
                        long r) {
  TU_CHECKF(k->n->faults, "client %u: %s %ld without faults", k->idx, what, r);
  k->failed = true;
  weft_tcp_close(c, 0);
}

static void client_send(struct net_client *k, weft_tcp *c);

static void client_read(void *arg, weft_tcp *c, long r) {
  struct net_client *k = arg;
  if (r <= 0) {
    client_fail(k, c, "read", r);
    return;
  }
  /* Every byte that comes back is the one sent there. */
  TU_CHECK(memcmp(k->in + k->got, k->out + k->got, (size_t)r) == 0);
  k->got += (size_t)r;
  if (k->got < k->len) { /* a short read: the rest follows */
    if (weft_tcp_read(c, k->in + k->got, k->len - k->got, client_read, k))
      client_fail(k, c, "read again", 0);
    return;
  }
  k->n->echoed++;
  net_note(k->n, 3, k->idx);
  if (++k->sent < MSGS)
    client_send(k, c);
  else
    weft_tcp_close(c, 0);
}

static void client_written(void *arg, weft_tcp *c, int status) {
  struct net_client *k = arg;
  if (status)
    client_fail(k, c, "write", status);
}

static void client_send(struct net_client *k, weft_tcp *c) {
  k->len = k->sent == MSGS - 1 ? BIG_LEN : MSG_LEN;
  for (size_t i = 0; i < k->len; i++)
    k->out[i] = (char)('a' + (k->idx * 7 + k->sent * 3 + i) % 26);
  k->got = 0;
  if (weft_tcp_write(c, k->out, k->len, client_written, k) ||
      weft_tcp_read(c, k->in, k->len, client_read, k))
    client_fail(k, c, "queue", 0);
}

static void client_connected(void *arg, weft_tcp *c, int status) {
  struct net_client *k = arg;
  TU_CHECK(weft_tcp_set_data(c, k, client_closed) == 0);
  if (!status && g_net_family == AF_INET)
    TU_CHECK(conn_port(c, true) == k->n->port && conn_port(c, false) != 0);
  if (status) { /* the connection closes itself */
    TU_CHECKF(k->n->faults, "client %u: connect %d", k->idx, status);
    k->failed = true;
    return;
  }
  client_send(k, c);
}

/* An echo server and CLIENTS clients over an abstract Unix socket, all in
 * one simulated runtime, with faults (WEFT_SIM_FAULT_*) or without.
 * Returns the hash of the test's own log. */
/* Stalls reported (WEFT_SIM_FAULT_STALL), on the driving thread. */
static unsigned g_net_stalls;
static void net_stall(const weft_stall *st, void *ctx) {
  (void)st;
  (void)ctx;
  g_net_stalls++;
}

static uint64_t run_net(uint64_t seed, unsigned faults, unsigned odds,
                        weft_sim_info *info) {
  struct net *n = calloc(1, sizeof(*n));
  assert_non_null(n);
  g_net = n;
  n->faults = faults;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  cfg.sim_faults = faults;
  cfg.sim_fault_odds = odds;
  cfg.on_stall = net_stall;
  assert_int_equal(weft_rt_create(&n->rt, &cfg), 0);
  n->addrlen =
      tu_listen_addr(&n->addr, g_net_family == AF_INET, "weft-test-sim");
  assert_int_equal(weft_tcp_listen(n->rt, (struct sockaddr *)&n->addr,
                                   n->addrlen, NULL, echo_accept, n, &n->l),
                   0);
  if (g_net_family == AF_INET) {
    n->addrlen = sizeof(n->addr);
    assert_int_equal(
        weft_listener_addr(n->l, (struct sockaddr *)&n->addr, &n->addrlen), 0);
    n->port = ntohs(((struct sockaddr_in *)&n->addr)->sin_port);
    assert_int_equal(n->addrlen, sizeof(struct sockaddr_in));
    assert_true(n->port != 0);
  }
  for (unsigned i = 0; i < CLIENTS; i++) {
    struct net_client *k = &n->cl[i];
    k->n = n;
    k->idx = i;
    weft_tcp *c;
    int r = weft_tcp_connect(n->rt, NULL, (struct sockaddr *)&n->addr,
                             n->addrlen, 0, client_connected, k, &c);
    if ((r == -EMFILE || r == -ENOMEM) && faults) { /* "ran out" */
      k->failed = true;
      n->failed++;
      client_ended(n);
      continue;
    }
    assert_int_equal(r, 0);
  }
  assert_int_equal(weft_rt_wait(n->rt, 60ull * 1000000000u), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  /* Every client ended once; every connection the server accepted closed
   * once; without faults, every message came back. */
  assert_int_equal(n->ended, CLIENTS);
  assert_int_equal(n->server_closed, n->accepted);
  if (!faults) {
    assert_int_equal(n->echoed, CLIENTS * MSGS);
    assert_int_equal(n->failed, 0);
  }
  assert_int_equal(weft_rt_sim_info(n->rt, info), 0);
  g_net_echoed = n->echoed;
  uint64_t h = fnv(n->log, n->nlog);
  assert_int_equal(weft_rt_destroy(n->rt), 0);
  free(n);
  return h;
}

/* Sockets in a simulation: every message echoed, every connection closed
 * once on each side; one seed gives one run, seeds give many. */
static void test_unix_sockets(void **state) {
  (void)state;
  weft_sim_info a, b;
  uint64_t h1 = run_net(11, 0, 0, &a), h2 = run_net(11, 0, 0, &b);
  assert_int_equal(h1, h2);
  assert_int_equal(a.log_hash, b.log_hash);
  assert_int_equal(a.now_ns, b.now_ns);
  assert_int_equal(a.faults, 0);
  unsigned nseeds = (unsigned)TU_SCALED(200, 25);
  uint64_t *hs = calloc(nseeds, sizeof(*hs));
  assert_non_null(hs);
  for (unsigned i = 0; i < nseeds; i++)
    hs[i] = run_net(100 + i, 0, 0, &a);
  qsort(hs, nseeds, sizeof(*hs), cmp_u64);
  unsigned distinct = 1;
  for (unsigned i = 1; i < nseeds; i++)
    distinct += hs[i] != hs[i - 1];
  printf("# %u seeds of the echo test: %u distinct orders\n", nseeds, distinct);
  assert_true(distinct >= nseeds * 9 / 10);
  free(hs);
}

/* TCP addresses in a simulation: 127.0.0.1 and a port the simulated host
 * picks, addresses that read as TCP ones on both ends, options that
 * apply; the same run for a seed, and the faults' invariants; a port 0
 * that passes over a port held. UDP has a test of its own (test_sim_udp). */
static void test_tcp_sockets(void **state) {
  (void)state;
  g_net_family = AF_INET;
  weft_sim_info a, b;
  assert_int_equal(run_net(5, 0, 0, &a), run_net(5, 0, 0, &b));
  assert_int_equal(a.log_hash, b.log_hash);
  unsigned nseeds = (unsigned)TU_SCALED(100, 10), whole = 0;
  for (unsigned i = 0; i < nseeds; i++)
    run_net(300 + i, 0, 0, &a);
  for (unsigned i = 0; i < nseeds; i++) {
    run_net(400 + i, WEFT_SIM_FAULT_ALL, 512, &a);
    whole += g_net_echoed == CLIENTS * MSGS;
  }
  printf("# TCP: %u seeds, and %u with faults (%u whole)\n", nseeds, nseeds,
         whole);
  g_net_family = AF_UNIX;
  /* A port 0 passes over the first ephemeral port, held explicitly. */
  weft_rt *rt;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 9;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  struct sockaddr_in in = {.sin_family = AF_INET,
                           .sin_port = htons(32768),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *held, *picked;
  assert_int_equal(weft_tcp_listen(rt, (struct sockaddr *)&in, sizeof(in), NULL,
                                   echo_accept, NULL, &held),
                   0);
  in.sin_port = 0;
  assert_int_equal(weft_tcp_listen(rt, (struct sockaddr *)&in, sizeof(in), NULL,
                                   echo_accept, NULL, &picked),
                   0);
  unsigned len = sizeof(in);
  assert_int_equal(weft_listener_addr(picked, (struct sockaddr *)&in, &len), 0);
  assert_int_equal(ntohs(in.sin_port), 32769);
  assert_int_equal(weft_rt_destroy(rt), 0);
}

/* The same with faults: refused connects, broken connections,
 * descriptors or memory running out, small buffers, a slow network,
 * handlers that block, each kind alone and all together. Each run keeps the
 * invariants; each kind strikes over the seeds, and alone leaves some runs
 * whole. The same seed replays the same faults. */
static void test_unix_sockets_faults(void **state) {
  (void)state;
  weft_sim_info a, b;
  assert_int_equal(run_net(7, WEFT_SIM_FAULT_ALL, 64, &a),
                   run_net(7, WEFT_SIM_FAULT_ALL, 64, &b));
  assert_int_equal(a.log_hash, b.log_hash);
  assert_int_equal(a.faults, b.faults);
  /* Odds by how many chances a run gives each kind: a connect or an
   * accept per client, a break at each of hundreds of receives and sends. */
  static const struct {
    const char *name;
    unsigned kinds, odds;
  } sets[] = {{"refuse", WEFT_SIM_FAULT_REFUSE, 8},
              {"break", WEFT_SIM_FAULT_BREAK, 1024},
              {"emfile", WEFT_SIM_FAULT_EMFILE, 8},
              {"smallbuf", WEFT_SIM_FAULT_SMALLBUF, 4},
              {"enomem", WEFT_SIM_FAULT_ENOMEM, 16},
              {"delay", WEFT_SIM_FAULT_DELAY, 4},
              {"stall", WEFT_SIM_FAULT_STALL, 64},
              {"all", WEFT_SIM_FAULT_ALL, 512}};
  unsigned nseeds = (unsigned)TU_SCALED(200, 20);
  for (unsigned k = 0; k < sizeof(sets) / sizeof(sets[0]); k++) {
    unsigned whole = 0, hit = 0;
    uint64_t faults = 0;
    g_net_stalls = 0;
    for (unsigned i = 0; i < nseeds; i++) {
      run_net(1000 + i, sets[k].kinds, sets[k].odds, &a);
      faults += a.faults;
      hit += a.faults > 0;
      whole += g_net_echoed == CLIENTS * MSGS;
    }
    printf("# %s: %u seeds, %" PRIu64 " faults in %u runs, %u runs echoed "
           "everything\n",
           sets[k].name, nseeds, faults, hit, whole);
    assert_true(hit > 0);
    /* One kind alone leaves some runs whole; all together may not. */
    assert_true(whole > 0 || sets[k].kinds == WEFT_SIM_FAULT_ALL);
    /* Up to 3 thresholds: many are long enough for the monitor. */
    if (sets[k].kinds == WEFT_SIM_FAULT_STALL)
      assert_true(g_net_stalls > 0);
  }
}

/* ---- the simulated host's client ports --------------------------------- */

#define WRAP_CONNECTS (65536u - 32768u + 1u) /* the last one after the wrap */

struct wrap {
  weft_rt *rt;
  weft_strand *s;
  struct sockaddr_in to;
  unsigned done, failed;
  int first_err;
  uint16_t kept_port, after_port; /* connect 1's and the wrap's */
  weft_tcp *kept;
};

static void wrap_next(void *arg);

static uint16_t local_port(weft_tcp *c) {
  struct sockaddr_in a;
  unsigned len = sizeof(a);
  TU_CHECK(weft_tcp_local_addr(c, (struct sockaddr *)&a, &len) == 0);
  return ntohs(a.sin_port);
}

static void wrap_failed(struct wrap *w, int err) {
  if (!w->failed++)
    w->first_err = err;
}

static void wrap_connected(void *arg, weft_tcp *c, int status) {
  struct wrap *w = arg;
  if (status)
    wrap_failed(w, status);
  else if (w->done == 1)
    w->kept_port = local_port(c);
  else if (w->done == WRAP_CONNECTS)
    w->after_port = local_port(c);
  if (w->done == 1 && !status)
    w->kept = c;
  else
    weft_tcp_close(c, 0);
  TU_CHECK(weft_post(w->s, wrap_next, w) == 0);
}

static void wrap_next(void *arg) {
  struct wrap *w = arg;
  if (w->done == WRAP_CONNECTS) {
    if (w->kept)
      weft_tcp_close(w->kept, 0);
    TU_CHECK(weft_rt_shutdown(w->rt, WEFT_SHUTDOWN_NOWAIT) == 0);
    return;
  }
  w->done++;
  weft_tcp *c;
  int r = weft_tcp_connect(w->rt, w->s, (struct sockaddr *)&w->to,
                           sizeof(w->to), 0, wrap_connected, w, &c);
  if (r) {
    wrap_failed(w, r);
    TU_CHECK(weft_post(w->s, wrap_next, w) == 0);
  }
}

static void close_accepted(void *arg, weft_tcp *c) {
  (void)arg;
  weft_tcp_close(c, 0);
}

/* A client's port is one nobody holds: once the ports wrap, a connect
 * passes over the port a live connection still has (it failed with
 * -EADDRINUSE). */
static void test_client_ports_wrap(void **state) {
  (void)state;
  struct wrap *w = calloc(1, sizeof(*w));
  assert_non_null(w);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = 1;
  assert_int_equal(weft_rt_create(&w->rt, &cfg), 0);
  /* An explicit port: the listener takes no ephemeral one. */
  w->to = (struct sockaddr_in){.sin_family = AF_INET,
                               .sin_port = htons(8080),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *l;
  assert_int_equal(weft_tcp_listen(w->rt, (struct sockaddr *)&w->to,
                                   sizeof(w->to), NULL, close_accepted, NULL,
                                   &l),
                   0);
  assert_int_equal(weft_strand_create(w->rt, &w->s), 0);
  assert_int_equal(weft_post(w->s, wrap_next, w), 0);
  assert_int_equal(weft_rt_wait(w->rt, UINT64_MAX), 0);
  if (w->failed)
    fail_msg("%u of %u connects failed, the first with %d", w->failed, w->done,
             w->first_err);
  assert_int_equal(w->done, WRAP_CONNECTS);
  assert_int_equal(w->kept_port, 32768);
  assert_int_equal(w->after_port, 32769); /* 32768 was still held */
  TU_ASSERT_NO_ASYNC_ERRORS();
  weft_strand_release(w->s);
  assert_int_equal(weft_rt_destroy(w->rt), 0);
  free(w);
}

static weft_rt *sim_rt(uint64_t seed) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  return rt;
}

struct clock_seen {
  uint64_t at[8];
  unsigned n;
};

static void hour_fn(void *arg, int status, uint64_t missed) {
  struct clock_seen *c = arg;
  (void)missed;
  if (status == 0 && c->n < 8)
    c->at[c->n++] = weft_now_ns();
}

/* An hour of virtual time: the clock jumps to the deadline; a wait's
 * timeout is virtual too and moves the clock to it when nothing is due. */
static void test_virtual_time(void **state) {
  (void)state;
  weft_rt *rt = sim_rt(7);
  const uint64_t hour = 3600ull * 1000000000u, sec = 1000000000u;
  struct clock_seen c = {0};
  weft_timer *t;
  assert_int_equal(weft_timer_create(rt, NULL, &t), 0);
  uint64_t t0 = weft_now_ns();
  assert_int_equal(weft_timer_start(t, hour, 0, hour_fn, &c), 0);
  /* Nothing is due within a second: -ETIMEDOUT, the clock a second on. */
  assert_int_equal(weft_rt_wait(rt, sec), -ETIMEDOUT);
  assert_int_equal(weft_now_ns(), t0 + sec);
  assert_int_equal(c.n, 0);
  assert_int_equal(weft_rt_wait(rt, 2 * hour), -ETIMEDOUT);
  assert_int_equal(c.n, 1);
  assert_true(c.at[0] >= t0 + hour);
  assert_true(c.at[0] < t0 + hour + 1000000); /* wheel granularity, steps */
  assert_int_equal(weft_now_ns(), t0 + sec + 2 * hour);
  weft_sim_info si;
  assert_int_equal(weft_rt_sim_info(rt, &si), 0);
  assert_int_equal(si.now_ns, weft_now_ns());
  weft_timer_destroy(t);
  /* Nothing to run, nothing armed, no shutdown: only a thread outside
   * could end a wait for ever, and the caller is that thread. */
  assert_int_equal(weft_rt_wait(rt, UINT64_MAX), -EDEADLK);
  assert_int_equal(weft_rt_destroy(rt), 0);
}

static unsigned g_ran, g_cancelled;
static void count_ran(void *arg) {
  (void)arg;
  g_ran++;
}
static void count_cancelled(void *arg) {
  (void)arg;
  g_cancelled++;
}
static int g_timer_status = 1;
static void timer_status(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)missed;
  g_timer_status = status;
}
static long job_never(void *arg) {
  (void)arg;
  fail_msg("a cancelled job ran");
  return 0;
}
static long g_job_result;
static void job_result(void *arg, long result) {
  (void)arg;
  g_job_result = result;
}

/* A CANCEL shutdown before anything ran: every post's cancel function,
 * the armed timer's -ECANCELED call and the queued job's -ECANCELED done,
 * each exactly once, inside the shutdown's wait. */
static void test_cancel_shutdown(void **state) {
  (void)state;
  weft_rt *rt = sim_rt(3);
  weft_strand *s;
  assert_int_equal(weft_strand_create(rt, &s), 0);
  g_ran = g_cancelled = 0;
  for (int i = 0; i < 100; i++) {
    assert_int_equal(weft_post_ex(s, count_ran, count_cancelled, NULL), 0);
    assert_int_equal(weft_post_rt_ex(rt, count_ran, count_cancelled, NULL), 0);
  }
  weft_timer *t;
  assert_int_equal(weft_timer_create(rt, s, &t), 0);
  assert_int_equal(weft_timer_start(t, 1000000, 0, timer_status, NULL), 0);
  g_job_result = 0;
  assert_int_equal(weft_blocking(rt, job_never, NULL, s, job_result, NULL), 0);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL), 0);
  assert_int_equal(g_ran, 0);
  assert_int_equal(g_cancelled, 200);
  assert_int_equal(g_timer_status, -ECANCELED);
  assert_int_equal(g_job_result, -ECANCELED);
  assert_int_equal(weft_post(s, count_ran, NULL), -ESHUTDOWN);
  weft_timer_destroy(t);
  weft_strand_release(s);
  assert_int_equal(weft_rt_destroy(rt), 0);
}

static void on_resolved(void *arg, int status, struct addrinfo *res) {
  (void)arg;
  (void)status;
  (void)res;
  fail_msg("a lookup in a simulation");
}

static void on_signal(void *arg, int signo, uint64_t count) {
  (void)arg;
  (void)signo;
  (void)count;
}

static void test_refusals(void **state) {
  (void)state;
  weft_rt *rt = sim_rt(5), *other;
  /* One runtime per process while a simulation lives. */
  weft_config cfg;
  weft_config_init(&cfg);
  assert_int_equal(weft_rt_create(&other, &cfg), -EBUSY);
  cfg.sim_seed = 6;
  assert_int_equal(weft_rt_create(&other, &cfg), -EBUSY);
  /* No simulated name service or signals yet. */
  weft_lookup *lk;
  assert_int_equal(
      weft_resolve(rt, NULL, "localhost", "80", NULL, on_resolved, NULL, &lk),
      -ENOTSUP);
  weft_signal *w;
  assert_int_equal(weft_signal_watch(rt, NULL, SIGUSR1, NULL, NULL, &w),
                   -EINVAL);
  assert_int_equal(weft_signal_watch(rt, NULL, SIGUSR1, on_signal, NULL, &w),
                   -ENOTSUP);
  assert_int_equal(weft_rt_destroy(rt), 0);

  /* With the simulation gone, a real runtime may live here again. */
  weft_config_init(&cfg);
  cfg.workers = 1;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  weft_sim_info si;
  assert_int_equal(weft_rt_sim_info(rt, &si), -ENOTSUP);
  assert_int_equal(weft_rt_destroy(rt), 0);
  assert_int_equal(weft_rt_sim_info(NULL, &si), -EINVAL);

  /* WEFT_SIM_SEED seeds a runtime whose configuration does not. */
  setenv("WEFT_SIM_SEED", "0x2a", 1);
  assert_int_equal(weft_rt_create(&rt, NULL), 0);
  assert_int_equal(weft_rt_sim_info(rt, &si), 0);
  assert_int_equal(si.seed, 42);
  assert_int_equal(weft_rt_workers(rt), 4);
  assert_int_equal(weft_rt_destroy(rt), 0);
  /* And overrides the configuration's, as the crash line's replay needs. */
  cfg.sim_seed = 6;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  assert_int_equal(weft_rt_sim_info(rt, &si), 0);
  assert_int_equal(si.seed, 42);
  assert_int_equal(weft_rt_destroy(rt), 0);
  setenv("WEFT_SIM_SEED", "forty-two", 1);
  assert_int_equal(weft_rt_create(&rt, NULL), -EINVAL);
  assert_int_equal(weft_rt_create(&rt, &cfg), -EINVAL);
  unsetenv("WEFT_SIM_SEED");
}

static void crash_fn(void *arg) {
  (void)arg;
  abort();
}

/* A run that crashes names its seed on stderr before it dies. */
static void test_crash_names_seed(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], STDERR_FILENO);
    close(p[0]);
    weft_rt *rt = sim_rt(977);
    weft_post_rt(rt, crash_fn, NULL);
    weft_rt_wait(rt, 1000000000u);
    _exit(0); /* not reached */
  }
  close(p[1]);
  char buf[4096];
  size_t n = 0;
  ssize_t got;
  while (n < sizeof(buf) - 1 &&
         (got = read(p[0], buf + n, sizeof(buf) - 1 - n)) > 0)
    n += (size_t)got;
  buf[n] = 0;
  close(p[0]);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  if (!strstr(buf, "replay it with WEFT_SIM_SEED=977"))
    fail_msg("the crash did not name its seed; stderr: %s", buf);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--hash") == 0) {
    print_hash(argv[2], strtoull(argv[3], NULL, 10));
    return 0;
  }
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_same_run),
      cmocka_unit_test(test_same_seed_other_process),
      cmocka_unit_test(test_seeds_differ),
      cmocka_unit_test(test_unix_sockets),
      cmocka_unit_test(test_unix_sockets_faults),
      cmocka_unit_test(test_tcp_sockets),
      cmocka_unit_test(test_client_ports_wrap),
      cmocka_unit_test(test_virtual_time),
      cmocka_unit_test(test_cancel_shutdown),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_crash_names_seed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
