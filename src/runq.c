/*
 * runq.c - the per-shard run queue (a bounded ring with work stealing) and
 * the runtime-wide inject queue (runq.h). Owns no memory: both live inside
 * the runtime's shard and runtime structs.
 *
 * Run queue: head and tail are 64-bit counters that only grow; an item
 * lives in slot[index % CAP]. Only the owner writes tail; head moves only
 * by CAS (owner pop, owner grab, thief steal), except in a runtime of one
 * shard, which has no thieves (weft__runq_pop_owned). Why it is correct:
 *  - The owner writes a slot, then stores tail with release. A thief loads
 *    tail with acquire, so the slot writes it reads happen-before its reads.
 *  - The owner writes slot (t % CAP) only when t - head < CAP, with head
 *    loaded by acquire. A thief reads slots [h, h + n) for a head h it
 *    loaded and claims them by CAS(head, h, h + n). The owner cannot write
 *    any of those slots before head has passed h (it would need t >= h +
 *    CAP), and once head passed h the thief's CAS fails and it discards what
 *    it read. Slots are atomics, so a discarded racing read is not UB.
 *  - The thief's successful CAS is a release; the owner's acquire load of
 *    head before reusing a slot orders the thief's reads before the
 *    overwrite.
 *  - ABA on head needs 2^64 increments inside one steal: impossible.
 *
 * Inject queue: Vyukov's intrusive MPSC list over tagged items. Producers:
 * one exchange on tail, then a release store that links the previous item.
 * The consumer side is single-threaded by pthread_mutex_trylock: a thread
 * that finds it taken goes elsewhere, it never waits. Between a producer's
 * exchange and its link store the list is momentarily cut; the consumer then
 * sees "nothing yet" and comes back later (len stays > 0, so nobody parks
 * for good on it; see park.c).
 */
#include "runq.h"

static inline struct weft__link *link_of(uintptr_t it) {
  return (struct weft__link *)(it & ~WEFT_ITEM_NODE);
}

void weft__runq_init(struct weft__runq *q) {
  weft__store(&q->head, 0, WA_RLX);
  weft__store(&q->tail, 0, WA_RLX);
  for (unsigned i = 0; i < WEFT_RUNQ_CAP; i++)
    weft__store(&q->slot[i], 0, WA_RLX);
}

bool weft__runq_push(struct weft__runq *q, weft__item it) {
  uint64_t t = weft__load(&q->tail, WA_RLX); /* only we write it */
  uint64_t h = weft__load(&q->head, WA_ACQ);
  if (t - h >= WEFT_RUNQ_CAP)
    return false;
  weft__store(&q->slot[t % WEFT_RUNQ_CAP], it, WA_RLX);
  weft__store(&q->tail, t + 1, WA_REL);
  return true;
}

weft__item weft__runq_pop(struct weft__runq *q) {
  uint64_t h = weft__load(&q->head, WA_ACQ);
  for (;;) {
    uint64_t t = weft__load(&q->tail, WA_RLX);
    if (h == t)
      return 0;
    weft__item it = weft__load(&q->slot[h % WEFT_RUNQ_CAP], WA_RLX);
    /* On failure h is reloaded: a thief took the head item(s). */
    if (weft__cas(&q->head, &h, h + 1, WA_AR, WA_ACQ))
      return it;
  }
}

/* No thief can reach the ring (runq.h): head is the owner's alone, as
 * tail is. The store is a release all the same, as the CAS's success is,
 * for readers of the length (runq_len's acquire loads); a new holder
 * after a handoff is ordered after this one by the handoff itself. */
weft__item weft__runq_pop_owned(struct weft__runq *q) {
  uint64_t h = weft__load(&q->head, WA_RLX);
  if (h == weft__load(&q->tail, WA_RLX))
    return 0;
  weft__item it = weft__load(&q->slot[h % WEFT_RUNQ_CAP], WA_RLX);
  weft__store(&q->head, h + 1, WA_REL);
  return it;
}

uint32_t weft__runq_grab(struct weft__runq *q, weft__item *out, uint32_t n) {
  uint64_t h = weft__load(&q->head, WA_ACQ);
  for (;;) {
    uint64_t t = weft__load(&q->tail, WA_RLX);
    uint32_t avail = (uint32_t)(t - h);
    uint32_t k = avail < n ? avail : n;
    for (uint32_t i = 0; i < k; i++)
      out[i] = weft__load(&q->slot[(h + i) % WEFT_RUNQ_CAP], WA_RLX);
    if (weft__cas(&q->head, &h, h + k, WA_AR, WA_ACQ))
      return k;
  }
}

weft__item weft__runq_steal(struct weft__runq *victim, struct weft__runq *dst,
                            uint32_t *stolen) {
  weft__item buf[WEFT_RUNQ_CAP / 2];
  uint32_t n;
  uint64_t h = weft__load(&victim->head, WA_ACQ);
  for (;;) {
    uint64_t t = weft__load(&victim->tail, WA_ACQ);
    if (t <= h || t - h > WEFT_RUNQ_CAP) {
      /* Empty, or h and t read at different moments: re-read once. */
      if (t <= h)
        return 0;
      h = weft__load(&victim->head, WA_ACQ);
      continue;
    }
    n = (uint32_t)(t - h);
    n -= n / 2; /* half, rounded up */
    if (n > WEFT_RUNQ_CAP / 2)
      n = WEFT_RUNQ_CAP / 2;
    for (uint32_t i = 0; i < n; i++)
      buf[i] = weft__load(&victim->slot[(h + i) % WEFT_RUNQ_CAP], WA_RLX);
    if (weft__cas(&victim->head, &h, h + n, WA_AR, WA_ACQ))
      break;
  }
  /* dst is ours and empty: the rest fits. */
  for (uint32_t i = 1; i < n; i++)
    weft__runq_push(dst, buf[i]);
  *stolen = n;
  return buf[0];
}

void weft__inject_init(struct weft__inject *q) {
  weft__store(&q->stub.next, 0, WA_RLX);
  weft__store(&q->tail, (uintptr_t)&q->stub, WA_RLX);
  weft__store(&q->len, 0, WA_RLX);
  q->head = (uintptr_t)&q->stub;
  pthread_mutex_init(&q->lock, NULL);
}

void weft__inject_destroy(struct weft__inject *q) {
  pthread_mutex_destroy(&q->lock);
}

static void push_chain(struct weft__inject *q, uintptr_t first,
                       uintptr_t last) {
  weft__store(&link_of(last)->next, 0, WA_RLX);
  /* acq_rel: the exchange publishes our chain's links (release) and
   * acquires the previous pusher's item before we write its link. */
  uintptr_t prev = weft__xchg(&q->tail, last, WA_AR);
  weft__store(&link_of(prev)->next, first, WA_REL);
}

void weft__inject_push(struct weft__inject *q, const weft__item *items,
                       uint32_t n) {
  if (!n)
    return;
  for (uint32_t i = 0; i + 1 < n; i++)
    weft__store(&link_of(items[i])->next, items[i + 1], WA_RLX);
  push_chain(q, items[0], items[n - 1]);
  /* seq_cst: ordered before the notifier's read of the idle state in the
   * single total order, against the parker's state change and len read. */
  weft__fetch_add(&q->len, n, WA_SC);
}

/* Single consumer (lock held): one item, or 0 if empty or cut. */
static uintptr_t pop_one(struct weft__inject *q) {
  uintptr_t stub = (uintptr_t)&q->stub;
  uintptr_t head = q->head;
  uintptr_t next = weft__load(&link_of(head)->next, WA_ACQ);
  if (head == stub) {
    if (!next)
      return 0;
    q->head = head = next;
    next = weft__load(&link_of(head)->next, WA_ACQ);
  }
  if (next) {
    q->head = next;
    return head;
  }
  if (weft__load(&q->tail, WA_ACQ) != head)
    return 0; /* a producer is between its exchange and its link */
  push_chain(q, stub, stub);
  next = weft__load(&link_of(head)->next, WA_ACQ);
  if (next) {
    q->head = next;
    return head;
  }
  return 0;
}

uint32_t weft__inject_take(struct weft__inject *q, weft__item *out,
                           uint32_t max) {
  if (weft__load(&q->len, WA_RLX) <= 0)
    return 0;
  if (pthread_mutex_trylock(&q->lock) != 0)
    return 0;
  uint32_t n = 0;
  while (n < max) {
    uintptr_t it = pop_one(q);
    if (!it)
      break;
    out[n++] = it;
  }
  if (n)
    weft__fetch_sub(&q->len, n, WA_RLX);
  pthread_mutex_unlock(&q->lock);
  return n;
}
