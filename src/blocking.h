/*
 * blocking.h, blocking.c - the blocking pool: elastic threads for calls
 * that block, separate from the shards' threads (weft_blocking).
 */
#ifndef WEFT_BLOCKING_H
#define WEFT_BLOCKING_H

#include "core.h"

/* The runtime whose blocking job the calling thread runs, or NULL: a job
 * that waits for its runtime's end waits for itself (rt.c, -EDEADLK). */
extern _Thread_local weft_rt *weft__job_rt;

/* At create: the two pools, weft_blocking's and name resolution's
 * (resolve.c), each with its own threads and job table, so that lookups
 * waiting on a name server never hold the threads other jobs need. The
 * job table (cfg's queue bound is also its memory bound).
 * -EINVAL if the bound is too large, -ENOMEM. */
int weft__blocking_init(weft_rt *rt, const weft_config *cfg);
/* At shutdown: pool threads exit once idle; at a CANCEL shutdown the
 * queued jobs' done run with -ECANCELED. */
void weft__blocking_shutdown(weft_rt *rt);
/* Joins the pool threads and frees the table; a no-op the second time. */
void weft__blocking_destroy(weft_rt *rt);
void weft__blocking_stats(weft_rt *rt, weft_stats *out);
/* weft_blocking and weft_blocking_cancel on pool b (rt->blocking or
 * rt->resolver); the caller has checked its arguments. */
int weft__blocking_submit(weft_rt *rt, struct weft__blocking *b,
                          weft_work_fn work, void *arg,
                          weft_strand *done_strand, weft_done_fn done,
                          weft_job *job);
int weft__blocking_cancel_in(weft_rt *rt, struct weft__blocking *b,
                             weft_job id);
#ifdef WEFT_SIM
/* Simulation (sim.c): the jobs queued in both pools, and running the
 * k-th of them (k below that count) as a pool thread would. */
unsigned weft__blocking_sim_queued(weft_rt *rt);
void weft__blocking_sim_step(weft_rt *rt, unsigned k);
#endif

#endif
