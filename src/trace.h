/*
 * trace.h, trace.c - the flight recorder: every thread of a runtime (its
 * shards' threads and spares, the monitor, the blocking pools' threads)
 * writes compact events into a ring of its own, and weft_rt_trace_dump
 * writes the rings out as text (docs/design.md, "The flight recorder",
 * has the format; tools/weft-trace turns it into a Chrome trace). Owns
 * the rings and the calling thread's pointer to its ring.
 *
 * A ring has one writer, the thread attached to it, and no lock: writing
 * an event is a tick read and six plain stores. Readers (a dump, on any
 * thread) copy a ring while it is written and keep what the copy proves
 * untouched (trace.c has the argument).
 */
#ifndef WEFT_TRACE_H
#define WEFT_TRACE_H

#include "clock.h"
#include "core.h"

#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* Event types; the dump names them (trace.c, type_name). */
enum {
  WEFT_EV_RUN = 1, /* a: first handler, b: strand (0: none) */
  WEFT_EV_END,     /* a: the function named last, b: handlers run */
  WEFT_EV_PARK,
  WEFT_EV_UNPARK,
  WEFT_EV_WAKE,     /* a: the thread slot woken */
  WEFT_EV_STEAL,    /* a: victim shard, b: items taken */
  WEFT_EV_STALL,    /* monitor: a: the stuck handler, b: its strand */
  WEFT_EV_HANDOFF,  /* monitor: a: from thread slot, b: to thread slot */
  WEFT_EV_LOST,     /* the stuck thread found its shard gone */
  WEFT_EV_TIMER,    /* a: handler, b: lateness ns */
  WEFT_EV_SUBMIT,   /* a: io.h's WEFT_OP_*, b: fd */
  WEFT_EV_COMPLETE, /* a: WEFT_OP_*, b: result (epoll: readiness) */
  WEFT_EV_JOB,      /* blocking pool: a: work function, b: queue wait ns */
  WEFT_EV_JOB_END,  /* a: work function */
  WEFT_EV_COUNT
};

/* Events' I/O operations are io.h's WEFT_OP_* (1 recv, 2 multishot
 * recv, 3 send, 4 connect, 5 accept, 6 poll, 7 file, 8 cancel or close)
 * and this one: readiness an epoll backend reported (b: WEFT_IO_* bits). */
#define WEFT_TRACE_OP_READY 9u

/* Roles of the threads that write rings. */
enum { WEFT_RING_WORKER, WEFT_RING_MONITOR, WEFT_RING_POOL };

#define WEFT_TRACE_NO_SHARD 0xffffu
/* In a run's word: the thread's previous item ended at this run's time,
 * with one handler, named as the ring's run before this one was; one
 * event says both (weft__trace_at). The dump writes that end out. */
#define WEFT_EV_FOLDED ((uint64_t)1 << 24)
/* The least weft_config.trace_bytes (rt.c checks it). */
#define WEFT_TRACE_MIN_BYTES ((size_t)4096)

/* One event: when (ticks), what (type | shard << 8 | tid << 32), a, b. */
struct weft__ev {
  _Atomic uint64_t t, w, a, b;
};

struct weft__ring {
  /* events begun and events written: the writer claims event k by storing
   * k + 1 in claim, and publishes it by storing k + 1 in done (trace.c) */
  _Atomic uint64_t claim, done;
  uint64_t mask; /* events - 1 */
  struct weft__trace *owner;
  int role;
  unsigned index;
  _Atomic int tid; /* of the thread attached last */
  bool in_use;     /* under owner->lock */
  /* writer only: an event left for later (weft__trace_later), and the
   * first argument of the last run written (WEFT_EV_FOLDED) */
  bool held;
  uint64_t held_w, held_a, held_b, run_a;
  struct weft__ev ev[] WEFT_ALIGNED;
};

/* The runtime's recorder (rt->trace). */
struct weft__trace {
  size_t events;        /* per ring, a power of two; 0: recorder off */
  pthread_mutex_t lock; /* rings, nrings, in_use, last_dump, dumps */
  struct weft__ring **rings;
  unsigned nrings, cap;
  uint64_t tick0, ns0; /* the tick clock at init, for the dump's scale */
  char *dir;           /* where stall dumps go; NULL: none */
  uint64_t last_dump;  /* when the last stall dump was written (ns) */
  unsigned dumps;      /* stall dumps written, for their names */
};

extern _Thread_local struct weft__ring *weft__tls_ring
    __attribute__((tls_model("initial-exec")));
/* Whether ticks are the CPU's counter (an invariant TSC, the ARM generic
 * timer) or weft__now_ns; decided once per process (trace.c). */
extern bool weft__trace_tsc;

static inline uint64_t weft__ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
  if (weft__trace_tsc)
    return __rdtsc();
#elif defined(__aarch64__)
  if (weft__trace_tsc) {
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
  }
#endif
  return weft__now_ns();
}

static inline uint64_t weft__trace_word(struct weft__ring *r, unsigned type,
                                        unsigned shard) {
  uint64_t tid = (uint32_t)weft__load(&r->tid, WA_RLX);
  return type | (uint64_t)(shard & 0xffffu) << 8 | tid << 32;
}

/* Writes one event into r. The event's stores are releases, so a reader
 * that sees any of them sees the claim before them; done's release store
 * publishes the event whole (trace.c has the argument). On x86 each is a
 * plain store. */
static inline void weft__trace_put(struct weft__ring *r, uint64_t t, uint64_t w,
                                   uint64_t a, uint64_t b) {
  uint64_t k = weft__load(&r->done, WA_RLX);
  weft__store(&r->claim, k + 1, WA_RLX);
  struct weft__ev *e = &r->ev[k & r->mask];
  weft__store(&e->t, t, WA_REL);
  weft__store(&e->w, w, WA_REL);
  weft__store(&e->a, a, WA_REL);
  weft__store(&e->b, b, WA_REL);
  weft__store(&r->done, k + 1, WA_REL);
}

/* Writes an event into the calling thread's ring, if it has one; an event
 * held for later goes first, at the same time. A held end that a run on
 * the same shard follows, of an item that ran one handler and is named
 * as its run was, is folded into the run: the dump can tell it whole from
 * the ring's run before (the item's own: a thread's items do not nest),
 * and the seed case's items, one short handler each, write one event. */
static inline void weft__trace_at(uint64_t t, unsigned type, unsigned shard,
                                  uint64_t a, uint64_t b) {
  struct weft__ring *r = weft__tls_ring;
  if (!r)
    return;
  uint64_t w = weft__trace_word(r, type, shard);
  if (r->held) {
    r->held = false;
    if (type == WEFT_EV_RUN && r->held_b == 1 && r->held_a == r->run_a &&
        r->held_w == ((w & ~(uint64_t)0xff) | WEFT_EV_END))
      w |= WEFT_EV_FOLDED;
    else
      weft__trace_put(r, t, r->held_w, r->held_a, r->held_b);
  }
  if (type == WEFT_EV_RUN)
    r->run_a = a;
  weft__trace_put(r, t, w, a, b);
}

/* Writes an event held for later now, at a tick read now. */
static inline void weft__trace_flush(void) {
  struct weft__ring *r = weft__tls_ring;
  if (r && r->held) {
    r->held = false;
    weft__trace_put(r, weft__ticks(), r->held_w, r->held_a, r->held_b);
  }
}

/* Holds an event without a tick read: it is written with the calling
 * thread's next event, at that event's time, or by weft__trace_flush. For
 * an item's end when the thread may go straight on to the next item (the
 * one tick then serves both); whoever then does anything else first
 * flushes, or writes an event of its own (shard.c). */
static inline void weft__trace_later(unsigned type, unsigned shard, uint64_t a,
                                     uint64_t b) {
  struct weft__ring *r = weft__tls_ring;
  if (!r)
    return;
  weft__trace_flush();
  r->held = true;
  r->held_w = weft__trace_word(r, type, shard);
  r->held_a = a;
  r->held_b = b;
}

static inline void weft__trace(unsigned type, unsigned shard, uint64_t a,
                               uint64_t b) {
  if (weft__tls_ring)
    weft__trace_at(weft__ticks(), type, shard, a, b);
}

/* Whether the calling thread records (a tick read is then worth taking). */
static inline bool weft__tracing(void) { return weft__tls_ring != NULL; }

int weft__trace_init(weft_rt *rt, const weft_config *c);
void weft__trace_free(weft_rt *rt);
/* Gives the calling thread a ring of rt's (one its role and index used
 * before, if free, so a slot's history stays in one ring); without one
 * (recorder off, no memory) it records nothing. */
void weft__trace_attach(weft_rt *rt, int role, unsigned index);
/* The calling thread stops writing its ring; what it wrote stays. */
void weft__trace_detach(void);
/* The monitor, some time after a stall report: a dump into the stall
 * directory, if there is one and none was written in the last 10 s. */
void weft__trace_stall_dump(weft_rt *rt);
/* Whether weft__trace_stall_dump would write anything. */
bool weft__trace_stall_dumps(const weft_rt *rt);

#endif
