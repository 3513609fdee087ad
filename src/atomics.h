/*
 * atomics.h - the thin layer every atomic operation and every wait of weft
 * goes through. Each macro is the C11 operation it names. In the model
 * build (WEFT_MODEL, tests/model/ only) each one then calls the schedule
 * explorer, which may switch to another simulated thread right after it,
 * so a test drives the interleavings of the real queues and locks one
 * atomic step at a time (after, not before: the plain accesses that follow
 * an atomic step up to the next one then run after a switch, and a plain
 * write left after the publish it should precede is seen);
 * weft__cpu_relax is a spin that hands the turn on. Outside that build the
 * macros expand to the bare operations: nothing to pay.
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

#ifdef WEFT_MODEL
/* tests/model/model.c: a point where the explorer may switch threads, and
 * a spin, where it must if another thread can run. */
void weft__model_point(const char *file, int line);
void weft__model_spin(const char *file, int line);
#define WEFT__MP(op)                                                           \
  __extension__({                                                              \
    __typeof__(op) weft__mp_ = (op);                                           \
    weft__model_point(__FILE__, __LINE__);                                     \
    weft__mp_;                                                                 \
  })
#define WEFT__MPV(op) ((op), weft__model_point(__FILE__, __LINE__))
#else
#define WEFT__MP(op) (op)
#define WEFT__MPV(op) (op)
#endif

#define weft__load(p, mo) WEFT__MP(atomic_load_explicit((p), mo))
#define weft__store(p, v, mo) WEFT__MPV(atomic_store_explicit((p), (v), mo))
#define weft__xchg(p, v, mo) WEFT__MP(atomic_exchange_explicit((p), (v), mo))
#define weft__cas(p, expp, v, mos, mof)                                        \
  WEFT__MP(atomic_compare_exchange_strong_explicit((p), (expp), (v), mos, mof))
#define weft__fetch_add(p, v, mo)                                              \
  WEFT__MP(atomic_fetch_add_explicit((p), (v), mo))
#define weft__fetch_sub(p, v, mo)                                              \
  WEFT__MP(atomic_fetch_sub_explicit((p), (v), mo))
#define weft__fetch_or(p, v, mo)                                               \
  WEFT__MP(atomic_fetch_or_explicit((p), (v), mo))
#define weft__fetch_and(p, v, mo)                                              \
  WEFT__MP(atomic_fetch_and_explicit((p), (v), mo))
#define weft__fence(mo) WEFT__MPV(atomic_thread_fence(mo))

/* A counter written by one thread at a time and read by any: a relaxed load
 * and store, no locked instruction. */
#define weft__stat_add(p, v)                                                   \
  weft__store((p), weft__load((p), WA_RLX) + (v), WA_RLX)

#ifdef WEFT_MODEL
#define weft__cpu_relax() weft__model_spin(__FILE__, __LINE__)
#else
static inline void weft__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}
#endif

#endif
