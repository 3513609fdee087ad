/*
 * runq.h, runq.c - the per-shard run queue (a bounded ring with work
 * stealing) and the runtime-wide inject queue. Both hold items: a strand
 * (tag 0) or a handler node posted without a strand (tag 1). Both start
 * with a link word, so the inject queue can chain either; a link word
 * holds the next item, tagged.
 */
#ifndef WEFT_RUNQ_H
#define WEFT_RUNQ_H

#include "core.h"

#include <pthread.h>

typedef uintptr_t weft__item;
#define WEFT_ITEM_NODE ((uintptr_t)1)

struct weft__link {
  _Atomic uintptr_t next;
};

#ifndef WEFT_RUNQ_CAP /* the model tests shrink it, to wrap in a few steps */
#define WEFT_RUNQ_CAP 256 /* power of two */
#endif

/* A bounded ring: the owner pushes at the tail and pops at the head,
 * thieves take half from the head; head moves only by CAS where thieves
 * may be (every runtime of more than one shard). */
struct weft__runq {
  _Atomic uint64_t head WEFT_ALIGNED;
  _Atomic uint64_t tail WEFT_ALIGNED;
  _Atomic uintptr_t slot[WEFT_RUNQ_CAP] WEFT_ALIGNED;
};

/* The runtime-wide queue for items posted from outside and for overflow:
 * producers never wait (one exchange), one consumer at a time by trylock,
 * and others skip it rather than wait. len counts pushed items, maybe late:
 * it is only a hint, see the park protocol in park.c. */
struct weft__inject {
  _Atomic uintptr_t tail WEFT_ALIGNED;
  _Atomic int64_t len;
  uintptr_t head WEFT_ALIGNED; /* consumer only */
  struct weft__link stub;
  pthread_mutex_t lock;
};

void weft__runq_init(struct weft__runq *q);
/* Items in q, from any thread: a snapshot. Its loads are acquires, paired
 * with the releases that move head and tail (runq.c has the argument);
 * head is read first, so the tail read after it is never behind it.
 * Inline: the run loop asks at every poll. */
static inline uint32_t weft__runq_len(struct weft__runq *q) {
  uint64_t h = weft__load(&q->head, WA_ACQ);
  uint64_t t = weft__load(&q->tail, WA_ACQ);
  return t > h ? (uint32_t)(t - h) : 0;
}
/* Owner: push; false when full. */
bool weft__runq_push(struct weft__runq *q, weft__item it);
/* Owner: pop; 0 when empty. */
weft__item weft__runq_pop(struct weft__runq *q);
/* Owner of a ring that no thief can reach, the one shard of a one-shard
 * runtime (steals and take_from_stuck only take from other shards): pop
 * with a store instead of a CAS; 0 when empty. */
weft__item weft__runq_pop_owned(struct weft__runq *q);
/* Owner: claim up to n items from the head into out[]; returns how many. */
uint32_t weft__runq_grab(struct weft__runq *q, weft__item *out, uint32_t n);
/* Thief: move half of victim's items into dst (which the thief owns and
 * which must be empty); returns one of them to run, or 0. */
weft__item weft__runq_steal(struct weft__runq *victim, struct weft__runq *dst,
                            uint32_t *stolen);

void weft__inject_init(struct weft__inject *q);
void weft__inject_destroy(struct weft__inject *q);
/* Push items[0..n) as one chain. Any thread. */
void weft__inject_push(struct weft__inject *q, const weft__item *items,
                       uint32_t n);
/* Take up to max items; 0 taken if empty or another consumer is busy. */
uint32_t weft__inject_take(struct weft__inject *q, weft__item *out,
                           uint32_t max);

#endif
