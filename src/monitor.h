/*
 * monitor.h, monitor.c - the monitor thread: notices a shard whose thread
 * has been inside one handler longer than the stall threshold, reports it,
 * and hands the shard to a spare thread; and the spare threads themselves.
 * monitor.c has the handoff protocol's argument.
 */
#ifndef WEFT_MONITOR_H
#define WEFT_MONITOR_H

#include "core.h"

/* MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED; whether handoffs may use it.
 * Called by weft_rt_create before the runtime starts a thread. */
bool weft__membarrier_register(void);
int weft__monitor_start(weft_rt *rt);
/* Starts one spare at create, so the first stall finds one. */
int weft__spare_prestart(weft_rt *rt);
/* join tells the monitor thread to exit and waits until it has: no stall
 * is reported, nor on_stall called, from then on. stop joins it if that
 * was not done and frees its state, which a late nudge may still read
 * until then. */
void weft__monitor_join(weft_rt *rt);
void weft__monitor_stop(weft_rt *rt);
/* A thread unparked: a monitor asleep for an idle runtime watches again. */
void weft__monitor_nudge(weft_rt *rt);
/* A thread without a shard: wait as a spare; false when it must exit. */
bool weft__spare_wait(struct weft__thread *t);
/* At done: every spare wakes and exits. */
void weft__spares_wake_all(weft_rt *rt);
/* A stall's line in the log (WEFT_LOG_WARN), with the count of reports
 * not printed since the last one and why it has no backtrace ("" if it
 * has); the simulation's monitor (sim.c) prints the same. */
void weft__stall_log(weft_rt *rt, const weft_stall *st, uint64_t suppressed,
                     const char *why);

#endif
