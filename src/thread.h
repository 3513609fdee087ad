/*
 * thread.h, thread.c - the runtime's threads: their slot (struct
 * weft__thread), the thread-local identity of the calling thread, the
 * stall protocol's word that says whether it is inside a handler, and
 * starting a thread with the runtime's signal mask. A thread holds at most
 * one shard at a time (t->shard); the monitor may take it away while the
 * thread is stuck in a handler (monitor.c has the protocol's argument).
 */
#ifndef WEFT_THREAD_H
#define WEFT_THREAD_H

#include "core.h"
#include "trace.h"

#include <pthread.h>
#include <time.h>

/* hstate is written only by its thread: (epoch << 2) | HS_*, a new epoch
 * per handler. */
#define WEFT_HS_OUT 0u      /* between handlers: the thread uses its shard */
#define WEFT_HS_IN 1u       /* inside a handler: the shard may be taken */
#define WEFT_HS_BUSY 2u     /* inside a handler, using its shard (a post) */
#define WEFT_HSTART_LATE 1u /* no clock reads 1 */

/* Most frames a stall's backtrace holds, its signal handler's included. */
#define WEFT_BT_FRAMES 32

/* A slot is DORMANT while its shard's thread has not been started yet
 * (weft_config.eager_workers; park.c's wake_dormant starts it). */
enum { WEFT_TH_FREE = 0, WEFT_TH_LIVE, WEFT_TH_EXITED, WEFT_TH_DORMANT };

struct weft__thread {
  weft_rt *rt;
  struct weft__shard *shard; /* held shard, NULL for a spare */
  pthread_t tid;
  unsigned idx;
  bool searching;
  bool in_handler; /* own copy of hstate's state, for the thread itself */
  /* futex word: 0 asleep or running, 1 woken by a notifier (popped from the
   * sleepers) or by the monitor (a shard to hold), 2 kicked (a timer moved
   * its shard's deadline earlier) */
  _Atomic uint32_t wake;
  /* while it sleeps in park: the timer deadline it sleeps until
   * (UINT64_MAX while it reads it); 0 otherwise (park.c, weft__kick) */
  _Atomic uint64_t sleep_until;
  /* the backend it sleeps in (park.c, io.c), NULL otherwise */
  _Atomic(struct weft__io *) io_sleep;
  _Atomic uint64_t hstate;
  /* when the handler of hstate's epoch began (CLOCK_MONOTONIC ns), or 0
   * when the runtime does not stamp handlers (rt->mon.stamp; monitor.c),
   * or WEFT_HSTART_LATE: stamping turned on while the epoch began */
  _Atomic uint64_t hstart;
  uint64_t epoch;
  /* items run, for measuring one in WEFT_HIST_SAMPLE (strand.c,
   * item_begin) */
  uint32_t sample_skip;
  /* 0; 1: the monitor took the shard; 2: the thread saw it (monitor.c) */
  _Atomic uint32_t taken;
  _Atomic(void *) cur_fn;     /* handler running, for stall reports */
  _Atomic(void *) cur_strand; /* its strand, or NULL */
  /* The weft call the handler is waiting in, when weft itself makes a wait
   * its header documents (weft_spawn's wait for the exec); NULL otherwise.
   * The monitor hands the shard on as for a stall but does not report one
   * (monitor.c, scan). A hint: relaxed, as a stale read only reports a
   * stall that was not one, or leaves out the report of a handler that has
   * just left the wait. */
  _Atomic(const char *) waits_in;
  /* set by the thread at start, for the monitor: its kernel id (0 until
   * then) and its CPU-time clock */
  _Atomic int kernel_tid;
  clockid_t cpu_clock;
  bool cpu_clock_ok;
  bool lazy;      /* started after weft_rt_create, by a wakeup (park.c) */
  int slot_state; /* WEFT_TH_*, under rt->th.spare_lock */
  /* while DORMANT: no start is tried before this time after a failed one
   * (park.c); under rt->th.spare_lock */
  uint64_t retry_ns;
  /* 1 while slot_state is DORMANT: a lock-free hint for wakers, cleared
   * (release, under spare_lock) once the thread is created */
  _Atomic uint32_t dormant;
  /* A stall's backtrace (backtrace.c has the protocol): the monitor stores
   * the epoch and then a request number; the thread's signal handler
   * writes the frames, then bt_done = that number (release; a futex
   * word). Last in the slot: no handler's path touches them. */
  _Atomic uint64_t bt_epoch;
  _Atomic uint32_t bt_req;
  _Atomic uint32_t bt_done;
  unsigned bt_first, bt_n; /* bt_frames[bt_first..bt_n) are the stack's */
  void *bt_frames[WEFT_BT_FRAMES];
} WEFT_ALIGNED;

/* Stores of hstate and loads of taken: a release store and a relaxed load
 * with a compiler barrier between, the monitor's membarrier() supplying the
 * store-load fence (monitor.c). ThreadSanitizer does not know membarrier,
 * so its builds use seq_cst, which is a correct protocol on its own. The
 * same goes for hstate and the second load of the stamp flag in
 * weft__handler_enter, against the monitor's switch (stamp_mode). */
#ifdef WEFT_TSAN
#define WEFT_HS_STORE_MO WA_SC
#define WEFT_HS_LOAD_MO WA_SC
#define WEFT_STAMP_REREAD_MO WA_SC
#define WEFT_SCAN_HS_MO WA_SC
#else
#define WEFT_HS_STORE_MO WA_REL
#define WEFT_HS_LOAD_MO WA_RLX
#define WEFT_STAMP_REREAD_MO WA_RLX
#define WEFT_SCAN_HS_MO WA_ACQ
#endif

/* The calling thread's slot if it is a runtime thread (thread.c). */
extern _Thread_local struct weft__thread *weft__tls_self
    __attribute__((tls_model("initial-exec")));
static inline struct weft__thread *weft__self(void) { return weft__tls_self; }
void weft__set_self(struct weft__thread *t);

/* The strand whose turn the calling thread runs, or NULL (any thread:
 * weft_strand_current is the API's copy). Inline, as weft__self: every
 * strand turn sets it twice and the socket verbs' strand check reads it. */
extern _Thread_local weft_strand *weft__tls_strand
    __attribute__((tls_model("initial-exec")));
static inline weft_strand *weft__current_strand(void) {
  return weft__tls_strand;
}
static inline void weft__set_current_strand(weft_strand *s) {
  weft__tls_strand = s;
}

/* A trampoline of weft's (a timer's firing, a socket's or the blocking
 * pool's callback) names the user's function it is about to call, so a
 * stall report names that function and not weft's code. The store is in
 * the handler's epoch: the monitor reads cur_fn, then checks that the
 * epoch is still current (monitor.c, stuck_in), so it names either
 * function of that handler, never one of another. */
#ifdef WEFT_SIM
/* sim.c: the call, in a simulated runtime's log. */
void weft__sim_calling(struct weft__thread *t, const void *fn);
#endif
static inline void weft__calling(void *fn) {
  struct weft__thread *t = weft__self();
  if (t) {
    weft__store(&t->cur_fn, fn, WA_RLX);
#ifdef WEFT_SIM
    weft__sim_calling(t, fn);
#endif
  }
}

/* Brackets a documented wait inside a weft call (waits_in above): what,
 * then NULL. */
static inline void weft__waits_in(const char *what) {
  struct weft__thread *t = weft__self();
  if (t)
    weft__store(&t->waits_in, what, WA_RLX);
}

/* A shard's index, from code that cannot see struct weft__shard. */
unsigned weft__shard_idx(const struct weft__shard *sh);

/* The calling thread acknowledges that the monitor took its shard: true if
 * it did (the thread then holds no shard). */
static inline bool weft__lost(struct weft__thread *t) {
  uint32_t one = 1;
  if (!weft__cas(&t->taken, &one, 2, WA_AR, WA_ACQ))
    return false;
  weft__trace(WEFT_EV_LOST, weft__shard_idx(t->shard), 0, 0);
  t->shard = NULL;
  return true;
}

/* The monitor's side of a handoff of t's shard, after it stored taken = 1
 * and, fenced true, made its membarrier (monitor.c has the protocol):
 * true if committed (t will not touch its shard again: t is still in the
 * handler of hstate hs, or already acknowledged the loss), false if t
 * moved on and never knew (taken is 0 again). */
static inline bool weft__handoff_commit(struct weft__thread *t, uint64_t hs,
                                        bool fenced) {
  if (fenced && weft__load(&t->hstate, WA_SC) == hs)
    return true;
  uint32_t one = 1;
  return !weft__cas(&t->taken, &one, 0, WA_AR, WA_ACQ);
}

/* The calling thread's shard if it is a thread of rt holding one, for use
 * until weft__local_end. Inside a handler this brackets the use so that the
 * monitor cannot hand the shard to another thread meanwhile; if it already
 * has, the thread is now outside any shard and this returns NULL. */
static inline struct weft__shard *weft__local_begin(weft_rt *rt) {
  struct weft__thread *t = weft__self();
  if (!t || t->rt != rt || !t->shard)
    return NULL;
  if (t->in_handler) {
    weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_BUSY, WEFT_HS_STORE_MO);
    atomic_signal_fence(memory_order_seq_cst);
    if (weft__load(&t->taken, WEFT_HS_LOAD_MO) && weft__lost(t)) {
      weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
      return NULL;
    }
  }
  return t->shard;
}

static inline void weft__local_end(struct weft__shard *sh) {
  struct weft__thread *t = weft__self();
  if (sh && t->in_handler)
    weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
}

/* pthread_create with every asynchronous signal blocked in the new thread
 * (it inherits the mask), so that the application's signals go to its own
 * threads and a SIGPIPE raised inside a handler never kills the process.
 * 0 or a positive errno, as pthread_create. */
int weft__spawn(pthread_t *tid, const pthread_attr_t *attr, void *(*fn)(void *),
                void *arg);

#endif
