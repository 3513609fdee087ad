/*
 * blocking.h, blocking.c - the blocking pool: elastic threads for calls
 * that block, separate from the shards' threads (weft_blocking).
 */
#ifndef WEFT_BLOCKING_H
#define WEFT_BLOCKING_H

#include "core.h"

/* At create: the job table (cfg's queue bound is also its memory bound).
 * -EINVAL if the bound is too large, -ENOMEM. */
int weft__blocking_init(weft_rt *rt, const weft_config *cfg);
/* At shutdown: pool threads exit once idle; at a CANCEL shutdown the
 * queued jobs' done run with -ECANCELED. */
void weft__blocking_shutdown(weft_rt *rt);
/* Joins the pool threads and frees the table; a no-op the second time. */
void weft__blocking_destroy(weft_rt *rt);
void weft__blocking_stats(weft_rt *rt, weft_stats *out);

#endif
