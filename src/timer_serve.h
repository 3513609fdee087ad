/*
 * timer_serve.h, timer_serve.c - which thread serves which shard's timer
 * wheel, and when (the run loop's side of timers).
 */
#ifndef WEFT_TIMER_SERVE_H
#define WEFT_TIMER_SERVE_H

#include "core.h"

/* Fires sh's own due timers; *now is read on first need (0: not yet). If
 * they are overdue, every other overdue wheel is caught up with too. */
void weft__serve_own(weft_rt *rt, struct weft__shard *sh, uint64_t *now);
/* Fires the due timers of every shard (a searching thread has time). */
void weft__serve_all(weft_rt *rt, struct weft__shard *sh);
/* Looks at one other shard, the next in turn, and serves its timers if
 * they are overdue. Returns that shard if they were and its rings hold
 * work, which its owner, not running, leaves waiting too; else NULL. */
struct weft__shard *weft__serve_one_overdue(weft_rt *rt, struct weft__shard *sh,
                                            uint64_t now);

#endif
