/*
 * pool.c - fixed-size object pools (pool.h). Owns the slabs.
 *
 * Objects are carved from slabs that live until the runtime is destroyed,
 * so a strand the user never released is still freed then. Each shard has a
 * private cache used only by the thread holding the shard: no atomics on
 * the steady-state path. A cache that grows past two batches gives one batch
 * back to the depot; an empty cache takes one batch from the depot, or
 * carves a new one. The depot's mutex is thus taken once per
 * WEFT_POOL_BATCH objects at most, and never while a handler runs.
 *
 * Carving starts in a region the runtime reserved in its arena (rt.c),
 * sized for one batch per shard, and goes on in slabs of its own. A
 * carved object starts zeroed, and every object ever carved can be
 * visited (weft__pool_each): the shutdown sweep finds the live sockets
 * this way, by an atomic word that the zeroing makes valid from the start
 * (sock.c).
 *
 * Every object fills whole cache lines. An object is often freed by a
 * thread other than the one that allocated it (a node is posted on one
 * shard and run on another), so its neighbours in a slab soon belong to
 * different threads' caches; two objects in one line then make every
 * write to either a transfer between CPUs (bench/post's pair_run_ns: two
 * self-posting strands on two workers).
 */
#include "pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SLAB_BYTES (64 * 1024)

struct weft__slab {
  struct weft__slab *next;
};

int weft__pool_init(struct weft__pool *p, size_t objsize) {
  if (objsize < sizeof(struct weft__freeobj))
    objsize = sizeof(struct weft__freeobj);
  objsize = (objsize + WEFT_CACHELINE - 1) & ~(size_t)(WEFT_CACHELINE - 1);
  p->objsize = objsize;
  p->batches = NULL;
  p->loose.head = NULL;
  p->loose.count = 0;
  p->slabs = NULL;
  p->bump = p->bump_end = NULL;
  p->reserved = p->reserved_end = NULL;
  return -pthread_mutex_init(&p->lock, NULL);
}

void weft__pool_destroy(struct weft__pool *p) {
  struct weft__slab *s = p->slabs;
  while (s) {
    struct weft__slab *next = s->next;
    free(s);
    s = next;
  }
  p->slabs = NULL;
  pthread_mutex_destroy(&p->lock);
}

void weft__pool_reserve(struct weft__pool *p, void *mem, size_t bytes) {
  p->bump = p->reserved = mem;
  p->bump_end = p->reserved_end = (char *)mem + bytes;
}

/* Carves up to n objects from slabs into a chain; lock held. */
static struct weft__freeobj *carve(struct weft__pool *p, uint32_t n,
                                   uint32_t *got) {
  struct weft__freeobj *head = NULL;
  uint32_t i = 0;
  for (; i < n; i++) {
    if (!p->bump || (size_t)(p->bump_end - p->bump) < p->objsize) {
      struct weft__slab *s = aligned_alloc(WEFT_CACHELINE, SLAB_BYTES);
      if (!s)
        break;
      s->next = p->slabs;
      p->slabs = s;
      p->bump = (char *)s + WEFT_CACHELINE;
      p->bump_end = (char *)s + SLAB_BYTES;
    }
    struct weft__freeobj *o = (struct weft__freeobj *)p->bump;
    memset(o, 0, p->objsize);
    p->bump += p->objsize;
    o->next = head;
    head = o;
  }
  *got = i;
  return head;
}

/* Refills an empty cache with one batch; lock held. */
static void refill(struct weft__pool *p, struct weft__pool_cache *c) {
  if (p->batches) {
    struct weft__freeobj *b = p->batches;
    p->batches = b->batch_next;
    c->head = b;
    c->count = WEFT_POOL_BATCH;
    return;
  }
  c->head = carve(p, WEFT_POOL_BATCH, &c->count);
}

void *weft__pool_alloc(struct weft__pool *p, struct weft__pool_cache *c) {
  bool locked = false;
  if (!c) {
    pthread_mutex_lock(&p->lock);
    locked = true;
    c = &p->loose;
  }
  if (!c->head) {
    if (!locked)
      pthread_mutex_lock(&p->lock);
    refill(p, c);
    if (!locked)
      pthread_mutex_unlock(&p->lock);
  }
  struct weft__freeobj *o = c->head;
  if (o) {
    c->head = o->next;
    c->count--;
  }
  if (locked)
    pthread_mutex_unlock(&p->lock);
  return o;
}

/* Detaches one batch from a cache that holds more than a batch. */
static struct weft__freeobj *detach_batch(struct weft__pool_cache *c) {
  struct weft__freeobj *first = c->head, *last = first;
  for (uint32_t i = 1; i < WEFT_POOL_BATCH; i++)
    last = last->next;
  c->head = last->next;
  c->count -= WEFT_POOL_BATCH;
  last->next = NULL;
  return first;
}

void weft__pool_free(struct weft__pool *p, struct weft__pool_cache *c,
                     void *obj) {
  bool locked = false;
  if (!c) {
    pthread_mutex_lock(&p->lock);
    locked = true;
    c = &p->loose;
  }
  struct weft__freeobj *o = obj;
  o->next = c->head;
  c->head = o;
  c->count++;
  if (c->count >= 2 * WEFT_POOL_BATCH) {
    struct weft__freeobj *b = detach_batch(c);
    if (!locked)
      pthread_mutex_lock(&p->lock);
    b->batch_next = p->batches;
    p->batches = b;
    if (!locked)
      pthread_mutex_unlock(&p->lock);
  }
  if (locked)
    pthread_mutex_unlock(&p->lock);
}

/* The slabs are never freed and only prepended, and carving only moves
 * bump forward, so what the lock shows here stays carved: the walk needs
 * the lock only for that view, not while fn runs. Objects carved after it
 * are not visited. */
void weft__pool_each(struct weft__pool *p, void (*fn)(void *obj, void *arg),
                     void *arg) {
  pthread_mutex_lock(&p->lock);
  struct weft__slab *slabs = p->slabs;
  char *reserved = p->reserved, *reserved_end = p->reserved_end;
  char *bump = p->bump;
  pthread_mutex_unlock(&p->lock);
  size_t sz = p->objsize;
  for (struct weft__slab *s = slabs; s; s = s->next) {
    char *o = (char *)s + WEFT_CACHELINE, *end = (char *)s + SLAB_BYTES;
    if (s == slabs)
      end = bump; /* the newest slab, where bump is: carved up to it */
    for (; o + sz <= end; o += sz)
      fn(o, arg);
  }
  if (!reserved)
    return;
  /* The reserved region is carved first: whole, once a slab exists. */
  char *end = slabs ? reserved_end : bump;
  for (char *o = reserved; o + sz <= end; o += sz)
    fn(o, arg);
}
