/*
 * pool.h, pool.c - fixed-size object pools: strands, timers, handler
 * nodes, sockets. Objects are carved from slabs that live as long as the
 * runtime. A shard keeps a private cache (owner only, no atomics); caches
 * trade batches with the pool's depot under a mutex, so steady-state
 * alloc/free touches nothing shared. Threads outside the runtime use the
 * depot directly.
 */
#ifndef WEFT_POOL_H
#define WEFT_POOL_H

#include "core.h"

#include <pthread.h>

struct weft__freeobj {
  struct weft__freeobj *next;
  struct weft__freeobj *batch_next; /* depot: next batch (first obj only) */
};

struct weft__pool_cache {
  struct weft__freeobj *head;
  uint32_t count;
};

struct weft__slab;

struct weft__pool {
  pthread_mutex_t lock;
  size_t objsize;
  struct weft__freeobj *batches; /* full batches of WEFT_POOL_BATCH */
  struct weft__pool_cache loose; /* for threads outside the runtime */
  struct weft__slab *slabs;
  char *bump, *bump_end;         /* uncarved rest of the newest slab */
  char *reserved, *reserved_end; /* weft__pool_reserve's region, or NULL */
};

#define WEFT_POOL_BATCH 64

/* objsize is rounded up to whole cache lines. */
int weft__pool_init(struct weft__pool *p, size_t objsize);
void weft__pool_destroy(struct weft__pool *p);
/* Gives p bytes at mem (cacheline aligned) to carve before any slab of its
 * own; the caller keeps mem mapped until weft__pool_destroy. */
void weft__pool_reserve(struct weft__pool *p, void *mem, size_t bytes);
/* cache may be NULL (caller outside the runtime). NULL on ENOMEM. */
void *weft__pool_alloc(struct weft__pool *p, struct weft__pool_cache *cache);
void weft__pool_free(struct weft__pool *p, struct weft__pool_cache *cache,
                     void *obj);
/* Calls fn on every object carved so far, free or not (a carved object
 * starts zeroed; a free one has only its first 16 bytes overwritten). Any
 * thread; fn runs without the pool's lock. */
void weft__pool_each(struct weft__pool *p, void (*fn)(void *obj, void *arg),
                     void *arg);

#endif
