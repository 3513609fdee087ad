/*
 * core.h - what every part of src/ shares: the cache-line size, whether
 * this is a ThreadSanitizer build, and the names of the runtime's types.
 * Internal: nothing in src/ is visible outside the library.
 *
 * The parts, lowest first (each header includes only those below it):
 *   atomics.h clock.h futex.h lock.h pool.h runq.h   leaf utilities
 *   rt.h       the runtime: settings and each part's state
 *   thread.h   runtime threads, and which shard the caller holds
 *   shard.h    a shard, the run loop, the bracket around every handler
 *   strand.h park.h timer.h monitor.h blocking.h    scheduling parts
 *   io.h       the backend verbs; io_uring.h io_epoll.h io_bufring.h
 *              are the backends' own
 *   sock.h     the socket object; tcp.h listen.h tcp_recv.h its kinds
 */
#ifndef WEFT_CORE_H
#define WEFT_CORE_H

#include "atomics.h"
#include "weft.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WEFT_CACHELINE 64
#define WEFT_ALIGNED __attribute__((aligned(WEFT_CACHELINE)))

/* ThreadSanitizer does not know membarrier(2): its builds make the
 * handoff's and the stamps' protocols seq_cst instead (thread.h). */
#if defined(__SANITIZE_THREAD__)
#define WEFT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WEFT_TSAN 1
#endif
#endif

struct weft__shard;
struct weft__thread;
struct weft__node;
struct weft__io;
struct weft__sock;
struct weft__monitor;
struct weft__blocking;

#endif
