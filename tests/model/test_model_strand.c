/*
 * test_model_strand.c - a strand's queue protocol (src/strand.h: enqueue,
 * next, try_idle, mark_released) under the schedule explorer (model.h).
 * Posters push nodes; the one whose push found the strand idle schedules
 * it on the inject queue (src/runq.c); drainers take it from there and run
 * it as weft__strand_run does: run a node, follow the link, go idle by
 * CAS, wait a few spins for a cut link and else requeue, and end a turn
 * after a budget. The loop is this file's copy of strand.c's; the atomic
 * steps are the library's own.
 *
 * Checked: every node runs exactly once; never two drainers in one strand
 * at once; each poster's nodes run in its order; a released strand is
 * reclaimed exactly once, after its last node ran, and nobody touches it
 * after that.
 */
#include "model.h"
#include "runq.h"
#include "strand.h"

#include <string.h>

#define POSTERS 2
#define PER_POSTER 2
#define NODES (POSTERS * PER_POSTER)
#define BUDGET 2     /* nodes per turn, then requeue */
#define LINK_SPINS 2 /* strand.c waits 64; 2 reach the requeue path */

static weft_strand strand;
static struct weft__node node[NODES];
static struct weft__inject runnable;
static unsigned ran[NODES];
static int last_ran[POSTERS];
static unsigned in_strand, reclaimed;
static _Atomic unsigned total_ran, posters_done;
static bool release_it; /* the case releases the strand */

static unsigned node_idx(struct weft__node *n) {
  MODEL_CHECK(n >= node && n < node + NODES, "a foreign node %p", (void *)n);
  return (unsigned)(n - node);
}

static void touch(void) {
  MODEL_CHECK(!reclaimed, "the strand was touched after its reclaim");
}

static void reclaim(void) {
  MODEL_CHECK(!reclaimed, "the strand was reclaimed twice");
  MODEL_CHECK(atomic_load(&total_ran) == NODES,
              "the strand was reclaimed with %u of %u nodes run",
              atomic_load(&total_ran), NODES);
  reclaimed++;
}

static void schedule(void) {
  weft__item it = (weft__item)&strand;
  weft__inject_push(&runnable, &it, 1);
}

/* The handler: node i of poster i / PER_POSTER. */
static void run_node(struct weft__node *n) {
  unsigned i = node_idx(n), p = i / PER_POSTER;
  MODEL_CHECK(in_strand == 1, "%u drainers in the strand at once", in_strand);
  MODEL_CHECK(ran[i] == 0, "node %u ran twice", i);
  MODEL_CHECK((int)i > last_ran[p], "poster %u's node %u ran after %d", p, i,
              last_ran[p]);
  ran[i]++;
  last_ran[p] = (int)i;
  atomic_fetch_add(&total_ran, 1);
}

static struct weft__node *wait_link(struct weft__node *n) {
  for (int i = 0; i < LINK_SPINS; i++) {
    struct weft__node *next = weft__strand_next(n);
    if (next)
      return next;
    weft__cpu_relax();
  }
  return NULL;
}

/* One turn of the strand, as weft__strand_run takes it. */
static void turn(void) {
  touch();
  MODEL_CHECK(++in_strand == 1, "%u drainers in the strand at once", in_strand);
  struct weft__node *n = strand.head;
  if (!n) {
    n = wait_link(strand.ran);
    if (!n) {
      in_strand--;
      schedule();
      return;
    }
    strand.ran = NULL;
  }
  for (unsigned budget = BUDGET;;) {
    run_node(n);
    struct weft__node *next = weft__strand_next(n);
    if (!next) {
      enum weft__strand_end end = weft__strand_try_idle(&strand, n);
      if (end != WEFT_STRAND_CUT) {
        in_strand--;
        if (end == WEFT_STRAND_RECLAIM)
          reclaim();
        return; /* no longer ours */
      }
      next = wait_link(n);
      if (!next) {
        strand.head = NULL;
        strand.ran = n;
        in_strand--;
        schedule();
        return;
      }
    }
    n = next;
    if (--budget == 0) {
      strand.head = n;
      in_strand--;
      schedule();
      return;
    }
  }
}

static void poster(int p) {
  for (unsigned k = 0; k < PER_POSTER; k++) {
    struct weft__node *n = &node[(unsigned)p * PER_POSTER + k];
    touch();
    if (weft__strand_enqueue(&strand, n)) {
      strand.head = n;
      strand.ran = NULL;
      schedule();
    }
  }
  /* The last poster done drops the user's reference: the release proper,
   * from outside the strand (weft_strand_release's strand_retire). */
  if (atomic_fetch_add(&posters_done, 1) + 1 == POSTERS && release_it &&
      weft__strand_mark_released(&strand))
    reclaim();
}

static void drainer(int id) {
  (void)id;
  while (atomic_load(&total_ran) < NODES) {
    weft__item it;
    if (weft__inject_take(&runnable, &it, 1))
      turn();
    else
      weft__cpu_relax();
  }
}

static void setup_common(bool release) {
  memset(&strand, 0, sizeof(strand));
  memset(node, 0, sizeof(node));
  memset(ran, 0, sizeof(ran));
  memset(last_ran, 0xff, sizeof(last_ran));
  in_strand = reclaimed = 0;
  atomic_store(&total_ran, 0);
  atomic_store(&posters_done, 0);
  release_it = release;
  weft__inject_init(&runnable);
}

static void setup_posts(void) { setup_common(false); }
static void setup_release(void) { setup_common(true); }

static void check(void) {
  for (unsigned i = 0; i < NODES; i++)
    MODEL_CHECK(ran[i] == 1, "node %u ran %u times", i, ran[i]);
  MODEL_CHECK(reclaimed == (release_it ? 1u : 0u),
              "reclaimed %u times, released: %d", reclaimed, release_it);
  if (!release_it)
    MODEL_CHECK(weft__load(&strand.tail, WA_RLX) == 0,
                "the strand is not idle at the end");
  weft__inject_destroy(&runnable);
}

static const struct model_case cases[] = {
    {.name = "strand_posts",
     .nthreads = 4,
     .setup = setup_posts,
     .thread = {poster, poster, drainer, drainer},
     .check = check},
    {.name = "strand_release",
     .nthreads = 3,
     .setup = setup_release,
     .thread = {poster, poster, drainer},
     .check = check},
};

int main(int argc, char **argv) {
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
