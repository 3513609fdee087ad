/*
 * test_model_lock.c - weft__lock (src/lock.h, src/lock.c) under the
 * schedule explorer (model.h): threads take the lock, spin, sleep on its
 * futex and wake each other. Checked: one holder at a time, no increment
 * lost, and no thread left asleep with the lock free (the explorer fails
 * such a run as a lost wakeup). Virtual time ends the spin before a sleep
 * after one pause, so that most contended takes reach the futex.
 */
#include "lock.h"
#include "model.h"

#define ROUNDS 2

static weft__lock_t lock;
static int holder;
static unsigned count;
static _Atomic uint32_t work; /* a word touched inside the section */

static void taker(int id) {
  for (int r = 0; r < ROUNDS; r++) {
    weft__lock(&lock);
    MODEL_CHECK(holder < 0, "thread %d took the lock thread %d holds", id,
                holder);
    holder = id;
    unsigned c = count;
    /* a step inside the section, where another thread may run */
    weft__fetch_add(&work, 1, WA_RLX);
    count = c + 1;
    MODEL_CHECK(holder == id, "thread %d's section ran beside %d's", id,
                holder);
    holder = -1;
    weft__unlock(&lock);
  }
}

static void setup(void) {
  weft__lock_init(&lock);
  holder = -1;
  count = 0;
  atomic_store(&work, 0);
}

static void check(void) {
  MODEL_CHECK(count == 3 * ROUNDS, "count %u, not %d", count, 3 * ROUNDS);
  MODEL_CHECK(atomic_load(&lock.word) == 0, "the lock word is %u at the end",
              atomic_load(&lock.word));
}

static const struct model_case cases[] = {
    {.name = "lock_three",
     .nthreads = 3,
     .setup = setup,
     .thread = {taker, taker, taker},
     .check = check,
     .spin_ns = 20000}, /* one pause, then the futex (lock.c) */
};

int main(int argc, char **argv) {
  return model_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
