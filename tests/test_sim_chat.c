/*
 * test_sim_chat - the chat example's server (examples/chat.c, its own
 * handlers, unchanged) under simulation (weft_sim), with clients in the
 * same simulated runtime over an abstract Unix socket, for thousands of
 * seeds, without faults and with every kind (weft.h, WEFT_SIM_FAULT_*).
 *
 * Clients join one of two rooms, send their lines as soon as they see
 * their own join, and leave a virtual second after their last line. What
 * each client receives must be what the chat promises, whatever the
 * order the seed chose:
 *  - only lines of its own room's members, never its own;
 *  - from each sender, lines in the order sent, without gap or repeat;
 *  - from a sender whose join it saw, every line that sender sent, then
 *    its leave; from one it did not, a tail of them (it joined later).
 * With faults (a break ends what comes, a delivery the chat has no memory
 * for is lost) what holds is the first, and order without repeat, plus
 * every client ending once and the rooms' memory all freed (the ASan
 * build). A failing seed prints itself for a replay.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

/* The example's main is not used: the test drives its handlers. */
int chat_main(int argc, char **argv);
#define main chat_main
#include "../examples/chat.c"
#undef main

#define CLIENTS 6
#define LINES 8
#define SECOND 1000000000ull

struct tchat;

struct tclient {
  struct tchat *t;
  unsigned idx, room;
  weft_strand *s; /* the connection's and the leave timer's */
  weft_tcp *c;
  weft_timer *leave;
  char rbuf[512];
  size_t rlen;
  char join[32], out[LINES][16]; /* written from here: no copies */
  bool joined_seen, ended;
  /* Per sender: the next line expected (-1: none yet), whether its join
   * and its leave were seen. */
  int next[CLIENTS];
  bool saw_join[CLIENTS], saw_left[CLIENTS];
};

struct tchat {
  weft_rt *rt;
  unsigned faults;
  struct sockaddr_storage addr; /* the listener's */
  unsigned addrlen;
  struct tclient cl[CLIENTS];
  unsigned ended;
};

static unsigned room_of(unsigned i) { return i % 2; }

static void tc_ended(struct tchat *t) {
  if (++t->ended < CLIENTS)
    return;
  /* As the example's main does on a signal: rooms stop posting first. */
  rooms_stop(NULL);
  TU_CHECK(weft_rt_shutdown(t->rt, WEFT_SHUTDOWN_NOWAIT) == 0);
}

static void tc_closed(void *data, weft_tcp *c) {
  struct tclient *k = data;
  (void)c;
  k->c = NULL;
  weft_timer_destroy(k->leave);
  weft_strand_release(k->s);
  tc_ended(k->t);
}

static void tc_leave(void *arg, int status, uint64_t missed) {
  struct tclient *k = arg;
  (void)missed;
  if (status == 0 && k->c)
    weft_tcp_close(k->c, 0);
}

static void tc_send_lines(struct tclient *k) {
  for (unsigned s = 0; s < LINES; s++) {
    int n = snprintf(k->out[s], sizeof(k->out[s]), "c%u %u\n", k->idx, s);
    if (weft_tcp_write(k->c, k->out[s], (size_t)n, NULL, NULL) < 0) {
      TU_CHECK(k->t->faults);
      return;
    }
  }
  TU_CHECK(weft_timer_start(k->leave, SECOND, 0, tc_leave, k) == 0);
}

/* One line from the server, without its end of line. */
static void tc_line(struct tclient *k, const char *line) {
  unsigned from, seq;
  char what[16];
  if (sscanf(line, "* c%u %15s", &from, what) == 2) {
    TU_CHECKF(from < CLIENTS && room_of(from) == k->room,
              "client %u: '%s' from another room", k->idx, line);
    if (from >= CLIENTS)
      return;
    if (!strcmp(what, "joined")) {
      TU_CHECK(!k->saw_join[from]);
      k->saw_join[from] = true;
      if (from == k->idx && !k->joined_seen) {
        k->joined_seen = true;
        tc_send_lines(k);
      }
    } else {
      TU_CHECK(!strcmp(what, "left") && from != k->idx);
      TU_CHECK(!k->saw_left[from]);
      k->saw_left[from] = true;
      /* A leave comes after every line of the sender's that comes. */
      TU_CHECKF(k->t->faults || !k->saw_join[from] || k->next[from] == LINES,
                "client %u: c%u left after %d lines", k->idx, from,
                k->next[from]);
    }
    return;
  }
  unsigned from2;
  if (sscanf(line, "c%u: c%u %u", &from, &from2, &seq) != 3 || from != from2) {
    TU_CHECKF(0, "client %u: unexpected line '%s'", k->idx, line);
    return;
  }
  TU_CHECKF(from < CLIENTS && from != k->idx && room_of(from) == k->room,
            "client %u: line '%s'", k->idx, line);
  if (from >= CLIENTS)
    return;
  /* In order, no gap, no repeat; from its first line if the join was
   * seen. With faults a delivery may be lost (the chat drops one it has no
   * memory for): in order and no repeat. */
  int want = k->next[from];
  if (want < 0)
    want = k->saw_join[from] ? 0 : (int)seq;
  if (k->t->faults)
    TU_CHECKF((int)seq >= want, "client %u: c%u's line %u, expected %d on",
              k->idx, from, seq, want);
  else
    TU_CHECKF((int)seq == want, "client %u: c%u's line %u, expected %d", k->idx,
              from, seq, want);
  k->next[from] = (int)seq + 1;
}

static void tc_read(struct tclient *k);

static void tc_on_line(void *arg, weft_tcp *c, long n, size_t have) {
  struct tclient *k = arg;
  if (n <= 0) { /* the end: only a fault may come before our leave */
    if (c)
      weft_tcp_close(c, 0);
    return;
  }
  size_t end = (size_t)n;
  if (k->rbuf[end - 1] == '\n')
    end--;
  k->rbuf[end] = '\0';
  tc_line(k, k->rbuf);
  memmove(k->rbuf, k->rbuf + n, have - (size_t)n);
  k->rlen = have - (size_t)n;
  tc_read(k);
}

static void tc_read(struct tclient *k) {
  if (k->c && weft_tcp_read_until(k->c, k->rbuf, sizeof(k->rbuf) - 1, k->rlen,
                                  "\n", 1, tc_on_line, k) < 0)
    weft_tcp_close(k->c, 0);
}

static void tc_connected(void *arg, weft_tcp *c, int status) {
  struct tclient *k = arg;
  TU_CHECK(weft_tcp_set_data(c, k, tc_closed) == 0);
  if (status) {
    TU_CHECKF(k->t->faults, "client %u: connect %d", k->idx, status);
    return; /* it closes itself */
  }
  k->c = c;
  /* A client whose join never comes back (faults) still leaves. */
  TU_CHECK(weft_timer_start(k->leave, 10 * SECOND, 0, tc_leave, k) == 0);
  int n =
      snprintf(k->join, sizeof(k->join), "JOIN room%u c%u\n", k->room, k->idx);
  if (weft_tcp_write(c, k->join, (size_t)n, NULL, NULL) < 0) {
    TU_CHECK(k->t->faults);
    weft_tcp_close(c, 0);
    return;
  }
  tc_read(k);
}

/* Stalls the simulated monitor reported (WEFT_SIM_FAULT_STALL), and how
 * many of those it handed to a spare thread: on the driving thread, so
 * plain counters. */
static uint64_t g_stalls, g_handed;
static void on_stall(const weft_stall *st, void *ctx) {
  (void)ctx;
  g_stalls++;
  g_handed += st->handed_off != 0;
}

/* One run; a failure prints the seed. Returns the faults injected. */
static uint64_t run_chat(uint64_t seed, unsigned faults, bool tcp) {
  struct tchat *t = calloc(1, sizeof(*t));
  assert_non_null(t);
  t->faults = faults;
  /* The example's globals, as a fresh process has them. */
  g_stopping = false;
  atomic_store(&g_next_id, 0);
  atomic_store(&g_dropped, 0);
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.sim_seed = seed;
  cfg.sim_faults = faults;
  cfg.sim_fault_odds = 256;
  cfg.on_stall = on_stall;
  assert_int_equal(weft_rt_create(&t->rt, &cfg), 0);
  g_rt = t->rt;
  t->addrlen = tu_listen_addr(&t->addr, tcp, "weft-test-sim-chat");
  weft_listener *l;
  assert_int_equal(weft_tcp_listen(t->rt, (struct sockaddr *)&t->addr,
                                   t->addrlen, NULL, on_accept, NULL, &l),
                   0);
  t->addrlen = sizeof(t->addr); /* the port it got, for the clients */
  assert_int_equal(
      weft_listener_addr(l, (struct sockaddr *)&t->addr, &t->addrlen), 0);
  for (unsigned i = 0; i < CLIENTS; i++) {
    struct tclient *k = &t->cl[i];
    k->t = t;
    k->idx = i;
    k->room = room_of(i);
    for (unsigned j = 0; j < CLIENTS; j++)
      k->next[j] = -1;
    int r = weft_strand_create(t->rt, &k->s);
    if (!r && (r = weft_timer_create(t->rt, k->s, &k->leave)) < 0)
      weft_strand_release(k->s);
    weft_tcp *c;
    if (!r && (r = weft_tcp_connect(t->rt, k->s, (struct sockaddr *)&t->addr,
                                    t->addrlen, 0, tc_connected, k, &c)) < 0) {
      weft_timer_destroy(k->leave);
      weft_strand_release(k->s);
    }
    if (r < 0) { /* out of descriptors or memory: a fault */
      assert_true(faults && (r == -EMFILE || r == -ENOMEM));
      tc_ended(t);
    }
  }
  int r = weft_rt_wait(t->rt, 3600 * SECOND);
  if (r != 0 || *tu_async_errors() != 0) {
    printf("# seed %" PRIu64 " (faults %u) failed: wait %d, %u ended\n", seed,
           faults, r, t->ended);
    for (unsigned i = 0; i < CLIENTS; i++)
      printf("#   c%u: joined %d, open %d\n", i, t->cl[i].joined_seen,
             t->cl[i].c != NULL);
  }
  assert_int_equal(r, 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
  if (!faults) {
    for (unsigned i = 0; i < CLIENTS; i++) {
      struct tclient *k = &t->cl[i];
      assert_true(k->joined_seen);
      for (unsigned j = 0; j < CLIENTS; j++)
        if (j != i && room_of(j) == k->room)
          assert_int_equal(k->next[j] < 0 ? 0 : k->next[j],
                           k->saw_join[j] || k->next[j] >= 0 ? LINES : 0);
    }
  }
  weft_sim_info si;
  assert_int_equal(weft_rt_sim_info(t->rt, &si), 0);
  assert_int_equal(weft_rt_destroy(t->rt), 0);
  free_all(); /* the example's own cleanup: rooms and their members */
  free(t);
  return si.faults;
}

static void test_chat_seeds(void **state) {
  (void)state;
  unsigned n = (unsigned)TU_SCALED(5000, 200);
  for (unsigned i = 0; i < n; i++)
    run_chat(i + 1, 0, false);
  printf("# chat: %u seeds without faults\n", n);
}

static void test_chat_seeds_faults(void **state) {
  (void)state;
  unsigned n = (unsigned)TU_SCALED(5000, 200);
  uint64_t faults = 0;
  g_stalls = g_handed = 0;
  for (unsigned i = 0; i < n; i++)
    faults += run_chat(i + 1, WEFT_SIM_FAULT_ALL, false);
  printf("# chat: %u seeds with every fault: %" PRIu64 " faults, %" PRIu64
         " stalls reported, %" PRIu64 " handed off\n",
         n, faults, g_stalls, g_handed);
  assert_true(faults >= n / 4);
  assert_true(g_handed > 0);
}

/* The same server on a TCP port of the simulated host, with and without
 * faults: the chat does not know the difference. */
static void test_chat_tcp(void **state) {
  (void)state;
  unsigned n = (unsigned)TU_SCALED(500, 25);
  for (unsigned i = 0; i < n; i++) {
    run_chat(20000 + i, 0, true);
    run_chat(30000 + i, WEFT_SIM_FAULT_ALL, true);
  }
  printf("# chat over TCP: %u seeds, and %u with every fault\n", n, n);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chat_seeds),
      cmocka_unit_test(test_chat_seeds_faults),
      cmocka_unit_test(test_chat_tcp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
