/*
 * drain.h, drain.c - one strand for the model tests' cases (model.h),
 * scheduled on an inject queue (src/runq.c) and drained as
 * weft__strand_run does it (src/strand.c): run a node, follow its link, go
 * idle by CAS, wait a few spins for a cut link and else requeue, and end a
 * turn after a budget. The loop is a copy of strand.c's; its atomic steps
 * are strand.h's own. It checks that no two threads are in the strand at
 * once, and that nobody touches it after its reclaim.
 */
#ifndef WEFT_MODEL_DRAIN_H
#define WEFT_MODEL_DRAIN_H

#include "strand.h"

extern weft_strand drain_strand;

/* Before a run: an idle strand whose nodes run through run_node; reclaim
 * (NULL: none expected) when a release's drain ends. */
void drain_setup(void (*run_node)(struct weft__nhead *n),
                 void (*reclaim)(void));
void drain_teardown(void);
/* Queues n on the strand, scheduling it if it was idle (weft__node_post). */
void drain_post(struct weft__nhead *n);
/* Takes the strand from the queue and runs one turn; false if it was not
 * queued. */
bool drain_turn(void);
/* The release proper from outside the strand (strand_retire): reclaims
 * at once if idle, else the drain that ends it does. */
void drain_release(void);
/* Fails the run if the strand was reclaimed. */
void drain_touch(void);

#endif
