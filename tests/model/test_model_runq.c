/*
 * test_model_runq.c - src/runq.c under the schedule explorer (model.h):
 * the run queue's owner against a thief, and the inject queue's producers
 * against its consumers. The ring is 4 slots here (WEFT_RUNQ_CAP), so
 * pushes wrap it within a few steps. Every item is taken exactly once,
 * and the inject queue keeps each producer's order.
 */
#include "model.h"
#include "runq.h"

#include <string.h>

#define ITEMS 6

/* Items are the addresses of these links (tag 0); the inject queue chains
 * them through the link word. */
static struct weft__link item[ITEMS];
static unsigned taken[ITEMS];
static struct weft__runq q, thief_q;
static struct weft__inject inj;
static int last_seq[MODEL_MAX_THREADS];
static _Atomic unsigned total;

static unsigned item_idx(weft__item it) {
  struct weft__link *l = (struct weft__link *)it;
  MODEL_CHECK(l >= item && l < item + ITEMS, "a foreign item %p", (void *)it);
  return (unsigned)(l - item);
}

static void take(weft__item it) {
  unsigned i = item_idx(it);
  MODEL_CHECK(taken[i] == 0, "item %u taken twice", i);
  taken[i]++;
  atomic_fetch_add(&total, 1);
}

static void setup(void) {
  memset(item, 0, sizeof(item));
  memset(taken, 0, sizeof(taken));
  memset(last_seq, 0xff, sizeof(last_seq));
  atomic_store(&total, 0);
  weft__runq_init(&q);
  weft__runq_init(&thief_q);
}

static void check_all_once(void) {
  for (unsigned i = 0; i < ITEMS; i++)
    MODEL_CHECK(taken[i] == 1, "item %u taken %u times", i, taken[i]);
}

/* -------------------------------------------------- owner and thief */

/* The owner pushes, pops and pushes again (6 items through 4 slots), then
 * pops until its ring is empty; what it cannot push waits a pop. */
static void owner(int id) {
  (void)id;
  unsigned next = 0;
  while (next < ITEMS) {
    if (weft__runq_push(&q, (weft__item)&item[next])) {
      next++;
      if (next % 3 == 0) {
        weft__item it = weft__runq_pop(&q);
        if (it)
          take(it);
      }
    } else {
      weft__item it = weft__runq_pop(&q);
      if (it)
        take(it);
    }
  }
  for (weft__item it; (it = weft__runq_pop(&q));)
    take(it);
}

/* Steals twice into its own ring and takes what it stole. */
static void thief(int id) {
  (void)id;
  for (int round = 0; round < 2; round++) {
    uint32_t n = 0;
    weft__item it = weft__runq_steal(&q, &thief_q, &n);
    if (!it)
      continue;
    take(it);
    for (weft__item more; (more = weft__runq_pop(&thief_q));)
      take(more);
  }
}

/* The owner claims a batch with grab, as a shard does for its priority
 * ring, while the thief steals. */
static void grabber(int id) {
  (void)id;
  for (unsigned i = 0; i < 4; i++)
    weft__runq_push(&q, (weft__item)&item[i]);
  weft__item out[3];
  uint32_t n = weft__runq_grab(&q, out, 3);
  for (uint32_t i = 0; i < n; i++)
    take(out[i]);
  for (unsigned i = 4; i < ITEMS; i++)
    while (!weft__runq_push(&q, (weft__item)&item[i])) {
      weft__item it = weft__runq_pop(&q);
      if (it)
        take(it);
    }
  for (weft__item it; (it = weft__runq_pop(&q));)
    take(it);
}

/* --------------------------------------------------- inject queue */

/* Producer p pushes items p*3 .. p*3+2: one alone, then two as a chain. */
static void producer(int p) {
  weft__item it[3];
  for (unsigned i = 0; i < 3; i++)
    it[i] = (weft__item)&item[(unsigned)p * 3 + i];
  weft__inject_push(&inj, it, 1);
  weft__inject_push(&inj, it + 1, 2);
}

/* Takes until every item was taken by someone; alone, it checks that
 * each producer's items come in order (with two consumers, the order in
 * which they take is not the order in which they look). */
static void consume_until_all(bool ordered) {
  while (atomic_load(&total) < ITEMS) {
    weft__item out[2];
    uint32_t n = weft__inject_take(&inj, out, 2);
    if (!n)
      weft__cpu_relax();
    for (uint32_t i = 0; i < n; i++) {
      unsigned x = item_idx(out[i]), p = x / 3;
      MODEL_CHECK(!ordered || (int)x > last_seq[p],
                  "producer %u's item %u after %d", p, x, last_seq[p]);
      last_seq[p] = (int)x;
      take(out[i]);
    }
  }
}

static void consumer(int id) {
  (void)id;
  consume_until_all(true);
}

static void any_consumer(int id) {
  (void)id;
  consume_until_all(false);
}

static void setup_inject(void) {
  setup();
  weft__inject_init(&inj);
}

static void check_inject(void) {
  check_all_once();
  MODEL_CHECK(weft__load(&inj.len, WA_RLX) == 0, "len %lld at the end",
              (long long)weft__load(&inj.len, WA_RLX));
  weft__inject_destroy(&inj);
}

static const struct model_case cases[] = {
    {.name = "runq_pop_steal",
     .nthreads = 2,
     .setup = setup,
     .thread = {owner, thief},
     .check = check_all_once},
    {.name = "runq_grab_steal",
     .nthreads = 2,
     .setup = setup,
     .thread = {grabber, thief},
     .check = check_all_once},
    {.name = "inject_mpsc",
     .nthreads = 3,
     .setup = setup_inject,
     .thread = {producer, producer, consumer},
     .check = check_inject},
    {.name = "inject_two_consumers",
     .nthreads = 4,
     .setup = setup_inject,
     .thread = {producer, producer, any_consumer, any_consumer},
     .check = check_inject},
};

int main(int argc, char **argv) {
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
