/*
 * test_model_handoff.c - the monitor's handoff of a stuck thread's shard
 * (src/thread.h: the thread's side in weft__handler_enter, _leave,
 * weft__local_begin, _end and weft__lost; the monitor's in
 * weft__handoff_commit) under the schedule explorer (model.h).
 *
 * A worker runs two handlers, each making a post (which uses its shard)
 * and using its shard between them, as the run loop does. The monitor
 * looks at the worker's hstate and takes the shard whenever it sees the
 * worker inside a handler (in a real runtime only after the stall
 * threshold; the protocol must be safe whenever it acts), as monitor.c's
 * handoff does: taken = 1, then the commit; a committed shard goes to a
 * spare, which uses it.
 *
 * Checked: the worker and the spare never use the shard at once; the
 * worker never uses it after the commit; a commit is always acknowledged
 * by the worker (taken 2, no shard), an abort leaves it the shard.
 */
#include "model.h"

#include "futex.h"
#include "rt.h"
#include "shard.h"
#include "thread.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Thread_local struct weft__thread *weft__tls_self;
_Thread_local struct weft__ring *weft__tls_ring;
bool weft__trace_tsc;

unsigned weft__shard_idx(const struct weft__shard *sh) { return sh->idx; }

enum { WORKER, MONITOR, SPARE };

static weft_rt *rt;
static struct weft__shard *shard;
static struct weft__thread *worker_t;
static int user; /* who uses the shard now, or -1 */
static bool committed;
static _Atomic uint32_t handed; /* the spare's futex: 1 shard, 2 none */
static _Atomic uint32_t work;

/* A use of the shard: a step inside, where another thread may run. */
static void use_shard(int who) {
  MODEL_CHECK(user < 0, "thread %d uses the shard while %d does", who, user);
  user = who;
  weft__fetch_add(&work, 1, WA_RLX);
  MODEL_CHECK(user == who, "thread %d's use of the shard met another", who);
  user = -1;
}

static void handler(void) {} /* named in hstate's epoch, never called */

static void worker(int id) {
  (void)id;
  struct weft__thread *t = worker_t;
  for (int h = 0; h < 2 && t->shard; h++) {
    use_shard(WORKER); /* the run loop, between handlers */
    weft__handler_enter(t, (void *)handler, NULL);
    struct weft__shard *sh = weft__local_begin(rt); /* a post */
    if (sh)
      use_shard(WORKER);
    weft__local_end(sh);
    weft__fetch_add(&work, 1, WA_RLX); /* the handler's own work */
    if (!weft__handler_leave(t))
      break; /* lost: it becomes a spare */
  }
  if (t->shard)
    use_shard(WORKER);
}

/* Looks a few times; takes the shard of a worker seen inside a handler. */
static void monitor(int id) {
  (void)id;
  for (int look = 0; look < 3 && !committed; look++) {
    uint64_t hs = weft__load(&worker_t->hstate, WA_ACQ);
    if ((hs & 3) == WEFT_HS_IN) {
      weft__store(&worker_t->taken, 1, WA_SC);
      committed = weft__handoff_commit(worker_t, hs, true);
    }
    if (!committed)
      weft__cpu_relax();
  }
  weft__store(&handed, committed ? 1 : 2, WA_REL);
  weft__futex_wake(&handed, 1);
}

static void spare(int id) {
  (void)id;
  uint32_t h;
  while ((h = weft__load(&handed, WA_ACQ)) == 0)
    weft__futex_wait(&handed, 0);
  if (h == 1) {
    use_shard(SPARE);
    use_shard(SPARE);
  }
}

static void setup(void) {
  /* Static, cleared each run: a shard is large, and ASan maps memory
   * for each allocation that size. */
  static weft_rt rt_mem;
  static struct weft__shard shard_mem;
  static struct weft__thread thread_mem;
  memset(&rt_mem, 0, sizeof(rt_mem));
  memset(&shard_mem, 0, sizeof(shard_mem));
  memset(&thread_mem, 0, sizeof(thread_mem));
  rt = &rt_mem;
  shard = &shard_mem;
  worker_t = &thread_mem;
  rt->nshards = 1;
  rt->shards = shard;
  rt->threads = worker_t;
  shard->rt = rt;
  worker_t->rt = rt;
  worker_t->shard = shard;
  weft__store(&shard->owner, worker_t, WA_RLX);
  weft__tls_self = worker_t; /* only the worker calls weft__self */
  user = -1;
  committed = false;
  weft__store(&handed, 0, WA_RLX);
  weft__store(&work, 0, WA_RLX);
}

/* Both ends must occur, or the case tests half of the protocol. */
static unsigned commits, aborts;

static void report(void) {
  printf("  handoffs committed in %u runs, aborted or never tried in %u\n",
         commits, aborts);
}

static void check(void) {
  uint32_t taken = weft__load(&worker_t->taken, WA_RLX);
  if (committed)
    commits++;
  else
    aborts++;
  if (committed) {
    MODEL_CHECK(taken == 2 && !worker_t->shard,
                "a committed handoff the worker did not acknowledge (taken "
                "%u, shard %p)",
                taken, (void *)worker_t->shard);
  } else {
    MODEL_CHECK(taken == 0 && worker_t->shard == shard,
                "an aborted handoff took the shard (taken %u)", taken);
  }
}

static const struct model_case cases[] = {
    {.name = "handoff",
     .nthreads = 3,
     .setup = setup,
     .thread = {worker, monitor, spare},
     .check = check},
};

int main(int argc, char **argv) {
  atexit(report);
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
