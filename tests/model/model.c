/*
 * model.c - the schedule explorer (model.h): simulated threads as
 * fibers on one OS thread, the strategies that choose which one
 * runs at each point, the futexes and virtual clock of the model build,
 * and the driver that runs a case under every strategy and replays a
 * failure. Owns every fiber's stack and the step log.
 *
 * Choice points: right after an atomic operation, a futex wake or a mutex
 * call (the thread may go on, or any other may run), a spin (another
 * thread runs if one can), and a thread's end or sleep on a futex or a
 * held mutex (another must run). When no thread can run and some sleep
 * with a deadline, virtual time jumps to the earliest deadline and that
 * thread wakes; when all that remain sleep without one, the run fails as
 * a lost wakeup.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "model.h"

/* the hooks' prototypes, declared in the model build */
#include "atomics.h"
#include "clock.h"
#include "futex.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define MODEL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MODEL_ASAN 1
#endif
#endif
#ifdef MODEL_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define STACK_SIZE (256u * 1024)
#define PCT_DEPTH 3   /* bugs of up to 3 ordered events */
#define TAIL_STEPS 48 /* steps printed with a failure */
#define DFS_MAX_DEPTH 100000
#define LOG_CAP 200000
#define FAIR_STEPS 200 /* steps in a row before a thread hands on */

enum fstate { F_RUN, F_SLEEP, F_DONE };
enum kind { K_POINT, K_SPIN, K_GONE, K_START };
enum strategy { S_FIRST, S_RANDOM, S_PCT, S_DFS };
static const char *const strategy_name[] = {"first", "random", "pct", "dfs"};

/* x86-64 switches stacks with weft_model_swap (below): glibc's swapcontext
 * also saves and sets the signal mask, two system calls a switch, which
 * dominated a run's time. Elsewhere, or built with MODEL_UCONTEXT,
 * ucontext. */
#if defined(__x86_64__) && !defined(MODEL_UCONTEXT)
#define MODEL_SWAP 1
#endif

struct fiber {
#ifdef MODEL_SWAP
  void *sp; /* its saved stack pointer while it does not run */
#else
  ucontext_t ctx;
#endif
  char *stack;
  enum fstate state;
  _Atomic uint32_t *futex;
  uint64_t deadline, sleep_seq;
  int64_t prio;
  void *asan_fake;
};

struct step {
  const char *file;
  int line;
  uint8_t thread, kind;
};

struct choice {
  uint32_t idx, k, pre; /* chosen option, options, preemptions before */
  bool preemptive;      /* options past 0 preempt a runnable thread */
};

static struct {
  const struct model_case *c;
  struct fiber f[MODEL_MAX_THREADS];
  int cur; /* -1: the explorer's own stack */
  int last_runner;
  uint64_t run_len; /* steps last_runner made in a row */
#ifdef MODEL_SWAP
  void *main_sp;
#else
  ucontext_t main;
#endif
  void *main_bottom;
  size_t main_size;
  bool in_run, failed;
  char msg[512];
  jmp_buf check_jmp;
  uint64_t steps, max_steps, spin_ns, now, sleep_seq, hash, nlog;
  enum strategy strat;
  uint64_t rng;
  uint64_t pct_k, pct_change[PCT_DEPTH - 1];
  int64_t low;
  struct choice *path; /* dfs: this run's choices */
  uint32_t *plan;      /* dfs: the choices to replay */
  size_t depth, plan_len;
  unsigned bound, preemptions;
  struct step *log;
  bool trace;
} M;

/* ----------------------------------------------------------- PRNG */

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

static uint64_t below(uint64_t n) { return n ? splitmix(&M.rng) % n : 0; }

/* ------------------------------------------------------ switching */

static void asan_start(int to, bool leaving_for_good) {
#ifdef MODEL_ASAN
  void **save = NULL;
  if (!leaving_for_good && M.cur >= 0)
    save = &M.f[M.cur].asan_fake;
  if (to < 0)
    __sanitizer_start_switch_fiber(save, M.main_bottom, M.main_size);
  else
    __sanitizer_start_switch_fiber(save, M.f[to].stack, STACK_SIZE);
#else
  (void)to, (void)leaving_for_good;
#endif
}

static void asan_finish(void) {
#ifdef MODEL_ASAN
  void *fake = M.cur >= 0 ? M.f[M.cur].asan_fake : NULL;
  __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

#ifdef MODEL_SWAP
/* model_swap(from, to): pushes the callee-saved registers (the System V
 * ABI's rbx, rbp, r12-r15) on the current stack, stores the stack pointer
 * in *from, loads to, pops the registers saved there and returns on that
 * stack. A fiber's first stack (fiber_init) holds six zeros and the
 * address of fiber_entry. The floating-point control words are not
 * switched: nothing here changes them. */
void weft_model_swap(void **from, void *to);
__asm__(".text\n"
        ".globl weft_model_swap\n"
        ".hidden weft_model_swap\n"
        ".type weft_model_swap, @function\n"
        "weft_model_swap:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size weft_model_swap, .-weft_model_swap\n");
#endif

/* Runs fiber `to` (-1: the explorer) in place of the current one. */
static void switch_to(int to, bool leaving_for_good) {
  int from = M.cur;
  if (to == from)
    return;
  asan_start(to, leaving_for_good);
  M.cur = to;
#ifdef MODEL_SWAP
  weft_model_swap(from < 0 ? &M.main_sp : &M.f[from].sp,
                  to < 0 ? M.main_sp : M.f[to].sp);
#else
  swapcontext(from < 0 ? &M.main : &M.f[from].ctx,
              to < 0 ? &M.main : &M.f[to].ctx);
#endif
  asan_finish();
}

/* ------------------------------------------------------- choosing */

/* The log keeps the first LOG_CAP steps of a run (model.h's --trace). */
static void log_step(const char *file, int line, enum kind kind) {
  if (M.nlog < LOG_CAP)
    M.log[M.nlog++] = (struct step){file, line, (uint8_t)M.cur, (uint8_t)kind};
}

/* The options, the eligible threads in order: the current one first when
 * it may go on (its staying is no preemption), the others by id. */
static unsigned options(enum kind kind, int *opt) {
  unsigned k = 0;
  int n = (int)M.c->nthreads;
  if (kind == K_POINT && M.cur >= 0 && M.f[M.cur].state == F_RUN)
    opt[k++] = M.cur;
  for (int d = 1; d <= n; d++) {
    int i = ((M.cur < 0 ? -1 : M.cur) + d + n) % n;
    if (i != M.cur && M.f[i].state == F_RUN)
      opt[k++] = i;
  }
  if (!k && kind == K_SPIN && M.f[M.cur].state == F_RUN)
    opt[k++] = M.cur; /* spinning alone: go on */
  return k;
}

/* No thread can run: wake the sleeper with the earliest deadline, moving
 * the clock there. False if none has one. */
static bool wake_timed(void) {
  int best = -1;
  for (unsigned i = 0; i < M.c->nthreads; i++)
    if (M.f[i].state == F_SLEEP && M.f[i].deadline != UINT64_MAX &&
        (best < 0 || M.f[i].deadline < M.f[best].deadline))
      best = (int)i;
  if (best < 0)
    return false;
  if (M.now < M.f[best].deadline)
    M.now = M.f[best].deadline;
  M.f[best].state = F_RUN;
  return true;
}

static uint32_t choose_dfs(unsigned k, bool preemptive) {
  if (M.depth >= DFS_MAX_DEPTH)
    model_fail(__FILE__, __LINE__, "dfs: a run deeper than %d choices",
               DFS_MAX_DEPTH);
  uint32_t idx = M.depth < M.plan_len ? M.plan[M.depth] : 0;
  if (idx >= k)
    model_fail(__FILE__, __LINE__,
               "dfs: the replayed choice %u of %u at depth %zu does not "
               "exist: the case is not deterministic",
               idx, k, M.depth);
  M.path[M.depth++] =
      (struct choice){idx, k, M.preemptions, preemptive && k > 1};
  if (preemptive && idx)
    M.preemptions++;
  return idx;
}

static int choose(enum kind kind) {
  int opt[MODEL_MAX_THREADS];
  unsigned k = options(kind, opt);
  if (!k && wake_timed())
    k = options(kind, opt);
  if (!k) {
    for (unsigned i = 0; i < M.c->nthreads; i++)
      if (M.f[i].state == F_SLEEP)
        model_fail(__FILE__, __LINE__,
                   "deadlock: every thread left (thread %u first) sleeps on "
                   "a futex or mutex that nobody will wake: a lost wakeup",
                   i);
    return -1; /* all done */
  }
  bool preemptive = kind == K_POINT && opt[0] == M.cur;
  uint32_t idx = 0;
  switch (M.strat) {
  case S_FIRST:
    break;
  case S_RANDOM:
    idx = (uint32_t)below(k);
    break;
  case S_PCT:
    for (uint32_t j = 1; j < k; j++)
      if (M.f[opt[j]].prio > M.f[opt[idx]].prio)
        idx = j;
    break;
  case S_DFS:
    /* A spin hands on round-robin: branching there would multiply the
     * tree by every pause of every wait loop; preemptions at the atomic
     * steps around it cover those orders. */
    idx = kind == K_SPIN ? 0 : choose_dfs(k, preemptive);
    break;
  }
  M.hash = (M.hash ^ (uint64_t)opt[idx]) * 0x100000001b3u;
  return opt[idx];
}

static void step(const char *file, int line, enum kind kind) {
  /* Fairness: a thread that ran FAIR_STEPS steps in a row while others
   * could run hands the turn on as at a spin. A loop that retries without
   * pausing (a trylock that failed, a self-wake) waits on another thread,
   * which a real scheduler runs soon; strict priorities (pct) or the
   * schedule without preemptions (dfs) would never run it. */
  if (M.cur != M.last_runner) {
    M.last_runner = M.cur;
    M.run_len = 0;
  }
  if (++M.run_len > FAIR_STEPS && kind == K_POINT)
    kind = K_SPIN;
  log_step(file, line, kind);
  if (++M.steps > M.max_steps)
    model_fail(file, line, "livelock: no end after %" PRIu64 " steps",
               M.max_steps);
  M.now += kind == K_SPIN ? M.spin_ns : 1;
  if (M.strat == S_PCT) {
    for (unsigned i = 0; i < PCT_DEPTH - 1; i++)
      if (M.steps == M.pct_change[i])
        M.f[M.cur].prio = (int64_t)(PCT_DEPTH - 1 - i);
    if (kind == K_SPIN)
      M.f[M.cur].prio = --M.low; /* a spinner waits for the others */
  }
  switch_to(choose(kind), false);
}

/* ------------------------------------------- hooks of the model build */

void weft__model_point(const char *file, int line) {
  if (M.in_run && M.cur >= 0)
    step(file, line, K_POINT);
}

void weft__model_spin(const char *file, int line) {
  if (M.in_run && M.cur >= 0)
    step(file, line, K_SPIN);
}

uint64_t weft__model_now_ns(void) { return M.now; }

void weft__model_futex_wait(_Atomic uint32_t *addr, uint32_t expected,
                            uint64_t deadline_ns, const char *file, int line) {
  weft__model_point(file, line);
  if (!M.in_run || M.cur < 0)
    return; /* outside a run: a spurious wakeup */
  if (atomic_load(addr) != expected || deadline_ns <= M.now)
    return;
  struct fiber *f = &M.f[M.cur];
  f->state = F_SLEEP;
  f->futex = addr;
  f->deadline = deadline_ns;
  f->sleep_seq = ++M.sleep_seq;
  log_step(file, line, K_GONE);
  switch_to(choose(K_GONE), false);
}

/* Makes up to n sleepers on addr runnable, the longest asleep first. */
static void wake_sleepers(const void *addr, int n) {
  while (n-- > 0) {
    struct fiber *first = NULL;
    for (unsigned i = 0; i < M.c->nthreads; i++) {
      struct fiber *f = &M.f[i];
      if (f->state == F_SLEEP && (const void *)f->futex == addr &&
          (!first || f->sleep_seq < first->sleep_seq))
        first = f;
    }
    if (!first)
      return;
    first->state = F_RUN;
  }
}

/* As an atomic step, the point comes after the wake (atomics.h). */
void weft__model_futex_wake(_Atomic uint32_t *addr, int n, const char *file,
                            int line) {
  if (!M.in_run || M.cur < 0)
    return;
  wake_sleepers(addr, n);
  weft__model_point(file, line);
}

/* Mutexes: the code under test calls these for pthread_mutex_lock, _unlock
 * and _trylock (-Wl,--wrap: tests/model/CMakeLists.txt). In a run, a
 * mutex is an owner in this table, and a thread that finds it held sleeps
 * on its address until the holder unlocks; outside a run, the real calls. */
int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __real_pthread_mutex_trylock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t *m);
int __wrap_pthread_mutex_trylock(pthread_mutex_t *m);

#define MAX_MUTEXES 64

static struct {
  pthread_mutex_t *m;
  int owner; /* a fiber, or -1 */
} mtx[MAX_MUTEXES];
static unsigned nmtx;

static int *mtx_owner(pthread_mutex_t *m) {
  for (unsigned i = 0; i < nmtx; i++)
    if (mtx[i].m == m)
      return &mtx[i].owner;
  if (nmtx == MAX_MUTEXES)
    model_fail(__FILE__, __LINE__, "more than %d mutexes", MAX_MUTEXES);
  mtx[nmtx].m = m;
  mtx[nmtx].owner = -1;
  return &mtx[nmtx++].owner;
}

static bool in_fiber(void) { return M.in_run && M.cur >= 0; }

int __wrap_pthread_mutex_trylock(pthread_mutex_t *m) {
  if (!in_fiber())
    return __real_pthread_mutex_trylock(m);
  int *owner = mtx_owner(m);
  int r = *owner >= 0 ? EBUSY : 0;
  if (!r)
    *owner = M.cur;
  step(__FILE__, __LINE__, K_POINT);
  return r;
}

int __wrap_pthread_mutex_lock(pthread_mutex_t *m) {
  if (!in_fiber())
    return __real_pthread_mutex_lock(m);
  step(__FILE__, __LINE__, K_POINT);
  int *owner = mtx_owner(m);
  MODEL_CHECK(*owner != M.cur, "thread %d locks a mutex it holds", M.cur);
  while (*owner >= 0) {
    struct fiber *f = &M.f[M.cur];
    f->state = F_SLEEP;
    f->futex = (_Atomic uint32_t *)(void *)m;
    f->deadline = UINT64_MAX;
    f->sleep_seq = ++M.sleep_seq;
    switch_to(choose(K_GONE), false);
    owner = mtx_owner(m);
  }
  *owner = M.cur;
  return 0;
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m) {
  if (!in_fiber())
    return __real_pthread_mutex_unlock(m);
  int *owner = mtx_owner(m);
  MODEL_CHECK(*owner == M.cur, "thread %d unlocks a mutex held by %d", M.cur,
              *owner);
  *owner = -1;
  wake_sleepers(m, 1);
  step(__FILE__, __LINE__, K_POINT);
  return 0;
}

void model_fail(const char *file, int line, const char *fmt, ...) {
  if (!M.failed) {
    int off = snprintf(M.msg, sizeof(M.msg), "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(M.msg + off, sizeof(M.msg) - (size_t)off, fmt, ap);
    va_end(ap);
  }
  M.failed = true;
  if (M.cur < 0)
    longjmp(M.check_jmp, 1); /* a check, on the explorer's stack */
  switch_to(-1, true);       /* abandon the run; never resumed */
  abort();
}

/* -------------------------------------------------------- one run */

static void trampoline(int id) {
  asan_finish();
  M.c->thread[id](id);
  M.f[id].state = F_DONE;
  log_step("(thread returned)", 0, K_START);
  switch_to(choose(K_GONE), true);
  abort(); /* a finished fiber is never resumed */
}

#ifdef MODEL_SWAP
/* A fiber's first instruction: it runs as M.cur. */
static void fiber_entry(void) { trampoline(M.cur); }
#endif

/* Sets fiber i to start at trampoline(i) on its own stack. */
static void fiber_init(struct fiber *f, unsigned i) {
#ifdef MODEL_SWAP
  (void)i;
  /* From the top, 16-aligned: weft_model_swap pops six registers and
   * returns to fiber_entry, which then finds its stack as after a call
   * (rsp + 8 aligned to 16) with a zero return address above. */
  uintptr_t top = ((uintptr_t)f->stack + STACK_SIZE) & ~(uintptr_t)15;
  void **sp = (void **)(top - 8 * sizeof(void *));
  for (int r = 0; r < 6; r++)
    sp[r] = NULL;
  sp[6] = (void *)fiber_entry;
  sp[7] = NULL;
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK_SIZE;
  f->ctx.uc_link = NULL;
  makecontext(&f->ctx, (void (*)(void))trampoline, 1, (int)i);
#endif
}

static void pct_init(uint64_t seed) {
  M.rng = seed;
  unsigned n = M.c->nthreads;
  int64_t perm[MODEL_MAX_THREADS];
  for (unsigned i = 0; i < n; i++)
    perm[i] = PCT_DEPTH + (int64_t)i;
  for (unsigned i = n; i > 1; i--) {
    unsigned j = (unsigned)below(i);
    int64_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
  for (unsigned i = 0; i < n; i++)
    M.f[i].prio = perm[i];
  for (unsigned i = 0; i < PCT_DEPTH - 1; i++)
    M.pct_change[i] = 1 + below(M.pct_k);
}

/* One run under strategy s (seed: random and pct); true if it failed. */
static bool run_once(enum strategy s, uint64_t seed) {
  const struct model_case *c = M.c;
  M.strat = s;
  M.steps = M.sleep_seq = M.nlog = 0;
  M.now = 1000000000u;
  M.hash = 0xcbf29ce484222325u;
  M.failed = false;
  M.msg[0] = 0;
  M.depth = M.preemptions = 0;
  M.low = 0;
  M.last_runner = -1;
  M.rng = seed;
  nmtx = 0;
  c->setup();
  for (unsigned i = 0; i < c->nthreads; i++) {
    struct fiber *f = &M.f[i];
#ifdef MODEL_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f->stack, STACK_SIZE);
#endif
    f->state = F_RUN;
    f->futex = NULL;
    f->asan_fake = NULL;
    f->prio = 0;
    fiber_init(f, i);
  }
  if (s == S_PCT)
    pct_init(seed);
  M.in_run = true;
  M.cur = -1;
  switch_to(choose(K_START), false);
  M.in_run = false;
  M.cur = -1;
  if (!M.failed && setjmp(M.check_jmp) == 0)
    c->check();
  return M.failed;
}

/* ------------------------------------------------------- reporting */

static void print_tail(size_t from) {
  for (size_t i = from; i < M.nlog; i++) {
    const struct step *st = &M.log[i];
    const char *base = strrchr(st->file, '/');
    static const char *const what[] = {"", " spin", " sleeps", " ends"};
    printf("    %6zu  t%u  %s:%d%s\n", i, st->thread,
           base ? base + 1 : st->file, st->line, what[st->kind]);
  }
}

/* The replay flag's argument for the run just made. */
static void replay_arg(char *buf, size_t len, uint64_t seed) {
  if (M.strat == S_FIRST) {
    snprintf(buf, len, "dfs:-"); /* dfs's first schedule */
    return;
  }
  if (M.strat != S_DFS) {
    snprintf(buf, len, "%s:%" PRIu64, strategy_name[M.strat], seed);
    return;
  }
  size_t off = (size_t)snprintf(buf, len, "dfs:");
  bool any = false;
  for (size_t i = 0; i < M.depth && off + 24 < len; i++)
    if (M.path[i].idx) {
      off += (size_t)snprintf(buf + off, len - off, "%s%u@%zu", any ? "," : "",
                              M.path[i].idx, i);
      any = true;
    }
  if (!any)
    snprintf(buf + off, len - off, "-");
}

static void report_failure(const char *prog, uint64_t seed) {
  char arg[4096];
  replay_arg(arg, sizeof(arg), seed);
  printf("  FAILED under %s after %" PRIu64 " steps: %s\n",
         strategy_name[M.strat], M.steps, M.msg);
  if (!M.trace) {
    printf("  its last steps:\n");
    print_tail(M.nlog > TAIL_STEPS ? M.nlog - TAIL_STEPS : 0);
  }
  printf("  replay: %s --case=%s --replay=%s --trace\n", prog, M.c->name, arg);
}

/* dfs: the next path to run; false when every one within the bound ran. */
static bool dfs_next(void) {
  for (size_t p = M.depth; p-- > 0;) {
    struct choice *ch = &M.path[p];
    if (ch->idx + 1 >= ch->k)
      continue;
    if (ch->preemptive && ch->pre + 1 > M.bound)
      continue;
    for (size_t i = 0; i < p; i++)
      M.plan[i] = M.path[i].idx;
    M.plan[p] = ch->idx + 1;
    M.plan_len = p + 1;
    return true;
  }
  return false;
}

/* Distinct schedules, by the hash of their choices. */
struct hashset {
  uint64_t *v;
  size_t cap, n;
};

static void hs_add(struct hashset *h, uint64_t x) {
  if (2 * (h->n + 1) > h->cap) {
    struct hashset g = {calloc(h->cap ? 2 * h->cap : 1024, 8),
                        h->cap ? 2 * h->cap : 1024, 0};
    if (!g.v)
      return;
    for (size_t i = 0; i < h->cap; i++)
      if (h->v[i])
        hs_add(&g, h->v[i]);
    free(h->v);
    *h = g;
  }
  x |= 1;
  size_t i = x & (h->cap - 1);
  while (h->v[i] && h->v[i] != x)
    i = (i + 1) & (h->cap - 1);
  if (!h->v[i]) {
    h->v[i] = x;
    h->n++;
  }
}

/* ------------------------------------------------------- the driver */

struct opts {
  const char *only, *replay;
  uint64_t runs, seed, dfs_max;
  unsigned bound;
  bool expect_bug;
};

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--case=NAME] [--runs=N] [--seed=S] [--dfs=B]\n"
          "          [--dfs-max=N] [--replay=STRATEGY:ARG] [--trace] "
          "[--expect-bug]\n"
          "  --runs=N       random and pct runs per case (default 2000, or\n"
          "                 WEFT_MODEL_RUNS)\n"
          "  --seed=S       the first run's seed (default 1; run i uses S+i)\n"
          "  --dfs=B        every schedule with at most B preemptions "
          "(default 2;\n"
          "                 -1: none), at most --dfs-max runs (default "
          "200000)\n"
          "  --replay=X     one run: random:SEED, pct:SEED or dfs:PATH, as a\n"
          "                 failure prints it\n"
          "  --trace        print every step of a replayed run\n"
          "  --expect-bug   succeed only if a run fails and its replay fails\n"
          "                 the same way (the deliberately broken builds)\n",
          prog);
}

static bool parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end)
    return false;
  *out = v;
  return true;
}

static int parse(int argc, char **argv, struct opts *o) {
  *o = (struct opts){.runs = 2000, .seed = 1, .dfs_max = 200000, .bound = 2};
  const char *env = getenv("WEFT_MODEL_RUNS");
  if (env && !parse_u64(env, &o->runs)) {
    fprintf(stderr, "WEFT_MODEL_RUNS=%s: not a count\n", env);
    return -1;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    uint64_t v;
    bool ok = true;
    if (!strncmp(a, "--case=", 7))
      o->only = a + 7;
    else if (!strncmp(a, "--runs=", 7))
      ok = parse_u64(a + 7, &o->runs);
    else if (!strncmp(a, "--seed=", 7))
      ok = parse_u64(a + 7, &o->seed);
    else if (!strncmp(a, "--dfs-max=", 10))
      ok = parse_u64(a + 10, &o->dfs_max);
    else if (!strcmp(a, "--dfs=-1"))
      o->bound = UINT32_MAX;
    else if (!strncmp(a, "--dfs=", 6) && (ok = parse_u64(a + 6, &v)))
      o->bound = (unsigned)v;
    else if (!strncmp(a, "--replay=", 9))
      o->replay = a + 9;
    else if (!strcmp(a, "--trace"))
      M.trace = true;
    else if (!strcmp(a, "--expect-bug"))
      o->expect_bug = true;
    else
      ok = false;
    if (!ok) {
      fprintf(stderr, "%s: bad argument '%s'\n", argv[0], a);
      usage(argv[0]);
      return -1;
    }
  }
  return 0;
}

/* Sets strategy, seed and the dfs plan from "random:S", "pct:S", "dfs:P". */
static int parse_replay(const char *r, enum strategy *s, uint64_t *seed) {
  const char *colon = strchr(r, ':');
  if (!colon)
    return -1;
  size_t len = (size_t)(colon - r);
  const char *arg = colon + 1;
  if (len == 6 && !strncmp(r, "random", 6))
    *s = S_RANDOM;
  else if (len == 3 && !strncmp(r, "pct", 3))
    *s = S_PCT;
  else if (len == 3 && !strncmp(r, "dfs", 3))
    *s = S_DFS;
  else
    return -1;
  if (*s != S_DFS)
    return parse_u64(arg, seed) ? 0 : -1;
  memset(M.plan, 0, DFS_MAX_DEPTH * sizeof(*M.plan));
  M.plan_len = 0;
  if (!strcmp(arg, "-"))
    return 0;
  while (*arg) {
    char *end;
    unsigned long idx = strtoul(arg, &end, 10);
    if (*end != '@')
      return -1;
    unsigned long pos = strtoul(end + 1, &end, 10);
    if (pos >= DFS_MAX_DEPTH || (*end && *end != ','))
      return -1;
    M.plan[pos] = (uint32_t)idx;
    if (pos + 1 > M.plan_len)
      M.plan_len = pos + 1;
    arg = *end ? end + 1 : end;
  }
  return 0;
}

static bool run_replay(const char *prog, const struct opts *o) {
  enum strategy s;
  uint64_t seed = 0;
  if (parse_replay(o->replay, &s, &seed)) {
    fprintf(stderr, "--replay=%s: want random:SEED, pct:SEED or dfs:PATH\n",
            o->replay);
    exit(2);
  }
  if (s == S_PCT) {
    run_once(S_FIRST, 0);
    M.pct_k = M.steps;
  }
  bool failed = run_once(s, seed);
  if (M.trace)
    print_tail(0);
  if (failed)
    report_failure(prog, seed);
  else
    printf("  %s replay: %" PRIu64 " steps, passed\n", M.c->name, M.steps);
  return failed;
}

/* A failed run's replay must fail the same way. */
static bool replays(enum strategy s, uint64_t seed) {
  char msg[sizeof(M.msg)];
  memcpy(msg, M.msg, sizeof(msg));
  if (s == S_DFS) {
    for (size_t i = 0; i < M.depth; i++)
      M.plan[i] = M.path[i].idx;
    M.plan_len = M.depth;
  }
  bool again = run_once(s, seed) && !strcmp(msg, M.msg);
  printf("  replayed: %s\n", again ? "the same failure" : "DIFFERENT");
  return again;
}

/* A failed run, reported; with --expect-bug, whether its replay fails the
 * same way. The schedule without preemptions is dfs's first. */
static bool failed_run(const char *prog, const struct opts *o, enum strategy s,
                       uint64_t seed) {
  report_failure(prog, seed);
  return !o->expect_bug || replays(s == S_FIRST ? S_DFS : s, seed);
}

/* Before the strategies: the run without preemptions (pct's k), then one
 * seed twice, which must make one schedule (a replay is only as good as
 * the case's determinism). False, with *failed, if the case ends here. */
static bool first_runs(const char *prog, const struct opts *o, bool *failed) {
  if (run_once(S_FIRST, 0)) {
    *failed = failed_run(prog, o, S_FIRST, 0);
    return false;
  }
  M.pct_k = M.steps;
  uint64_t hash[2], steps[2];
  for (int i = 0; i < 2; i++) {
    if (run_once(S_RANDOM, o->seed)) {
      *failed = failed_run(prog, o, S_RANDOM, o->seed);
      return false;
    }
    hash[i] = M.hash;
    steps[i] = M.steps;
  }
  if (hash[0] == hash[1] && steps[0] == steps[1])
    return true;
  printf("  FAILED: seed %" PRIu64 " made two different schedules (%" PRIu64
         " and %" PRIu64 " steps): the case is not deterministic\n",
         o->seed, steps[0], steps[1]);
  *failed = !o->expect_bug;
  return false;
}

/* One strategy's budget; true if a run failed (see failed_run). */
static bool explore_one(const char *prog, const struct opts *o, enum strategy s,
                        bool *failed) {
  struct hashset seen = {0};
  uint64_t runs = 0, max_steps = 0;
  bool done = true;
  M.plan_len = 0;
  for (;; runs++) {
    if (s != S_DFS && runs == o->runs)
      break;
    if (s == S_DFS && runs == o->dfs_max) {
      done = false;
      break;
    }
    uint64_t seed = o->seed + runs;
    if (run_once(s, seed)) {
      free(seen.v);
      *failed = failed_run(prog, o, s, seed);
      return true;
    }
    hs_add(&seen, M.hash);
    if (M.steps > max_steps)
      max_steps = M.steps;
    if (s == S_DFS && !dfs_next()) {
      runs++;
      break;
    }
  }
  printf("  %-6s %8" PRIu64 " runs, %8zu distinct schedules, up to %" PRIu64
         " steps",
         strategy_name[s], runs, seen.n, max_steps);
  if (s == S_DFS)
    printf(done ? ", every schedule with at most %u preemptions"
                : ", stopped at --dfs-max before the end (bound %u)",
           o->bound);
  printf("\n");
  free(seen.v);
  return false;
}

/* Runs the case under every strategy; true if a run failed (with
 * --expect-bug: and its replay failed the same way). */
static bool explore(const char *prog, const struct opts *o) {
  bool failed = false;
  if (!first_runs(prog, o, &failed))
    return failed;
  M.bound = o->bound;
  for (enum strategy s = S_RANDOM; s <= S_DFS; s++) {
    if (s == S_DFS && o->bound == UINT32_MAX)
      continue;
    if (explore_one(prog, o, s, &failed))
      return failed;
  }
  return false;
}

/* Runs one case as the flags say; true if a run failed. */
static bool run_case(const char *prog, const struct opts *o,
                     const struct model_case *c) {
  M.c = c;
  M.max_steps = c->max_steps ? c->max_steps : 20000;
  M.spin_ns = c->spin_ns ? c->spin_ns : 1000;
  printf("%s (%u threads):\n", c->name, c->nthreads);
  fflush(stdout);
  bool failed = o->replay ? run_replay(prog, o) : explore(prog, o);
  fflush(stdout);
  return failed;
}

static void *must_alloc(size_t n) {
  void *p = calloc(1, n);
  if (!p) {
    fprintf(stderr, "model: out of memory for %zu bytes\n", n);
    exit(2);
  }
  return p;
}

int model_main(int argc, char **argv, const struct model_case *cases,
               unsigned ncases) {
  struct opts o;
  if (parse(argc, argv, &o))
    return 2;
  for (unsigned ci = 0; ci < ncases; ci++)
    if (cases[ci].nthreads < 1 || cases[ci].nthreads > MODEL_MAX_THREADS) {
      fprintf(stderr, "%s: %u threads (1 to %d)\n", cases[ci].name,
              cases[ci].nthreads, MODEL_MAX_THREADS);
      return 2;
    }
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &M.main_bottom, &M.main_size);
    pthread_attr_destroy(&attr);
  }
  M.path = must_alloc(DFS_MAX_DEPTH * sizeof(*M.path));
  M.plan = must_alloc(DFS_MAX_DEPTH * sizeof(*M.plan));
  M.log = must_alloc(LOG_CAP * sizeof(*M.log));
  for (unsigned i = 0; i < MODEL_MAX_THREADS; i++)
    M.f[i].stack = must_alloc(STACK_SIZE);
  /* --expect-bug: 0 once a case failed and replayed, 1 if none did */
  int status = o.expect_bug ? 1 : 0;
  bool matched = false;
  for (unsigned ci = 0; ci < ncases; ci++) {
    if (o.only && strcmp(o.only, cases[ci].name))
      continue;
    matched = true;
    bool failed = run_case(argv[0], &o, &cases[ci]);
    if (o.expect_bug && failed) {
      printf("%s: the broken build was caught\n", argv[0]);
      status = 0;
      break;
    }
    if (!o.expect_bug && failed)
      status = 1;
  }
  if (!matched) {
    fprintf(stderr, "%s: no case named '%s'\n", argv[0], o.only);
    status = 2;
  } else if (o.expect_bug && status) {
    printf("%s: the broken build passed every run: the explorer missed it\n",
           argv[0]);
  }
  for (unsigned i = 0; i < MODEL_MAX_THREADS; i++)
    free(M.f[i].stack);
  free(M.path);
  free(M.plan);
  free(M.log);
  return status;
}
