/*
 * atomics.h - the thin layer every atomic operation and every wait of weft
 * goes through. Today each macro is the C11 operation it names; a later
 * deterministic schedule explorer can redefine them to yield at each one and
 * so drive every interleaving of the queues and of the park protocol.
 */
#ifndef WEFT_ATOMICS_H
#define WEFT_ATOMICS_H

#include <stdatomic.h>
#include <stdint.h>

#define WA_RLX memory_order_relaxed
#define WA_ACQ memory_order_acquire
#define WA_REL memory_order_release
#define WA_AR memory_order_acq_rel
#define WA_SC memory_order_seq_cst

#define weft__load(p, mo) atomic_load_explicit((p), mo)
#define weft__store(p, v, mo) atomic_store_explicit((p), (v), mo)
#define weft__xchg(p, v, mo) atomic_exchange_explicit((p), (v), mo)
#define weft__cas(p, expp, v, mos, mof)                                        \
  atomic_compare_exchange_strong_explicit((p), (expp), (v), mos, mof)
#define weft__fetch_add(p, v, mo) atomic_fetch_add_explicit((p), (v), mo)
#define weft__fetch_sub(p, v, mo) atomic_fetch_sub_explicit((p), (v), mo)
#define weft__fetch_or(p, v, mo) atomic_fetch_or_explicit((p), (v), mo)
#define weft__fetch_and(p, v, mo) atomic_fetch_and_explicit((p), (v), mo)
#define weft__fence(mo) atomic_thread_fence(mo)

/* A counter written by one thread at a time and read by any: a relaxed load
 * and store, no locked instruction. */
#define weft__stat_add(p, v)                                                   \
  weft__store((p), weft__load((p), WA_RLX) + (v), WA_RLX)

static inline void weft__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

#endif
