/*
 * strand.c - strands (serial executors) and the posting of handlers.
 * Owns: the life of a strand (create, release, reclaim) and of handler
 * nodes from post to run.
 *
 * A strand is one word of state plus an intrusive MPSC list of nodes; the
 * word is the list's tail (see struct weft_strand). No lock, nothing shared
 * with another strand.
 *
 * Push (any thread):  n->next = 0; prev = XCHG(tail, n, acq_rel);
 *   prev == 0: the strand was idle and this pusher alone made it busy, so
 *              it alone schedules it: head = n, then a run-queue push
 *              (a release) hands head to the drainer.
 *   prev != 0: STORE(prev->next, n, release) links n behind prev.
 * Drain (the one thread that popped the strand from a run queue): run head;
 *   next = LOAD(n->next, acquire); if next is 0, CAS(tail, n -> 0, acq_rel):
 *   success: the strand is idle again and the drainer must not touch it any
 *            more (a new push may already have scheduled it elsewhere);
 *   failure: a push exchanged tail after n but has not linked yet; wait a
 *            few spins for the link, else requeue the strand and retry later
 *            (the pusher may be preempted: nobody spins on it for long).
 * Why a handler never runs twice or concurrently: only the pusher that saw
 * prev == 0 schedules, and it sees 0 only after the drainer's successful
 * CAS, which is the drainer's last access; the XCHG is an acquire of that
 * CAS, so everything the old drainer did happens-before the new one.
 * Why no node is lost: a node whose XCHG returned prev is reachable from
 * prev as soon as the link store lands, and the drainer cannot retire prev
 * (CAS tail prev -> 0) because tail is no longer prev.
 * Why FIFO per poster: a thread's XCHGs on one tail are ordered by program
 * order, and the list order is the XCHG order.
 *
 * The release proper (retire) comes when the last reference goes: the
 * user's (weft_strand_release) or a hold of an operation in flight whose
 * completion is posted here (fs.c, resolve.c, blocking.c), so such a
 * completion never finds the strand reclaimed. Retire marks tail with bit
 * 0 by CAS (tail node | 1, or reclaims at once if tail is 0). Exactly one
 * of the retirer and the drainer reclaims: the retirer if its CAS saw 0,
 * the drainer if its final CAS failed on n | 1. Retired from its own
 * handler, the retirer is the drainer: it sets a plain flag and reclaims
 * after its final CAS succeeds (with no reference left no push is allowed,
 * so an idle retired strand is unreachable).
 * Posting after release is a contract violation (weft.h); `released` catches
 * it while the strand still exists, and WEFT_DEBUG builds never reuse a
 * strand's memory so the check keeps working after reclaim.
 */
#include "strand.h"

#include "trace.h"

#include "clock.h"
#include "rt.h"
#include "shard.h"
#include "sock.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

/* rt.c makes the strand pools' objects one line each */
_Static_assert(sizeof(weft_strand) <= WEFT_CACHELINE, "a strand fits a line");

#define LINK_SPINS 64

static struct weft__pool_cache *node_cache(struct weft__shard *sh) {
  return sh ? &sh->cache.node : NULL;
}

/* After a node ran, while the strand is still ours: a socket's node's
 * owner cannot be freed and reused before a later node of this strand
 * runs. Once the strand is given up, use node_release with the kind read
 * before. */
static inline void node_release(weft_rt *rt, struct weft__pool_cache *nc,
                                struct weft__nhead *h, uint32_t kind) {
  if (kind == WEFT_NODE_HANDLER)
    weft__pool_free(&rt->node_pool, nc, h);
}

static inline void node_free(weft_rt *rt, struct weft__pool_cache *nc,
                             struct weft__nhead *h) {
  node_release(rt, nc, h, h->kind);
}

/* What runs h: for the stall report and the flight recorder. */
static inline void *node_fn(struct weft__nhead *h) {
  return h->kind == WEFT_NODE_HANDLER ? (void *)weft__node_of(h)->fn
                                      : (void *)weft__sock_node_run;
}

/* at: the home shard's index, or -1 for the next by weft__home_pick. */
static int strand_create(weft_rt *rt, int at, weft_strand **out) {
  if (!rt || !out)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (weft__load(&rt->life.closing, WA_ACQ))
    return -ESHUTDOWN;
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__shard *home =
      &rt->shards[at >= 0 ? (unsigned)at : weft__home_pick(rt, sh)];
  struct weft__shard *from = sh ? sh : home;
  weft_strand *s =
      weft__sim_fault(rt, WEFT_SIM_FAULT_ENOMEM)
          ? NULL
          : weft__pool_alloc(&from->strand_pool, sh ? &sh->cache.strand : NULL);
  if (!s) {
    weft__local_end(sh);
    return -ENOMEM;
  }
  weft__store(&s->qlink.next, 0, WA_RLX);
  weft__store(&s->tail, 0, WA_RLX);
  s->head = s->ran = NULL;
  s->rt = rt;
  s->home = home->idx;
  s->pool = (uint16_t)from->idx;
  weft__store(&s->released, 0, WA_RLX);
  s->magic = WEFT_STRAND_MAGIC;
  s->self_released = false;
  s->weft_made = false;
  weft__store(&s->socks, 0, WA_RLX);
  weft__store(&s->refs, 1, WA_RLX);
  if (sh)
    weft__stat_add(&sh->st.strands_created, 1);
  else
    weft__fetch_add(&rt->outside.strands_created, 1, WA_RLX);
  weft__local_end(sh);
  *out = s;
  return 0;
}

int weft_strand_create(weft_rt *rt, weft_strand **out) {
  return strand_create(rt, -1, out);
}

int weft__strand_create_at(weft_rt *rt, unsigned home, weft_strand **out) {
  return strand_create(rt, rt ? (int)(home % rt->nshards) : 0, out);
}

/* Returns the strand's memory to the pool; nothing references it now. */
static void strand_reclaim(weft_strand *s) {
  weft_rt *rt = s->rt;
  struct weft__shard *sh = weft__local_begin(rt);
  s->magic = WEFT_STRAND_DEAD;
  if (sh)
    weft__stat_add(&sh->st.strands_freed, 1);
  else
    weft__fetch_add(&rt->outside.strands_freed, 1, WA_RLX);
#ifndef WEFT_DEBUG
  struct weft__shard *from = &rt->shards[s->pool];
  weft__pool_free(&from->strand_pool, sh == from ? &sh->cache.strand : NULL, s);
#endif
  weft__local_end(sh);
}

/* The release proper, once no reference is left: reclaim now if idle,
 * else leave it to the drainer. */
static void strand_retire(weft_strand *s) {
  if (weft__current_strand() == s) {
    /* From its own handler: this thread is the drainer, which reclaims
     * the strand when it next goes idle (no atomic needed here). */
    s->self_released = true;
    return;
  }
  if (weft__strand_mark_released(s))
    strand_reclaim(s);
}

void weft_strand_release(weft_strand *s) {
  if (!s || weft__forked(s->rt))
    return;
  /* A load and a store, not an exchange: two racing releases are a bug
   * this cannot catch anyway; a sequential double release it does catch. */
  if (!weft__strand_live(s)) {
    weft__log(s->rt, WEFT_LOG_ERROR,
              "weft_strand_release(%p): strand already released", (void *)s);
    return;
  }
  weft__store(&s->released, 1, WA_RLX);
  weft__strand_unhold(s);
}

/* refs is a reference count: a hold is taken by a thread that already
 * relies on a reference (the user's, checked live by the call), so a
 * relaxed increment cannot revive a strand whose count reached 0. The
 * decrement is acq_rel, so the thread that takes it to 0 sees every
 * access made under the other references (the posts of completions
 * included) before it retires the strand.
 * The last reference needs no decrement: a caller that reads 1 holds the
 * only one, and no other thread can take a hold (that needs a reference
 * of its own) or drop one (there is none), so the count cannot change
 * under it and nothing reads it after the retire. The load is an acquire
 * for the same reason the decrement is one: the holders' decrements it
 * reads (release, each in the count's release sequence) and what they did
 * before them happen-before the retire. A strand without operations in
 * flight is thus released with no read-modify-write at all. */
void weft__strand_hold(weft_strand *s) {
  if (s)
    weft__fetch_add(&s->refs, 1, WA_RLX);
}

void weft__strand_unhold(weft_strand *s) {
  if (!s)
    return;
  if (weft__load(&s->refs, WA_ACQ) == 1 ||
      weft__fetch_sub(&s->refs, 1, WA_AR) == 1)
    strand_retire(s);
}

void weft__node_post_unhold(weft_rt *rt, struct weft__shard *local,
                            weft_strand *s, struct weft__node *n) {
  weft__node_post(rt, local, s, n, false);
  weft__strand_unhold(s);
}

/* Posts that found their strand idle, on this thread: one in
 * WEFT_HIST_SAMPLE stamps its node (a tick read each would cost a chain
 * of posts to idle strands, the seed case's pattern, several per cent). */
static _Thread_local uint32_t stamp_skip
    __attribute__((tls_model("initial-exec")));

static inline uint64_t sample_stamp(void) {
  return ++stamp_skip % WEFT_HIST_SAMPLE ? 0 : weft__ticks();
}

/* s was idle: n is its head; schedule it. Out of line, as node_post's
 * other branches: inlined, their tick reads made weft__node_post save
 * registers on every post, the chain of posts to a running strand
 * included (bench/post: a tenth of its time in weft__node_post). */
__attribute__((noinline)) static void strand_wake(weft_strand *s,
                                                  struct weft__shard *local,
                                                  struct weft__nhead *h,
                                                  bool prio) {
  s->head = h;
  s->ran = NULL;
  if (h->kind == WEFT_NODE_HANDLER)
    weft__node_of(h)->queued = sample_stamp();
  if (prio)
    weft__schedule_prio(s->rt, local, (weft__item)s);
  else
    weft__schedule(s->rt, local, (weft__item)s);
}

__attribute__((noinline)) static void node_schedule(weft_rt *rt,
                                                    struct weft__shard *local,
                                                    struct weft__node *n,
                                                    bool prio) {
  n->queued = weft__ticks();
  if (prio)
    weft__schedule_prio(rt, local, (weft__item)n | WEFT_ITEM_NODE);
  else
    weft__schedule(rt, local, (weft__item)n | WEFT_ITEM_NODE);
}

static void strand_push(weft_strand *s, struct weft__shard *local,
                        struct weft__nhead *h, bool prio) {
#ifdef WEFT_DEBUG
  /* Never reused in this build: a push onto a reclaimed strand is weft's
   * own bug (its sockets post without the API's check) or a post racing
   * the release; either way nothing would ever run it. */
  if (s->magic != WEFT_STRAND_MAGIC) {
    weft__log(s->rt, WEFT_LOG_ERROR, "internal: a post to reclaimed strand %p",
              (void *)s);
    abort();
  }
#endif
  if (weft__strand_enqueue(s, h))
    strand_wake(s, local, h, prio);
}

void weft__strand_push_sock(weft_strand *s, struct weft__shard *local,
                            struct weft__nhead *h) {
  strand_push(s, local, h, false);
}

struct weft__node *weft__node_new(weft_rt *rt, struct weft__shard *local,
                                  weft_fn fn, weft_fn cancel, void *arg) {
  struct weft__node *n = weft__pool_alloc(&rt->node_pool, node_cache(local));
  if (n) {
    n->h.kind = WEFT_NODE_HANDLER;
    n->fn = fn;
    n->cancel = cancel;
    n->arg = arg;
  }
  return n;
}

void weft__node_post(weft_rt *rt, struct weft__shard *local, weft_strand *s,
                     struct weft__node *n, bool prio) {
  if (s)
    strand_push(s, local, &n->h, prio);
  else
    node_schedule(rt, local, n, prio);
}

/* Every post: from the calling thread's shard (leased for the call), or
 * from outside, counted as work outside the run loop until queued, so that
 * a shutdown either refuses it or waits for it (rt.c). s NULL: any worker.
 * rt is the caller's copy: once pushed, the handler may run, end with a
 * release of s, and s be reused before the post returns. */
static int post(weft_rt *rt, weft_strand *s, weft_fn fn, weft_fn cancel,
                void *arg) {
  struct weft__shard *sh = weft__local_begin(rt);
  int r = 0;
  if (!sh)
    r = weft__busy_enter(rt);
  else if (weft__load(&rt->life.closing, WA_RLX))
    r = -ESHUTDOWN;
  if (!r) {
    struct weft__node *n = weft__sim_fault(rt, WEFT_SIM_FAULT_ENOMEM)
                               ? NULL
                               : weft__node_new(rt, sh, fn, cancel, arg);
    if (n)
      weft__node_post(rt, sh, s, n, false);
    else
      r = -ENOMEM;
    if (!sh)
      weft__busy_drop(rt, 1);
  }
  weft__local_end(sh);
  return r;
}

int weft_post_ex(weft_strand *s, weft_fn fn, weft_fn cancel, void *arg) {
  if (!s || !fn)
    return -EINVAL;
  if (weft__forked(s->rt))
    return -ECHILD;
  if (!weft__strand_live(s))
    return -EBADF;
  return post(s->rt, s, fn, cancel, arg);
}

int weft_post(weft_strand *s, weft_fn fn, void *arg) {
  return weft_post_ex(s, fn, NULL, arg);
}

int weft_post_rt_ex(weft_rt *rt, weft_fn fn, weft_fn cancel, void *arg) {
  if (!rt || !fn)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  return post(rt, NULL, fn, cancel, arg);
}

int weft_post_rt(weft_rt *rt, weft_fn fn, void *arg) {
  return weft_post_rt_ex(rt, fn, NULL, arg);
}

/* Runs or cancels one node; returns 1 if it ran, 0 if it was cancelled.
 * A socket's node runs either way: its kind's handler sees the shutdown. */
static inline int invoke(weft_rt *rt, struct weft__nhead *h) {
  bool cancelling = weft__load(&rt->life.cancelling, WA_RLX) != 0;
  if (h->kind != WEFT_NODE_HANDLER) {
    weft__sock_node_run(h);
    return !cancelling;
  }
  struct weft__node *n = weft__node_of(h);
  if (__builtin_expect(cancelling, 0)) {
    if (n->cancel)
      n->cancel(n->arg);
    return 0;
  }
  n->fn(n->arg);
  return 1;
}

/* Counts one handler, on the shard if this thread still holds it, else on
 * the runtime (the handler was bypassed by a handoff; this thread then
 * reports its stuck handler done). Per handler, so that the handlers of a
 * turn that finished before the handoff are the shard's. */
static void count(weft_rt *rt, struct weft__shard *sh, int ran) {
  if (sh) {
    if (ran)
      weft__stat_add(&sh->st.handlers_run, 1);
    else
      weft__stat_add(&sh->st.handlers_cancelled, 1);
    return;
  }
  weft__fetch_add(ran ? &rt->outside.handlers_run
                      : &rt->outside.handlers_cancelled,
                  1, WA_RLX);
  weft__busy_drop(rt, 1); /* counted by the handoff (monitor.c) */
}

/* An item begins: its scheduling delay if its node was stamped, and the
 * recorder's event. Returns its start, or 0 if nothing needs it.
 * *sampled: one item in WEFT_HIST_SAMPLE per thread, whose run time is
 * measured and whose requeue is stamped. A requeue stamped because its
 * node was would measure every later turn of a busy strand: sampling
 * would end at its first sample. */
static uint64_t item_begin(struct weft__thread *self, struct weft__shard *sh,
                           struct weft__nhead *h, weft_strand *s,
                           bool *sampled) {
  *sampled = ++self->sample_skip % WEFT_HIST_SAMPLE == 0;
  struct weft__node *n =
      h && h->kind == WEFT_NODE_HANDLER ? weft__node_of(h) : NULL;
  bool stamped = n && n->queued;
  if (!*sampled && !stamped && !weft__tracing())
    return 0;
  uint64_t t0 = weft__ticks();
  if (stamped)
    weft__hist_add(&sh->hist[WEFT_HIST_SCHED_DELAY],
                   weft__span_ns(n->queued, t0));
  weft__trace_at(t0, WEFT_EV_RUN, sh->idx, (uintptr_t)(h ? node_fn(h) : NULL),
                 (uintptr_t)s);
  return t0;
}

/* An item that began at t0 ended, at t1 (0: now): its run time if it was
 * sampled, on the shard if this thread still holds it (sh), else on the
 * runtime; the recorder's event names the function weft called last (a
 * trampoline names the user's). Not sampled, ending now on a shard this
 * thread holds, the event is held for the thread's next one: most often
 * the next item's start, so one tick read serves both (design.md, "The
 * flight recorder"); the main loop flushes it before anything else
 * (shard.c). */
static void item_end(weft_rt *rt, struct weft__shard *sh, unsigned idx,
                     uint64_t t0, uint64_t t1, unsigned handlers,
                     bool sampled) {
  struct weft__thread *self = weft__self();
  if (!t0 || (!sampled && !weft__tracing()))
    return;
  if (!sampled && !t1 && sh) {
    weft__trace_later(WEFT_EV_END, idx,
                      (uintptr_t)weft__load(&self->cur_fn, WA_RLX), handlers);
    return;
  }
  if (!t1)
    t1 = weft__ticks();
  if (sampled && sh)
    weft__hist_add(&sh->hist[WEFT_HIST_TURN], weft__span_ns(t0, t1));
  else if (sampled)
    weft__hist_add_shared(&rt->outside.hist[WEFT_HIST_TURN],
                          weft__span_ns(t0, t1));
  weft__trace_at(t1, WEFT_EV_END, idx,
                 (uintptr_t)weft__load(&self->cur_fn, WA_RLX), handlers);
}

void weft__node_run(struct weft__shard *sh, struct weft__node *n) {
  weft_rt *rt = sh->rt;
  unsigned idx = sh->idx;
  struct weft__thread *self = weft__self();
  bool sampled;
  uint64_t t0 = item_begin(self, sh, &n->h, NULL, &sampled);
  weft__handler_enter(self, (void *)n->fn, NULL);
  int ran = invoke(rt, &n->h);
  sh = weft__handler_leave(self);
  item_end(rt, sh, idx, t0, 0, 1, sampled);
  node_free(rt, node_cache(sh), &n->h);
  count(rt, sh, ran);
}

/* Whether a timer of sh's wheel is due; a clock read only if sh has an
 * armed timer. Checked every 4 handlers of a turn, so a busy strand delays
 * a timer by a few handlers rather than by its whole batch. */
static bool timer_due(struct weft__shard *sh) {
  uint64_t next = weft__load(&sh->tm.next, WA_RLX);
  return next != UINT64_MAX && weft__now_ns() >= next;
}

void weft__strand_run(struct weft__shard *sh, weft_strand *s) {
  weft_rt *rt = sh->rt;
  struct weft__thread *self = weft__self();
  unsigned budget = rt->batch;
  struct weft__nhead *n = s->head;
  unsigned idx = sh->idx, handlers = 0;
  bool sampled;
  uint64_t t0 = item_begin(self, sh, n, s, &sampled), t1 = 0;
  if (!n) {
    /* Resuming after a cut link: s->ran ran, its successor is pending. */
    n = weft__strand_wait_link(s->ran, LINK_SPINS);
    if (!n) {
      item_end(rt, sh, idx, t0, 0, 0, sampled);
      weft__trace_flush();
      sched_yield();
      weft__schedule(rt, sh, (weft__item)s);
      return;
    }
    node_free(rt, &sh->cache.node, s->ran);
    s->ran = NULL;
  }
  weft__stat_add(&sh->st.strands_run, 1);
  weft__set_current_strand(s);
  sh->yield_turn = false;
  sh->owe_wake = false;
  int lost_ran = -1;
  for (;;) {
    weft__handler_enter(self, node_fn(n), s);
    int ran = invoke(rt, n);
    /* NULL: the monitor handed our shard to another thread while this
     * handler ran; from here on this thread is outside the runtime. */
    sh = weft__handler_leave(self);
    handlers++;
    if (sh)
      count(rt, sh, ran);
    else
      lost_ran = ran; /* counted at the end: count() ends our part */
    struct weft__pool_cache *nc = node_cache(sh);
    struct weft__nhead *next = weft__strand_next(n);
    if (!next) {
      /* Read while s is ours: once idle, a socket's node's owner may be
       * freed and reused by the strand's next drainer. */
      bool self_released = s->self_released;
      uint32_t kind = n->kind;
      enum weft__strand_end end = weft__strand_try_idle(s, n);
      if (end != WEFT_STRAND_CUT) {
        node_release(rt, nc, n, kind);
        /* idle and self-released: nobody may push any more */
        if (end == WEFT_STRAND_RECLAIM || self_released)
          strand_reclaim(s);
        break; /* s is no longer ours */
      }
      next = weft__strand_wait_link(n, LINK_SPINS);
      if (!next) {
        s->head = NULL;
        s->ran = n;
        weft__schedule(rt, sh, (weft__item)s);
        break;
      }
    }
    node_free(rt, nc, n);
    n = next;
    if (sh && (budget & 3) == 1 && timer_due(sh))
      budget = 1; /* a timer is due here: end the turn, let it fire */
    if (sh && sh->yield_turn)
      budget = 1; /* the handler queued more of its work: others first */
    if (!sh || --budget == 0) {
      /* Budget spent (requeue at the back), or shard lost (the strand
       * goes to the inject queue for a thread that holds one). */
      s->head = n;
      t1 = sampled ? weft__ticks() : 0;
      if (n->kind == WEFT_NODE_HANDLER)
        weft__node_of(n)->queued = t1;
      weft__schedule(rt, sh, (weft__item)s);
      break;
    }
    if (sh && sh->owe_wake) {
      /* A handler of this turn queued work that its push woke no one for,
       * as this thread was to run it next; the turn goes on instead, so
       * another thread takes it (unrelated work waits on no turn). */
      sh->owe_wake = false;
      weft__notify_parked(rt);
    }
  }
  item_end(rt, sh, idx, t0, t1, handlers, sampled);
  weft__set_current_strand(NULL);
  if (lost_ran >= 0)
    count(rt, NULL, lost_ran);
}
