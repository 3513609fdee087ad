/*
 * core.h - what every part of src/ shares: the cache-line size, whether
 * this is a ThreadSanitizer build, and the names of the runtime's types.
 * Internal: nothing in src/ is visible outside the library.
 *
 * The headers, lowest first; each includes only headers above it here:
 *   atomics.h clock.h futex.h lock.h   the leaf utilities
 *   core.h                             this file
 *   log.h pool.h runq.h park.h thread.h timer.h strand.h monitor.h
 *   backtrace.h blocking.h timer_serve.h listen.h sim.h
 *                                      the parts' types and calls
 *   rt.h       the runtime: settings, and each part's state
 *   shard.h    a shard, the bracket around every handler, homes
 *   io.h       the backend verbs; io_uring.h io_epoll.h io_bufring.h are
 *              the backends' own
 *   sock.h     the socket object; tcp.h and tcp_recv.h, a connection
 * A part's .c file includes whatever it calls, and docs/design.md has
 * the table of which file owns what.
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
