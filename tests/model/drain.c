/*
 * drain.c - one strand for the model tests, drained as strand.c does it
 * (drain.h). Owns the strand and its run queue.
 */
#include "drain.h"

#include "model.h"

#include <string.h>

#define BUDGET 2     /* nodes per turn, then requeue */
#define LINK_SPINS 2 /* strand.c waits 64; 2 reach the requeue path */

weft_strand drain_strand;
static struct weft__inject runnable;
static void (*on_node)(struct weft__nhead *);
static void (*on_reclaim)(void);
static unsigned in_strand;
static bool reclaimed;

void drain_setup(void (*run_node)(struct weft__nhead *n),
                 void (*reclaim)(void)) {
  memset(&drain_strand, 0, sizeof(drain_strand));
  weft__inject_init(&runnable);
  on_node = run_node;
  on_reclaim = reclaim;
  in_strand = 0;
  reclaimed = false;
}

void drain_teardown(void) { weft__inject_destroy(&runnable); }

void drain_touch(void) {
  MODEL_CHECK(!reclaimed, "the strand was touched after its reclaim");
}

static void reclaim(void) {
  MODEL_CHECK(!reclaimed, "the strand was reclaimed twice");
  MODEL_CHECK(on_reclaim, "a strand nobody released was reclaimed");
  reclaimed = true;
  on_reclaim();
}

static void schedule(void) {
  weft__item it = (weft__item)&drain_strand;
  weft__inject_push(&runnable, &it, 1);
}

void drain_post(struct weft__nhead *n) {
  drain_touch();
  if (weft__strand_enqueue(&drain_strand, n)) {
    drain_strand.head = n;
    drain_strand.ran = NULL;
    schedule();
  }
}

/* Counts this drainer in and out of the strand. The explorer may switch
 * right after the step that gives the strand up (the idle CAS, the requeue
 * push), when another drainer may take it: so the count drops just before
 * that step, and comes back if the step did not give the strand up. */
static void enter(void) {
  MODEL_CHECK(++in_strand == 1, "%u drainers in the strand at once", in_strand);
}

static void leave(void) { in_strand--; }

/* One turn, as weft__strand_run takes it. */
static void turn(void) {
  drain_touch();
  enter();
  struct weft__nhead *n = drain_strand.head;
  if (!n) {
    n = weft__strand_wait_link(drain_strand.ran, LINK_SPINS);
    if (!n) {
      leave();
      schedule();
      return;
    }
    drain_strand.ran = NULL;
  }
  for (unsigned budget = BUDGET;;) {
    on_node(n);
    struct weft__nhead *next = weft__strand_next(n);
    if (!next) {
      leave();
      enum weft__strand_end end = weft__strand_try_idle(&drain_strand, n);
      if (end != WEFT_STRAND_CUT) {
        if (end == WEFT_STRAND_RECLAIM)
          reclaim();
        return; /* no longer ours */
      }
      enter();
      next = weft__strand_wait_link(n, LINK_SPINS);
      if (!next) {
        drain_strand.head = NULL;
        drain_strand.ran = n;
        leave();
        schedule();
        return;
      }
    }
    n = next;
    if (--budget == 0) {
      drain_strand.head = n;
      leave();
      schedule();
      return;
    }
  }
}

bool drain_turn(void) {
  weft__item it;
  if (!weft__inject_take(&runnable, &it, 1))
    return false;
  turn();
  return true;
}

/* The release proper from outside the strand (strand_retire): reclaims at
 * once if idle, else the drainer does. */
void drain_release(void) {
  if (weft__strand_mark_released(&drain_strand))
    reclaim();
}
