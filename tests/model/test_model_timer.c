/*
 * test_model_timer.c - timers (src/timer.c: weft_timer_start, _cancel,
 * _destroy, firing and settling, on the real wheel and weft__lock) under
 * the schedule explorer (model.h). The timer's strand is drained as
 * strand.c does it (drain.h); a thread serves the wheel as a worker or a
 * catching-up thread does, on the explorer's virtual clock; another
 * cancels or re-arms the timer from outside the runtime.
 *
 * Checked, as weft.h promises: each arming's handler is called or its
 * cancel returns 0, exactly one of the two; on the timer's own strand,
 * once a cancel, start or destroy returned, no handler of an earlier
 * arming runs (from outside the strand a firing may have started, and
 * its handler may be entered, just after the call returned: weft.h says
 * so); and a destroy frees the timer once, after its last firing
 * settled.
 */
#include "drain.h"
#include "model.h"

#include "rt.h"
#include "shard.h"
#include "timer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AFTER_NS 2000 /* the arming's delay: two of the server's spins */

/* ------------------------------------------- what timer.c calls outside */

_Thread_local struct weft__thread *weft__tls_self;
_Thread_local struct weft__ring *weft__tls_ring;
bool weft__trace_tsc;
_Atomic uint32_t weft__fork_gen;

/* Pools and nodes from one arena per run, never reused within it: the
 * drainer reads a node after its run, as strand.c does before it frees. */
#define ARENA 64
static void *arena[ARENA];
static bool arena_freed[ARENA];
static unsigned narena;
static weft_timer *freed_timer;

static void *arena_alloc(void) {
  MODEL_CHECK(narena < ARENA, "more than %d allocations", ARENA);
  void *p = calloc(1, WEFT_CACHELINE);
  if (!p)
    abort();
  arena_freed[narena] = false;
  arena[narena++] = p;
  return p;
}

void *weft__pool_alloc(struct weft__pool *p, struct weft__pool_cache *c) {
  (void)p, (void)c;
  return arena_alloc();
}

void weft__pool_free(struct weft__pool *p, struct weft__pool_cache *c,
                     void *obj) {
  (void)p, (void)c;
  for (unsigned i = 0; i < narena; i++)
    if (arena[i] == obj) {
      MODEL_CHECK(!arena_freed[i], "an object was freed twice");
      arena_freed[i] = true;
      if (obj == (void *)freed_timer) {
        MODEL_CHECK(!freed_timer->inflight,
                    "the timer was freed with %u firings in flight",
                    (unsigned)freed_timer->inflight);
        freed_timer = NULL;
      }
      return;
    }
  model_fail(__FILE__, __LINE__, "a foreign object was freed");
}

struct weft__node *weft__node_new(weft_rt *rt, struct weft__shard *local,
                                  weft_fn fn, weft_fn cancel, void *arg) {
  (void)rt, (void)local;
  struct weft__node *n = arena_alloc();
  n->h.kind = WEFT_NODE_HANDLER;
  n->fn = fn;
  n->cancel = cancel;
  n->arg = arg;
  return n;
}

void weft__node_post(weft_rt *rt, struct weft__shard *local, weft_strand *s,
                     struct weft__node *n, bool prio) {
  (void)rt, (void)local, (void)prio;
  MODEL_CHECK(s == &drain_strand, "a firing for a foreign strand");
  drain_post(&n->h);
}

int weft__busy_enter(weft_rt *rt) {
  (void)rt;
  return 0;
}

void weft__busy_drop(weft_rt *rt, int64_t n) { (void)rt, (void)n; }
void weft__hist_add_shared(struct weft__hist *h, uint64_t ns) {
  (void)h, (void)ns;
}
void weft__kick(struct weft__shard *sh, uint64_t deadline) {
  (void)sh, (void)deadline;
}
void weft__notify_parked(weft_rt *rt) { (void)rt; }
unsigned weft__shard_idx(const struct weft__shard *sh) { return sh->idx; }

/* weft__log reports a broken contract: fail the run with it. */
void weft__log(weft_rt *rt, int level, const char *fmt, ...) {
  (void)rt, (void)level;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  model_fail(__FILE__, __LINE__, "weft__log: %s", msg);
}

/* ------------------------------------------------------------ the case */

static weft_rt *rt;
static weft_timer *tm;
static unsigned called_a, called_b;
static bool restarted; /* the restart returned */
static bool destroyed; /* the destroy returned */
static int cancel_ret; /* the canceller's, or 1 before it returns */
static _Atomic unsigned producers_done;
static bool destroy_it; /* the canceller destroys instead */
static bool on_strand;  /* cancel, restart and destroy run on the strand */
static struct weft__node op_node; /* that call, posted to the strand */

static void teardown(void);

static void on_a(void *arg, int status, uint64_t missed) {
  (void)arg, (void)missed;
  MODEL_CHECK(status == 0, "status %d", status);
  MODEL_CHECK(cancel_ret != 0, "the handler ran after its cancel returned 0");
  MODEL_CHECK(!on_strand || !restarted,
              "the replaced arming's handler ran after the restart returned");
  MODEL_CHECK(!on_strand || !destroyed,
              "the handler ran after the destroy returned");
  MODEL_CHECK(!on_strand || cancel_ret == 1,
              "the handler ran after its cancel returned");
  called_a++;
}

static void on_b(void *arg, int status, uint64_t missed) {
  (void)arg, (void)status, (void)missed;
  called_b++;
}

/* The firing's node: run as strand.c's invoke does. */
static void run_node(struct weft__nhead *h) {
  struct weft__node *n = weft__node_of(h);
  n->fn(n->arg);
}

/* Serves the wheel a few times, the clock moving a spin each time. */
static void server(int id) {
  (void)id;
  for (int i = 0; i < 4; i++) {
    weft__timers_fire_due(&rt->shards[0], NULL, weft__now_ns());
    weft__cpu_relax();
  }
  atomic_fetch_add(&producers_done, 1);
}

static void do_cancel(void *arg) {
  (void)arg;
  if (destroy_it) {
    weft_timer_destroy(tm);
    destroyed = true;
  } else {
    cancel_ret = weft_timer_cancel(tm);
  }
}

static void do_restart(void *arg) {
  (void)arg;
  MODEL_CHECK(weft_timer_start(tm, AFTER_NS, 0, on_b, NULL) == 0,
              "the restart failed");
  restarted = true;
}

/* Makes the call from outside, or posts it to the timer's strand. */
static void call(weft_fn fn) {
  weft__cpu_relax();
  if (on_strand) {
    op_node.fn = fn;
    drain_post(&op_node.h);
  } else {
    fn(NULL);
  }
  atomic_fetch_add(&producers_done, 1);
}

static void canceller(int id) {
  (void)id;
  call(do_cancel);
}

static void restarter(int id) {
  (void)id;
  call(do_restart);
}

static void drainer(int id) {
  (void)id;
  while (atomic_load(&producers_done) < 2 ||
         weft__load(&drain_strand.tail, WA_ACQ))
    if (!drain_turn())
      weft__cpu_relax();
}

static void build(bool destroy, bool strand) {
  if (rt)
    teardown(); /* the last run failed before its check */
  narena = 0;
  /* Static, cleared each run: a shard is large, and ASan maps memory
   * for each allocation that size. */
  static weft_rt rt_mem;
  static struct weft__shard shard_mem;
  memset(&rt_mem, 0, sizeof(rt_mem));
  memset(&shard_mem, 0, sizeof(shard_mem));
  rt = &rt_mem;
  rt->shards = &shard_mem;
  rt->nshards = 1;
  rt->shards[0].rt = rt;
  weft__lock_init(&rt->shards[0].tm.lock);
  weft__timers_init(&rt->shards[0].tm, weft__now_ns());
  drain_setup(run_node, NULL);
  drain_strand.rt = rt;
  drain_strand.magic = WEFT_STRAND_MAGIC;
  called_a = called_b = 0;
  restarted = destroyed = false;
  cancel_ret = 1;
  destroy_it = destroy;
  on_strand = strand;
  memset(&op_node, 0, sizeof(op_node));
  atomic_store(&producers_done, 0);
  if (weft_timer_create(rt, &drain_strand, &tm) ||
      weft_timer_start(tm, AFTER_NS, 0, on_a, NULL))
    abort();
  freed_timer = tm;
}

static void teardown(void) {
  drain_teardown();
  for (unsigned i = 0; i < narena; i++)
    free(arena[i]);
  narena = 0;
  rt = NULL;
}

static void setup_cancel(void) { build(false, false); }
static void setup_destroy(void) { build(true, false); }
static void setup_restart(void) { build(false, false); }
static void setup_cancel_strand(void) { build(false, true); }
static void setup_destroy_strand(void) { build(true, true); }
static void setup_restart_strand(void) { build(false, true); }

/* The outcomes of the cancel cases, so that the runs are seen to reach
 * each: cancelled while armed, fired but made stale, called. */
static unsigned armed_cancels, stale_cancels, calls;

static void report(void) {
  printf("  cancels: %u of an armed timer, %u of a queued firing (made "
         "stale); %u handlers called\n",
         armed_cancels, stale_cancels, calls);
}

static void check_cancel(void) {
  bool fired = narena > 1; /* the timer, then a firing and its node */
  if (called_a)
    calls++;
  else if (fired)
    stale_cancels++;
  else
    armed_cancels++;
  MODEL_CHECK(called_a + (cancel_ret == 0) == 1,
              "handler called %u times, cancel returned %d", called_a,
              cancel_ret);
  weft_timer_destroy(tm);
  teardown();
}

/* A destroy says nothing of the handler: called at most once (and on the
 * strand never after the destroy: on_a), and the timer freed once. */
static void check_destroy(void) {
  MODEL_CHECK(called_a <= 1, "handler called %u times", called_a);
  MODEL_CHECK(!freed_timer, "the destroyed timer was never freed");
  teardown();
}

static void check_restart(void) {
  MODEL_CHECK(called_a <= 1 && called_b <= 1, "called %u and %u times",
              called_a, called_b);
  /* the restart's arming: called, or still armed (the server stopped
   * before its deadline), and then cancelled here */
  int r = weft_timer_cancel(tm);
  MODEL_CHECK(called_b + (r == 0) == 1,
              "the restart's handler called %u times, its cancel returned %d",
              called_b, r);
  weft_timer_destroy(tm);
  teardown();
}

static const struct model_case cases[] = {
    {.name = "timer_cancel",
     .nthreads = 3,
     .setup = setup_cancel,
     .thread = {server, canceller, drainer},
     .check = check_cancel},
    {.name = "timer_destroy",
     .nthreads = 3,
     .setup = setup_destroy,
     .thread = {server, canceller, drainer},
     .check = check_destroy},
    {.name = "timer_restart",
     .nthreads = 3,
     .setup = setup_restart,
     .thread = {server, restarter, drainer},
     .check = check_restart},
    {.name = "timer_cancel_on_strand",
     .nthreads = 3,
     .setup = setup_cancel_strand,
     .thread = {server, canceller, drainer},
     .check = check_cancel},
    {.name = "timer_destroy_on_strand",
     .nthreads = 3,
     .setup = setup_destroy_strand,
     .thread = {server, canceller, drainer},
     .check = check_destroy},
    {.name = "timer_restart_on_strand",
     .nthreads = 3,
     .setup = setup_restart_strand,
     .thread = {server, restarter, drainer},
     .check = check_restart},
};

int main(int argc, char **argv) {
  atexit(report);
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
