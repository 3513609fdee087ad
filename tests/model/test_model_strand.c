/*
 * test_model_strand.c - a strand's queue protocol (src/strand.h: enqueue,
 * next, try_idle, mark_released) under the schedule explorer (model.h).
 * Posters push nodes; the one whose push found the strand idle schedules
 * it; drainers take it and run it as weft__strand_run does (drain.h).
 *
 * Checked: every node runs exactly once; never two drainers in one strand
 * at once; each poster's nodes run in its order; a released strand is
 * reclaimed exactly once, after its last node ran, and nobody touches it
 * after that.
 */
#include "drain.h"
#include "model.h"

#include <string.h>

#define POSTERS 2
#define PER_POSTER 2
#define NODES (POSTERS * PER_POSTER)

static struct weft__nhead node[NODES];
static unsigned ran[NODES];
static int last_ran[POSTERS];
static unsigned reclaimed;
static _Atomic unsigned total_ran, posters_done;
static bool release_it; /* the case releases the strand */

static unsigned node_idx(struct weft__nhead *n) {
  MODEL_CHECK(n >= node && n < node + NODES, "a foreign node %p", (void *)n);
  return (unsigned)(n - node);
}

static void on_reclaim(void) {
  MODEL_CHECK(atomic_load(&total_ran) == NODES,
              "the strand was reclaimed with %u of %u nodes run",
              atomic_load(&total_ran), NODES);
  reclaimed++;
}

/* The handler: node i of poster i / PER_POSTER. */
static void run_node(struct weft__nhead *n) {
  unsigned i = node_idx(n), p = i / PER_POSTER;
  MODEL_CHECK(ran[i] == 0, "node %u ran twice", i);
  MODEL_CHECK((int)i > last_ran[p], "poster %u's node %u ran after %d", p, i,
              last_ran[p]);
  ran[i]++;
  last_ran[p] = (int)i;
  atomic_fetch_add(&total_ran, 1);
}

static void poster(int p) {
  for (unsigned k = 0; k < PER_POSTER; k++)
    drain_post(&node[(unsigned)p * PER_POSTER + k]);
  /* The last poster done drops the user's reference: the release proper,
   * from outside the strand (weft_strand_release's strand_retire). */
  if (atomic_fetch_add(&posters_done, 1) + 1 == POSTERS && release_it)
    drain_release();
}

static void drainer(int id) {
  (void)id;
  while (atomic_load(&total_ran) < NODES)
    if (!drain_turn())
      weft__cpu_relax();
}

static void setup_common(bool release) {
  memset(node, 0, sizeof(node));
  memset(ran, 0, sizeof(ran));
  memset(last_ran, 0xff, sizeof(last_ran));
  reclaimed = 0;
  atomic_store(&total_ran, 0);
  atomic_store(&posters_done, 0);
  release_it = release;
  drain_setup(run_node, release ? on_reclaim : NULL);
}

static void setup_posts(void) { setup_common(false); }
static void setup_release(void) { setup_common(true); }

static void check(void) {
  for (unsigned i = 0; i < NODES; i++)
    MODEL_CHECK(ran[i] == 1, "node %u ran %u times", i, ran[i]);
  MODEL_CHECK(reclaimed == (release_it ? 1u : 0u),
              "reclaimed %u times, released: %d", reclaimed, release_it);
  if (!release_it)
    MODEL_CHECK(weft__load(&drain_strand.tail, WA_RLX) == 0,
                "the strand is not idle at the end");
  drain_teardown();
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
