/*
 * test_model_sock.c - a socket's event word and its free (src/sock.h:
 * ev_raise, ev_take, ev_retire) under the schedule explorer (model.h), on
 * a strand drained as strand.c does it (drain.h).
 *
 * Signallers raise bits as weft__sock_signal does (a reaper's readiness
 * and completions, a close from another thread, a kick), with the
 * generation of the socket's life or a stale one, and push the node
 * post_idx names when their raise queued it; the socket's node runs as
 * weft__sock_node_run does, hands the bits to a kind that frees the socket on
 * EV_CLOSE, as weft__sock_free does: by the next generation if no node is
 * queued, else the queued node's run frees it.
 *
 * The shutdown sweep raises as weft__socks_shutdown does: only on a
 * socket marked live, whatever its generation (weft__sock_ev_raise_live),
 * racing the socket's own close and free.
 *
 * Checked: a node is never pushed while it is queued; a bit raised before
 * another by one thread is seen no later than it (none is lost); a stale
 * generation's bits are never seen; the socket is freed exactly once, and
 * no node of it is pushed or run after that, by the sweep either; it is
 * no longer marked live once freed.
 */
#include "drain.h"
#include "model.h"
#include "sock.h"

#include <string.h>

#define STALE_GEN 7 /* a readiness event for an earlier life */

static struct weft__sock sock;
static struct weft__node final_node; /* the free's handler node */
static bool queued[2], seen_in, freed;
static _Atomic unsigned signallers_done;
static unsigned nsignallers;

/* weft__sock_signal */
static void push(void) {
  unsigned i = sock.post_idx;
  MODEL_CHECK(!freed, "a node of a freed socket was pushed");
  MODEL_CHECK(!queued[i], "node %u was pushed while queued", i);
  queued[i] = true;
  drain_post(&sock.node[i]);
}

static void sig(uint64_t bits, uint32_t gen_tag) {
  if (weft__sock_ev_raise(&sock, bits, gen_tag))
    push();
}

/* really_free, after the pooled node ran */
static void really_free(void) {
  MODEL_CHECK(!freed, "the socket was freed twice");
  freed = true;
}

/* weft__sock_free */
static void sock_free(void) {
  sock.state = ST_DONE;
  if (!weft__sock_ev_retire(&sock)) {
    sock.free_pending = true;
    return;
  }
  drain_post(&final_node.h);
}

/* The kind's handler: frees the socket on EV_CLOSE. */
static void kind_run(uint32_t bits) {
  MODEL_CHECK(!(bits & EV_OUT), "a stale generation's bit was seen");
  MODEL_CHECK(!(bits & EV_LIVE), "a run was handed EV_LIVE");
  if (bits & EV_IN)
    seen_in = true;
  if (bits & EV_CLOSE) {
    MODEL_CHECK(seen_in, "EV_CLOSE was seen before the EV_IN raised first");
    sock_free();
  }
}

/* weft__sock_node_run, and the free's handler node */
static void run_node(struct weft__nhead *n) {
  if (n == &final_node.h) {
    really_free();
    return;
  }
  MODEL_CHECK(n == &sock.node[0] || n == &sock.node[1], "a foreign node");
  MODEL_CHECK(!freed, "a node of a freed socket ran");
  unsigned idx = n->idx;
  MODEL_CHECK(n == &sock.node[idx], "node %u holds a wrong index", idx);
  MODEL_CHECK(queued[idx], "node %u ran without being pushed", idx);
  queued[idx] = false;
  uint32_t bits = weft__sock_ev_take(&sock, idx);
  if (sock.state == ST_DONE) {
    if (sock.free_pending) {
      sock.free_pending = false;
      sock_free();
    }
    return;
  }
  kind_run(bits);
}

/* A reaper: readiness, then the user's close through another thread. */
static void reaper(int id) {
  (void)id;
  sig(EV_IN, 0);
  sig(EV_CLOSE, 0);
  atomic_fetch_add(&signallers_done, 1);
}

/* Kicks of the current life, and a stale readiness event. */
static void kicker(int id) {
  (void)id;
  sig(EV_KICK, 0);
  sig(EV_OUT, STALE_GEN);
  sig(EV_KICK, 0);
  atomic_fetch_add(&signallers_done, 1);
}

/* weft__socks_shutdown's visit of the socket's memory. */
static void sweeper(int id) {
  (void)id;
  if (weft__sock_ev_raise_live(&sock, EV_SHUTDOWN, WEFT_GEN_ANY))
    push();
  atomic_fetch_add(&signallers_done, 1);
}

static void drainer(int id) {
  (void)id;
  while (!freed || atomic_load(&signallers_done) < nsignallers ||
         weft__load(&drain_strand.tail, WA_ACQ))
    if (!drain_turn())
      weft__cpu_relax();
}

static void setup_common(unsigned signallers) {
  memset(&sock, 0, sizeof(sock));
  memset(&final_node, 0, sizeof(final_node));
  for (unsigned i = 0; i < 2; i++) {
    sock.node[i].kind = WEFT_NODE_SOCK;
    sock.node[i].idx = i;
  }
  sock.state = ST_OPEN;
  weft__store(&sock.ev, EV_LIVE, WA_RLX); /* registered */
  queued[0] = queued[1] = false;
  seen_in = freed = false;
  nsignallers = signallers;
  atomic_store(&signallers_done, 0);
  drain_setup(run_node, NULL);
}

static void setup_one(void) { setup_common(1); }
static void setup_two(void) { setup_common(2); }

static void check(void) {
  MODEL_CHECK(freed, "the socket was never freed");
  MODEL_CHECK(!(weft__load(&sock.ev, WA_RLX) & EV_LIVE),
              "the freed socket is still marked live");
  MODEL_CHECK(seen_in, "EV_IN was never seen");
  drain_teardown();
}

static const struct model_case cases[] = {
    {.name = "sock_close",
     .nthreads = 2,
     .setup = setup_one,
     .thread = {reaper, drainer},
     .check = check},
    {.name = "sock_close_kicks",
     .nthreads = 3,
     .setup = setup_two,
     .thread = {reaper, kicker, drainer},
     .check = check},
    {.name = "sock_sweep",
     .nthreads = 3,
     .setup = setup_two,
     .thread = {reaper, sweeper, drainer},
     .check = check},
    {.name = "sock_close_two_drainers",
     .nthreads = 4,
     .setup = setup_two,
     .thread = {reaper, kicker, drainer, drainer},
     .check = check},
};

int main(int argc, char **argv) {
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
