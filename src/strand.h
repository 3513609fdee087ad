/*
 * strand.h, strand.c - strands (serial executors) and handler nodes: the
 * life of a strand (create, release, reclaim) and of a node from post to
 * run. strand.c has the queue's argument.
 */
#ifndef WEFT_STRAND_H
#define WEFT_STRAND_H

#include "core.h"
#include "runq.h"

#include <errno.h>

/* What a strand's queue holds: a link and what kind of node it is. A
 * handler node (below) starts with one; a socket's two nodes are one alone
 * (sock.h), 16 bytes where a handler node takes a line, and run by
 * weft__sock_node_run. In a strand's queue `link.next` holds the next
 * node's head (untagged); in the inject queue, the next item (tagged).
 * Both fill the 16 bytes a pool overwrites in a free object (pool.c): a
 * node's kind is set whenever it is made. */
enum { WEFT_NODE_HANDLER = 0, WEFT_NODE_SOCK = 1 };
struct weft__nhead {
  struct weft__link link;
  uint32_t kind; /* WEFT_NODE_HANDLER or WEFT_NODE_SOCK */
  uint32_t idx;  /* a socket's node: which of its two */
};

/* A handler node: 48 bytes, carved 64 apart (pool.c), returned to the
 * pool once it ran. */
struct weft__node {
  struct weft__nhead h;
  weft_fn fn;
  weft_fn cancel;
  void *arg;
  /* When it became runnable (weft__ticks), for WEFT_HIST_SCHED_DELAY, or
   * 0 if that is not measured: set on a node without strand when it is
   * posted, and on the node at the head of a strand's queue when the
   * strand is scheduled, for one in WEFT_HIST_SAMPLE (strand.c);
   * meaningless elsewhere. A socket's node has none: its run is measured
   * from the event that queued it (WEFT_HIST_IO_DELAY, sock.c). */
  uint64_t queued;
};

/* h is a handler node's head (its kind says so). */
static inline struct weft__node *weft__node_of(struct weft__nhead *h) {
  return (struct weft__node *)h;
}

#define WEFT_STRAND_MAGIC 0x57465354u /* "WFST" */
#define WEFT_STRAND_DEAD 0x44454144u  /* "DEAD" */

/* A strand. Its queue is an intrusive MPSC list whose tail word is also its
 * state (strand.c has the argument):
 *   tail == 0          idle: no pending handler, not scheduled
 *   tail == node       busy: scheduled or running; node is the newest
 *   tail == node | 1   busy and released: reclaim when drained */
struct weft_strand {
  struct weft__link qlink;  /* inject-queue link; must stay first */
  _Atomic uintptr_t tail;   /* see above; pushers exchange it */
  struct weft__nhead *head; /* drainer only: next node to run */
  struct weft__nhead *ran;  /* drainer only: ran, successor unlinked */
  weft_rt *rt;
  _Atomic uint32_t released; /* set by weft_strand_release */
  uint32_t magic;
  uint32_t home;      /* its home shard, for good (shard.h, "Homes") */
  bool self_released; /* drainer only: released from its own handler */
  /* Sockets on it (sock.c): a strand weft made for a socket (weft_made) is
   * released when the last socket on it is freed, not with the socket it
   * was made for, which may lend it to others (weft_tcp_strand). */
  bool weft_made;
  uint16_t pool; /* the shard whose pool it came from (shard.h, "Homes") */
  _Atomic uint32_t socks;
  /* The user's reference (1 until weft_strand_release) plus one per
   * operation in flight whose completion will be posted here
   * (weft__strand_hold): the release proper waits for the last. */
  _Atomic uint32_t refs;
};

/* The queue's protocol, the steps strand.c's argument is about; here, so
 * that the model tests (tests/model/) drive the same code. */
#define WEFT_STRAND_RELEASED ((uintptr_t)1) /* tail bit: released */

/* Any thread: queues n on s. True: s was idle and this caller alone made
 * it busy, so it must schedule s with n at its head. */
static inline bool weft__strand_enqueue(weft_strand *s, struct weft__nhead *n) {
  weft__store(&n->link.next, 0, WA_RLX);
  uintptr_t prev = weft__xchg(&s->tail, (uintptr_t)n, WA_AR);
  if (prev == 0)
    return true;
  struct weft__nhead *p = (struct weft__nhead *)(prev & ~WEFT_STRAND_RELEASED);
  weft__store(&p->link.next, (uintptr_t)n, WA_REL);
  return false;
}

/* The drainer: n's successor, or NULL if none is linked yet. */
static inline struct weft__nhead *weft__strand_next(struct weft__nhead *n) {
  return (struct weft__nhead *)weft__load(&n->link.next, WA_ACQ);
}

/* The drainer: waits up to spins pauses for n's successor to be linked
 * (a push between its exchange and its link); NULL if still cut. */
static inline struct weft__nhead *weft__strand_wait_link(struct weft__nhead *n,
                                                         int spins) {
  for (int i = 0; i < spins; i++) {
    struct weft__nhead *next = weft__strand_next(n);
    if (next)
      return next;
    weft__cpu_relax();
  }
  return NULL;
}

enum weft__strand_end {
  WEFT_STRAND_IDLE,    /* s is idle and no longer the drainer's */
  WEFT_STRAND_RECLAIM, /* s is released and drained: the drainer reclaims */
  WEFT_STRAND_CUT      /* a push exchanged the tail but has not linked yet */
};

/* The drainer ran n and found no successor linked. */
static inline enum weft__strand_end
weft__strand_try_idle(weft_strand *s, struct weft__nhead *n) {
  uintptr_t expect = (uintptr_t)n;
  if (weft__cas(&s->tail, &expect, 0, WA_AR, WA_ACQ))
    return WEFT_STRAND_IDLE;
  if (expect == ((uintptr_t)n | WEFT_STRAND_RELEASED))
    return WEFT_STRAND_RECLAIM;
  return WEFT_STRAND_CUT;
}

/* The release proper, by a thread that is not s's drainer, once no
 * reference is left. True: s is idle and the caller reclaims it now (the
 * acquire orders the last drainer's accesses before); false: marked, and
 * the drainer reclaims it when it drains. */
static inline bool weft__strand_mark_released(weft_strand *s) {
  uintptr_t t = weft__load(&s->tail, WA_ACQ);
  while (t != 0) {
    if (weft__cas(&s->tail, &t, t | WEFT_STRAND_RELEASED, WA_AR, WA_ACQ))
      return false;
  }
  return true;
}

/* Whether s may take posts (not released, not reclaimed while the debug
 * build keeps its memory): a check for the API's -EBADF. */
static inline bool weft__strand_live(const weft_strand *s) {
  return !weft__load(&s->released, WA_RLX) && s->magic == WEFT_STRAND_MAGIC;
}

/* For a call given a strand of rt for its callbacks (NULL allowed): 0,
 * -EXDEV (another runtime's) or -EBADF (released). */
static inline int weft__strand_usable(const weft_rt *rt, const weft_strand *s) {
  if (!s)
    return 0;
  if (s->rt != rt)
    return -EXDEV;
  return weft__strand_live(s) ? 0 : -EBADF;
}

/* weft_strand_create with the strand homed on shard home (its timers
 * fire there, its memory comes from there), not the next in turn. */
int weft__strand_create_at(weft_rt *rt, unsigned home, weft_strand **out);

/* Keeps s (NULL: nothing) from being reclaimed while an operation whose
 * completion is posted to it is in flight, even past weft_strand_release:
 * the release takes effect at the last unhold. Hold only a strand known
 * live (one weft__strand_usable accepted, in the call that accepts the
 * operation); unhold after the completion's post, never before it. */
void weft__strand_hold(weft_strand *s);
void weft__strand_unhold(weft_strand *s);
/* An operation's completion: queues n on s (NULL: any worker), then drops
 * the hold the operation took on s. Whatever n's handler frees may be
 * gone on return. */
void weft__node_post_unhold(weft_rt *rt, struct weft__shard *local,
                            weft_strand *s, struct weft__node *n);

/* A node for fn (cancel: what runs instead at a CANCEL shutdown), from
 * local's cache (NULL: outside any shard). NULL on ENOMEM. */
struct weft__node *weft__node_new(weft_rt *rt, struct weft__shard *local,
                                  weft_fn fn, weft_fn cancel, void *arg);
/* Queues n, already accepted (no shutdown check): on strand s, or on any
 * worker if s is NULL; prio: a timer firing (the shard's priority ring). */
void weft__node_post(weft_rt *rt, struct weft__shard *local, weft_strand *s,
                     struct weft__node *n, bool prio);
/* Queues a socket's node h on s (sock.c), already accepted. */
void weft__strand_push_sock(weft_strand *s, struct weft__shard *local,
                            struct weft__nhead *h);
/* Run-loop side: runs a node posted without strand, or a strand's turn. */
void weft__node_run(struct weft__shard *sh, struct weft__node *n);
void weft__strand_run(struct weft__shard *sh, weft_strand *s);

#endif
