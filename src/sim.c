/*
 * sim.c - simulation (sim.h): the driver, the virtual clock, the log of
 * handler calls and its hash, stalls and the monitor's looks at them, and
 * the line that names the seed when a simulated run crashes (the host's
 * ports and names are in sim_host.c). Compiled
 * into every library; everything but the stubs of weft_rt_sim_info and
 * weft_sim_stall is in the weft_sim build only (WEFT_SIM).
 *
 * A step is one of: a shard's thread takes its next item (its rings, a
 * due timer, the inject queue, a steal) and runs it, as its run loop
 * would; or a queued blocking job runs, as a pool thread would. Every
 * shard is a candidate while any work is queued anywhere (one with none
 * of its own steals, which is how work moves between shards), and the
 * blocking jobs are one more candidate while any is queued; the PRNG
 * picks among them, and which queued job runs. Each handler call, and
 * each step, takes 1 to 2000 virtual nanoseconds, also drawn, so timers
 * and handlers interleave differently from seed to seed. With nothing
 * queued, each shard's backend takes in what its sockets have ready (in
 * a drawn order of shards, each wait's events shuffled), and if that
 * queues nothing, the clock jumps to the earliest armed timer. Everything
 * else the runtime does on the way, the kernel's answers on Unix sockets
 * included (docs/design.md, "Simulation"), is deterministic for a given
 * sequence of choices, so a seed and a program give one run. Faults
 * (weft__sim_fault) are draws too, taken only for the kinds asked for.
 *
 * The log numbers each function and strand by its first appearance
 * (addresses change from run to run with ASLR and malloc; the order in
 * which they appear does not), and hashes (virtual time, shard, function,
 * strand) per call with FNV-1a.
 */
#include "sim.h"

#include "rt.h"

#include <errno.h>

#ifndef WEFT_SIM

int weft_rt_sim_info_sized(weft_rt *rt, weft_sim_info *out, size_t size) {
  (void)size;
  return !rt || !out ? -EINVAL : -ENOTSUP;
}

int weft_sim_stall(uint64_t ns) {
  (void)ns;
  return -ENOTSUP;
}

#else

#include "blocking.h"
#include "clock.h"
#include "io.h"
#include "log.h"
#include "monitor.h"
#include "shard.h"
#include "thread.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Virtual time starts here, not at 0, so that deadlines computed as
 * "now minus a span" stay positive. */
#define CLOCK_BASE (1000ull * 1000000000u)
#define STEP_NS_MAX 2000u
#define DELAY_NS_MAX 1000000u /* a WEFT_SIM_FAULT_DELAY: up to 1 ms */
#define DEFAULT_WORKERS 4u

_Atomic uint64_t weft__sim_clock;
_Atomic uint32_t weft__sim_live;

/* The process's runtimes of this library: a simulation changes what
 * weft__now_ns reads, so none runs beside another runtime. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_real;
static unsigned g_serial; /* simulations created: their hosts' names */
static weft_rt *g_sim;    /* the live simulation (weft_sim_stall) */
/* The live simulation's seed, for the crash line (async-signal-safe). */
static volatile sig_atomic_t g_have_seed;
static uint64_t g_seed;

/* Pointers numbered by first appearance: open addressing, grown at half
 * full. */
struct idmap {
  uintptr_t *keys;
  uint32_t *ids;
  size_t cap, n;
};

struct stall;

/* What the monitor knows of a thread's handler (monitor.c's per-shard
 * since, reported, handed), per thread slot: the epoch, when it began,
 * and whether it was reported and its shard handed on. A handler that
 * stalls twice is one stall to the monitor, timed from its start. */
struct seen {
  uint64_t epoch, since;
  bool reported, handed;
};

struct weft__sim {
  uint64_t seed, rng;
  /* Written by the driver only (one at a time: driving), read by
   * weft_rt_sim_info from any thread: relaxed, as statistics are; a
   * reader beside a driver may see each from a different step. */
  _Atomic uint64_t steps, handlers, hash, faults;
  unsigned fault_kinds, fault_odds;
  /* One thread drives at a time: the others that wait (weft_rt_wait,
   * weft_rt_shutdown, from any thread) sleep on life.cond until the run
   * is done, their timeout passes or the driver returns, and then one of
   * them drives on. driving is under life.lock; wake_at, the earliest
   * deadline of a sleeper (UINT64_MAX: none), is written under it and
   * read relaxed by the driver, which wakes the sleepers once the clock
   * reaches it: a late look only wakes them a step later. */
  bool driving;
  _Atomic uint64_t wake_at;
  bool monitor;         /* the application left the monitor on */
  struct stall *stalls; /* the innermost stall under way, or NULL */
  unsigned nstalls;
  uint64_t last_print, suppressed; /* stall lines, one a second (monitor.c) */
  unsigned *can;     /* the shards a step may take (steppable), nshards long */
  struct seen *seen; /* per thread slot, th.max long */
  unsigned serial;   /* the simulated host's, in its socket names */
  /* Ephemeral ports taken, of every kind: the next is WEFT_SIM_FIRST_PORT plus
   * this, wrapped. Atomic: a connect or a listen may come from a thread
   * other than the driver's (which a seed does not repeat). */
  _Atomic uint32_t ports_taken;
  struct idmap fns, strands;
  FILE *log; /* WEFT_SIM_LOG, or NULL */
};

/* splitmix64: a full-period generator whose outputs are well mixed even
 * from seeds 1, 2, 3. */
static uint64_t rnd(struct weft__sim *m) {
  uint64_t z = (m->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t idmap_get(struct idmap *im, const void *p) {
  uintptr_t k = (uintptr_t)p;
  if (!k)
    return 0;
  if (2 * (im->n + 1) > im->cap) {
    size_t cap = im->cap ? 2 * im->cap : 256;
    uintptr_t *keys = calloc(cap, sizeof(*keys));
    uint32_t *ids = calloc(cap, sizeof(*ids));
    if (!keys || !ids) { /* numbered 0 from here on: the hash still works */
      free(keys);
      free(ids);
      return 0;
    }
    for (size_t i = 0; i < im->cap; i++) {
      if (!im->keys[i])
        continue;
      size_t j = (im->keys[i] * 0x9e3779b97f4a7c15ull >> 20) & (cap - 1);
      while (keys[j])
        j = (j + 1) & (cap - 1);
      keys[j] = im->keys[i];
      ids[j] = im->ids[i];
    }
    free(im->keys);
    free(im->ids);
    im->keys = keys;
    im->ids = ids;
    im->cap = cap;
  }
  size_t j = (k * 0x9e3779b97f4a7c15ull >> 20) & (im->cap - 1);
  while (im->keys[j] && im->keys[j] != k)
    j = (j + 1) & (im->cap - 1);
  if (!im->keys[j]) {
    im->keys[j] = k;
    im->ids[j] = (uint32_t)++im->n;
  }
  return im->ids[j];
}

static void hash_word(uint64_t *h, uint64_t w) {
  for (int i = 0; i < 8; i++) {
    *h ^= (w >> (8 * i)) & 0xff;
    *h *= 0x100000001b3ull;
  }
}

/* One line of the log, at virtual time t (from the clock's base). */
static void record(struct weft__sim *m, uint64_t t, int shard, const void *fn,
                   const void *strand) {
  uint32_t f = idmap_get(&m->fns, fn), s = idmap_get(&m->strands, strand);
  uint64_t h = weft__load(&m->hash, WA_RLX);
  hash_word(&h, t);
  hash_word(&h, (uint64_t)(shard + 1));
  hash_word(&h, f);
  hash_word(&h, s);
  weft__store(&m->hash, h, WA_RLX);
  if (m->log) {
    char name[256];
    fprintf(m->log, "%" PRIu64 " %d f%u %s s%u\n", t, shard, f,
            weft__addr_name(fn, name, sizeof(name)), s);
  }
}

void weft__sim_note(weft_rt *rt, int shard, const void *fn,
                    const void *strand) {
  struct weft__sim *m = rt->sim;
  /* Each call takes its own span of virtual time, so a strand's long
   * turn lets the clock, and a timer due meanwhile, move on. */
  uint64_t span = 1 + rnd(m) % STEP_NS_MAX;
  uint64_t t = weft__fetch_add(&weft__sim_clock, span, WA_RLX) + span;
  weft__stat_add(&m->handlers, 1);
  record(m, t - CLOCK_BASE, shard, fn, strand);
}

/* A trampoline of weft's names the user's function it calls: a line of
 * its own, in the same call's time. */
void weft__sim_calling(struct weft__thread *t, const void *fn) {
  struct weft__sim *m = t->rt->sim;
  if (m && t->shard)
    record(m, weft__now_ns() - CLOCK_BASE, (int)t->shard->idx, fn, NULL);
}

/* ---- the crash line ---------------------------------------------------- */

static void put_u64(char *buf, size_t *n, uint64_t v) {
  char tmp[24];
  int k = 0;
  do
    tmp[k++] = (char)('0' + v % 10);
  while ((v /= 10) && k < 24);
  while (k)
    buf[(*n)++] = tmp[--k];
}

static void put_str(char *buf, size_t *n, const char *s) {
  while (*s)
    buf[(*n)++] = *s++;
}

/* Names the seed, then lets the signal do what it would have done
 * (SA_RESETHAND put the default action back on entry). */
static void on_crash(int sig) {
  if (g_have_seed) {
    char buf[160];
    size_t n = 0;
    put_str(buf, &n, "weft: simulated run failed, seed ");
    put_u64(buf, &n, g_seed);
    put_str(buf, &n, "; replay it with WEFT_SIM_SEED=");
    put_u64(buf, &n, g_seed);
    put_str(buf, &n, "\n");
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
  }
  raise(sig);
}

/* Once per process, for each crash signal the application left at its
 * default: a handler that prints the seed first. */
static void crash_line_install(void) {
  static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
    struct sigaction old, sa;
    if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
      continue;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

/* ---- life ---------------------------------------------------------------- */

/* WEFT_SIM_FAULTS: names, comma-separated, into WEFT_SIM_FAULT_* bits;
 * -EINVAL for a name it does not know. */
static int faults_parse(const char *s, unsigned *out) {
  static const struct {
    const char *name;
    unsigned bit;
  } names[] = {
      {"refuse", WEFT_SIM_FAULT_REFUSE}, {"break", WEFT_SIM_FAULT_BREAK},
      {"emfile", WEFT_SIM_FAULT_EMFILE}, {"smallbuf", WEFT_SIM_FAULT_SMALLBUF},
      {"enomem", WEFT_SIM_FAULT_ENOMEM}, {"delay", WEFT_SIM_FAULT_DELAY},
      {"stall", WEFT_SIM_FAULT_STALL},   {"drop", WEFT_SIM_FAULT_DROP},
      {"all", WEFT_SIM_FAULT_ALL}};
  *out = 0;
  while (*s) {
    size_t len = strcspn(s, ",");
    unsigned i = 0, n = sizeof(names) / sizeof(names[0]);
    while (i < n && !(strlen(names[i].name) == len &&
                      strncmp(names[i].name, s, len) == 0))
      i++;
    if (i == n)
      return -EINVAL;
    *out |= names[i].bit;
    s += len + (s[len] == ',');
  }
  return 0;
}

static int env_u64(const char *name, uint64_t *out) {
  const char *env = getenv(name);
  if (!env || !*env)
    return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(env, &end, 0);
  if (errno || *end || !v)
    return -EINVAL;
  *out = v;
  return 1;
}

int weft__sim_config(weft_config *c) {
  /* The environment's seed wins over the configuration's, so that the
   * crash line's advice (on_crash) replays a run whatever seed the
   * program sets. */
  int r = env_u64("WEFT_SIM_SEED", &c->sim_seed);
  if (r < 0 || !c->sim_seed)
    return r;
  const char *env = getenv("WEFT_SIM_FAULTS");
  if (!c->sim_faults && env && faults_parse(env, &c->sim_faults))
    return -EINVAL;
  uint64_t odds = 0;
  if (!c->sim_fault_odds && env_u64("WEFT_SIM_FAULT_ODDS", &odds) < 0)
    return -EINVAL;
  if (!c->sim_fault_odds)
    c->sim_fault_odds = odds && odds <= UINT32_MAX ? (unsigned)odds : 64;
  if (c->sim_faults & ~WEFT_SIM_FAULT_ALL)
    return -EINVAL;
  /* The monitor stays as asked: the driver makes its looks (stalls). */
  c->flags |= WEFT_CONFIG_NO_TIMER_SPIN | WEFT_CONFIG_NO_TRACE;
  /* Unix stream sockets, on the kernel's own: between two sockets of one
   * process, a connect, a send and what epoll reports follow from the
   * calls alone, in the order they are made, so they are as deterministic
   * as the calls. A TCP address is a port of the simulated host, a Unix
   * socket underneath (weft__sim_tcp_name), and a UDP one a Unix
   * datagram socket (weft__sim_udp_name, udp.c). */
  c->backend = WEFT_BACKEND_EPOLL;
  if (!c->workers)
    c->workers = DEFAULT_WORKERS;
  return 0;
}

int weft__sim_attach(weft_rt *rt, const weft_config *c) {
  uint64_t seed = c->sim_seed;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  struct weft__sim *m = NULL;
  if (seed && !(m = calloc(1, sizeof(*m))))
    return -ENOMEM;
  if (m && (!(m->can = calloc(rt->nshards, sizeof(*m->can))) ||
            !(m->seen = calloc(rt->th.max, sizeof(*m->seen))))) {
    free(m->can);
    free(m);
    return -ENOMEM;
  }
  pthread_mutex_lock(&g_lock);
  bool busy = weft__load(&weft__sim_live, WA_RLX) || (seed && g_real);
  if (!busy && seed) {
    /* Release after the clock's base: a reader whose acquire load of
     * live sees 1 (clock.h) reads the base or a later tick. Only the
     * driver moves the clock afterwards, and no other runtime lives to
     * read it (g_real is 0 under g_lock), so relaxed suffices there. */
    weft__store(&weft__sim_clock, CLOCK_BASE, WA_RLX);
    weft__store(&weft__sim_live, 1, WA_REL);
    g_seed = seed;
    g_have_seed = 1;
    g_sim = rt;
    m->serial = ++g_serial;
  } else if (!busy) {
    g_real++;
  }
  pthread_mutex_unlock(&g_lock);
  if (busy) {
    if (m) {
      free(m->can);
      free(m->seen);
    }
    free(m);
    weft__log(rt, WEFT_LOG_ERROR,
              "a simulated runtime cannot live beside another runtime in one "
              "process (it sets the clock): destroy the other first");
    return -EBUSY;
  }
  rt->sim_claim = seed ? 2 : 1;
  if (!seed)
    return 0;
  pthread_once(&once, crash_line_install);
  m->seed = m->rng = seed;
  weft__store(&m->wake_at, UINT64_MAX, WA_RLX);
  m->fault_kinds = c->sim_faults;
  m->fault_odds = c->sim_fault_odds;
  m->monitor = !(c->flags & WEFT_CONFIG_NO_MONITOR);
  weft__store(&m->hash, 0xcbf29ce484222325ull, WA_RLX);
  const char *path = getenv("WEFT_SIM_LOG");
  if (path && *path && !(m->log = fopen(path, "w")))
    weft__log(rt, WEFT_LOG_WARN, "WEFT_SIM_LOG: cannot open %s: %s", path,
              strerror(errno));
  rt->sim = m;
  weft__log(rt, WEFT_LOG_DEBUG, "simulated, seed %" PRIu64, seed);
  return 0;
}

void weft__sim_detach(weft_rt *rt) {
  struct weft__sim *m = rt->sim;
  pthread_mutex_lock(&g_lock);
  if (rt->sim_claim == 2) {
    g_have_seed = 0;
    g_sim = NULL;
    weft__store(&weft__sim_live, 0, WA_REL);
  } else if (rt->sim_claim == 1) {
    g_real--;
  }
  pthread_mutex_unlock(&g_lock);
  rt->sim_claim = 0;
  rt->sim = NULL;
  if (!m)
    return;
  if (m->log)
    fclose(m->log);
  free(m->fns.keys);
  free(m->fns.ids);
  free(m->strands.keys);
  free(m->strands.ids);
  free(m->can);
  free(m->seen);
  free(m);
}

/* The simulation this thread drives, if any: a wait on the driver's own
 * thread (an on_stall's; a blocking job's gets -EDEADLK before, rt.c) is a
 * call inside a step, as a stall is, and runs the simulation on from there; it
 * must not sleep until the driver, itself, returns. Faults strike on this
 * thread only. */
static _Thread_local struct weft__sim *tl_driving;

bool weft__sim_fault(weft_rt *rt, unsigned kind) {
  struct weft__sim *m = rt->sim;
  /* No draw for a kind that is off: runs without faults stay as they
   * were. None but on the driver's thread, while it drives: not while
   * the program sets up, before its wait (a listen or a strand made by
   * main is not what a test means to fail), and not in another thread's
   * call during a wait (the PRNG is the driver's, and a draw at a moment
   * of another thread's would change the run from one time to the next). */
  if (!m || tl_driving != m || !(m->fault_kinds & kind) ||
      rnd(m) % m->fault_odds)
    return false;
  weft__stat_add(&m->faults, 1);
  return true;
}

uint32_t weft__sim_shard_seed(weft_rt *rt, unsigned i) {
  (void)i;
  return (uint32_t)rnd(rt->sim) | 1; /* xorshift's state is never 0 */
}

/* What the simulated host's names need (sim_host.c, sim.h). */
unsigned weft__sim_serial(weft_rt *rt) { return rt->sim->serial; }

uint16_t weft__sim_next_port(weft_rt *rt) {
  uint32_t n = weft__fetch_add(&rt->sim->ports_taken, 1, WA_RLX);
  return (uint16_t)(WEFT_SIM_FIRST_PORT + n % (65536 - WEFT_SIM_FIRST_PORT));
}

/* ---- the driver ---------------------------------------------------------- */

static bool rings_empty(weft_rt *rt) {
  for (unsigned i = 0; i < rt->nshards; i++)
    if (weft__runq_len(&rt->shards[i].rq) || weft__runq_len(&rt->shards[i].prq))
      return false;
  return true;
}

static uint64_t next_deadline(weft_rt *rt) {
  uint64_t next = UINT64_MAX;
  for (unsigned i = 0; i < rt->nshards; i++) {
    uint64_t d = weft__load(&rt->shards[i].tm.next, WA_ACQ);
    if (d < next)
      next = d;
  }
  return next;
}

/* What park.c's last parker checks, with every thread parked. */
static bool finished(weft_rt *rt) {
  return weft__load(&rt->life.closing, WA_SC) &&
         weft__load(&rt->life.busy, WA_SC) == 0 &&
         weft__load(&rt->inject.len, WA_SC) <= 0 && rings_empty(rt);
}

static void declare_done(weft_rt *rt) {
  pthread_mutex_lock(&rt->life.lock);
  weft__store(&rt->life.done, 1, WA_SC);
  pthread_cond_broadcast(&rt->life.cond);
  pthread_mutex_unlock(&rt->life.lock);
}

/* ---- stalls and the monitor's looks ------------------------------------ */

/* A handler that blocks (weft_sim_stall, WEFT_SIM_FAULT_STALL) is a call
 * of the driver's inside it: its thread stays in the handler, in the
 * epoch it published, while a nested run steps everything else until the
 * stall ends. Stalls nest as calls do: one that began inside another and
 * ends after it holds the other until then, as a sleep that returns late
 * would. */
struct stall {
  struct weft__thread *t;
  uint64_t until;
  uint64_t look; /* the monitor's next look at it; UINT64_MAX: none */
  struct stall *outer;
};

static bool stalled(const struct weft__sim *m, const struct weft__thread *t) {
  for (const struct stall *st = m->stalls; st; st = st->outer)
    if (st->t == t)
      return true;
  return false;
}

/* The shards whose thread is not stalled, into m->can; their count. Read
 * right before each use: a step may run a nested stall that rewrites it. */
static unsigned steppable(weft_rt *rt, struct weft__sim *m) {
  unsigned n = 0;
  for (unsigned i = 0; i < rt->nshards; i++)
    if (!m->nstalls || !stalled(m, weft__load(&rt->shards[i].owner, WA_ACQ)))
      m->can[n++] = i;
  return n;
}

/* A slot to hand a shard to: a thread that holds none and is not stalled
 * (a shard's first thread, once it lost its shard, is one), or a new
 * slot while fewer than max_threads exist; NULL at the limit, where
 * monitor.c's spawn_spare fails too. Its slot state stays FREE: no
 * thread of the kernel's is behind it to join. */
static struct weft__thread *spare(weft_rt *rt, struct weft__sim *m) {
  for (unsigned i = 0; i < rt->th.n; i++) {
    struct weft__thread *t = &rt->threads[i];
    if (!t->shard && !stalled(m, t)) {
      weft__store(&t->taken, 0, WA_RLX); /* as weft__spare_wait */
      return t;
    }
  }
  if (rt->th.n >= rt->th.max)
    return NULL;
  struct weft__thread *t = &rt->threads[rt->th.n];
  memset(t, 0, sizeof(*t));
  t->rt = rt;
  t->idx = rt->th.n;
  pthread_mutex_lock(&rt->th.spare_lock); /* weft_rt_stats reads n */
  rt->th.n++;
  pthread_mutex_unlock(&rt->th.spare_lock);
  return t;
}

/* monitor.c's handoff with nothing to race: t sits in its handler in the
 * epoch it published, so the commit holds, and t finds its shard gone
 * when the handler returns (weft__handler_leave). */
static bool handoff(weft_rt *rt, struct weft__shard *sh, struct weft__thread *t,
                    struct weft__thread *sp) {
  uint64_t hs = weft__load(&t->hstate, WA_SC);
  if ((hs & 3) != WEFT_HS_IN)
    return false;
  weft__busy_add(rt, 1); /* dropped by t's handler's count (strand.c) */
  weft__store(&t->taken, 1, WA_SC);
  if (!weft__handoff_commit(t, hs, true)) {
    weft__busy_drop(rt, 1);
    return false;
  }
  sp->shard = sh;
  sp->searching = false;
  weft__store(&sh->owner, sp, WA_REL);
  return true;
}

/* A line of the log for the monitor's side: a stall's start and end, a
 * handoff, a report; hashed as the calls are. */
static void event(struct weft__sim *m, const char *what, unsigned thread,
                  int shard, uint64_t v) {
  uint64_t t = weft__now_ns() - CLOCK_BASE, h = weft__load(&m->hash, WA_RLX);
  hash_word(&h, t);
  for (const char *c = what; *c; c++) {
    h ^= (unsigned char)*c;
    h *= 0x100000001b3ull;
  }
  hash_word(&h, thread);
  hash_word(&h, (uint64_t)(shard + 1));
  hash_word(&h, v);
  weft__store(&m->hash, h, WA_RLX);
  if (m->log)
    fprintf(m->log, "%" PRIu64 " %d %s thread %u %" PRIu64 "\n", t, shard, what,
            thread, v);
}

/* As monitor.c's report: on_stall, or a line at most once a (virtual)
 * second. A simulated stall has no backtrace to show. */
static void report(weft_rt *rt, struct weft__sim *m, const weft_stall *st,
                   uint64_t now) {
  if (rt->mon.on_stall) {
    rt->mon.on_stall(st, rt->mon.on_stall_ctx);
    return;
  }
  if (m->last_print && now - m->last_print < 1000000000u) {
    m->suppressed++;
    return;
  }
  weft__stall_log(rt, st, m->suppressed, "; simulated");
  m->last_print = now;
  m->suppressed = 0;
}

/* Whether the monitor watches t's stall: t holds its shard still, in
 * the handler se describes, not handed on yet. After a handoff t->shard
 * still names the shard until the handler returns. */
static bool watched(const struct weft__sim *m, const struct weft__thread *t,
                    const struct seen *se) {
  return m->monitor && t->shard && se->epoch == t->epoch && !se->handed &&
         weft__load(&t->shard->owner, WA_RLX) == t;
}

/* The monitor looks at a stalled handler (monitor.c, scan): the first
 * look comes between 1 and 1.5 thresholds after the handler began, as a
 * real one's does. It hands the shard to a spare and reports the handler
 * once; with no spare, it looks again every half threshold, and reports
 * it unhanded once it has run 4 thresholds. */
static void look_at(weft_rt *rt, struct weft__sim *m, struct stall *st,
                    uint64_t now) {
  struct weft__thread *t = st->t;
  struct weft__shard *sh = t->shard;
  struct seen *se = &m->seen[t->idx];
  uint64_t ns = rt->mon.stall_ns;
  st->look = UINT64_MAX;
  if (!watched(m, t, se))
    return;
  weft_stall rep = {
      .shard = sh->idx,
      .strand = weft__load(&t->cur_strand, WA_RLX),
      .handler = weft__load(&t->cur_fn, WA_RLX),
      .running_ns = now - se->since,
  };
  struct weft__thread *sp = spare(rt, m);
  se->handed = sp && handoff(rt, sh, t, sp);
  if (se->handed) {
    weft__stat_add(&sh->st.handoffs, 1);
    event(m, "handoff", t->idx, (int)sh->idx, sp->idx);
  } else {
    st->look = now + ns / 2;
    if (rep.running_ns < 4 * ns)
      return;
  }
  if (se->reported)
    return;
  se->reported = true;
  weft__stat_add(&sh->st.stalls, 1);
  event(m, "reported", t->idx, (int)sh->idx, rep.running_ns);
  rep.handed_off = se->handed;
  report(rt, m, &rep, now);
}

/* The looks due by now; returns when the next one is due. */
static uint64_t looks(weft_rt *rt, struct weft__sim *m, uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (struct stall *st = m->stalls; st; st = st->outer) {
    if (st->look <= now)
      look_at(rt, m, st, now);
    if (st->look < next)
      next = st->look;
  }
  return next;
}

/* ---- the driver ---------------------------------------------------------- */

/* One step: a shard of m->can[0..n) (its holder runs its next item), or,
 * jobs nonzero, a queued blocking job. */
static void step(weft_rt *rt, struct weft__sim *m, unsigned n, unsigned jobs) {
  uint64_t r = rnd(m);
  unsigned pick = (unsigned)(r % (n + (jobs ? 1 : 0)));
  if (pick < n) {
    struct weft__thread *t =
        weft__load(&rt->shards[m->can[pick]].owner, WA_ACQ);
    weft__set_self(t);
    weft__shard_step(t);
    weft__set_self(NULL);
  } else {
    weft__blocking_sim_step(rt, (unsigned)((r >> 32) % jobs));
  }
  weft__stat_add(&m->steps, 1);
  weft__fetch_add(&weft__sim_clock, 1 + (r >> 8) % STEP_NS_MAX, WA_RLX);
}

/* With nothing queued: the backends of the n shards of m->can, in a
 * drawn order, take in what their sockets have ready and queue their
 * handlers, as a thread out of work would before it parks. A delay
 * (WEFT_SIM_FAULT_DELAY) leaves a shard's events where they are, and the
 * clock moves on by a drawn span, never past the next timer (which then
 * fires first) or the deadline. Returns whether to look again: work was
 * queued, or the clock moved. */
static bool poll_io(weft_rt *rt, struct weft__sim *m, unsigned n, uint64_t next,
                    uint64_t deadline) {
  if (!n || !weft__load(&rt->io.all, WA_ACQ))
    return false;
  unsigned start = (unsigned)(rnd(m) % n);
  bool delayed = false;
  for (unsigned i = 0; i < n; i++) {
    struct weft__shard *sh = &rt->shards[m->can[(start + i) % n]];
    struct weft__io *io = weft__load(&sh->io, WA_ACQ);
    if (!io)
      continue;
    if (weft__sim_fault(rt, WEFT_SIM_FAULT_DELAY)) {
      delayed = true;
      continue;
    }
    weft__set_self(weft__load(&sh->owner, WA_ACQ));
    weft__io_poll(sh, io, true);
    weft__set_self(NULL);
  }
  if (weft__load(&rt->inject.len, WA_SC) > 0 || !rings_empty(rt))
    return true;
  uint64_t now = weft__now_ns();
  if (!delayed || now >= deadline)
    return false;
  uint64_t to = now + 1 + rnd(m) % DELAY_NS_MAX;
  if (next > now && next < to)
    to = next;
  weft__store(&weft__sim_clock, to < deadline ? to : deadline, WA_RLX);
  return true;
}

void weft__sim_shuffle(weft_rt *rt, uint64_t *data, uint32_t *bits,
                       unsigned n) {
  struct weft__sim *m = rt->sim;
  for (unsigned i = n; i > 1; i--) {
    unsigned j = (unsigned)(rnd(m) % i);
    uint64_t d = data[i - 1];
    uint32_t b = bits[i - 1];
    data[i - 1] = data[j];
    bits[i - 1] = bits[j];
    data[j] = d;
    bits[j] = b;
  }
}

static bool have_work(weft_rt *rt, uint64_t next, uint64_t now) {
  return next <= now || weft__load(&rt->inject.len, WA_SC) > 0 ||
         !rings_empty(rt);
}

/* The threads asleep in a wait whose timeout has passed (wake_at). */
static void wake_due(weft_rt *rt, struct weft__sim *m, uint64_t now) {
  if (now < weft__load(&m->wake_at, WA_RLX))
    return;
  pthread_mutex_lock(&rt->life.lock);
  weft__store(&m->wake_at, UINT64_MAX, WA_RLX); /* the others sleep again */
  pthread_cond_broadcast(&rt->life.cond);
  pthread_mutex_unlock(&rt->life.lock);
}

/* Whether the runtime's busy count, b when this turn of the driver began,
 * has changed or changes within 5 s of real time. Another thread may hold
 * it inside a call that ends by itself: a post from outside, or a
 * shutdown's start, which sets closing before it has queued its
 * cancellations and dropped its count. The simulation is then not stuck,
 * only waiting for that thread; a wait that took that moment for a
 * deadlock failed (test_sim_threads, a shutdown from another thread). */
static bool outside_busy_ends(weft_rt *rt, int64_t b) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 100000};
  for (int i = 0; i <= 50000; i++) {
    if (weft__load(&rt->life.busy, WA_SC) != b)
      return true;
    if (b <= 0)
      return false;
    nanosleep(&ts, NULL);
  }
  return false;
}

static int run(weft_rt *rt, uint64_t deadline) {
  struct weft__sim *m = rt->sim;
  for (;;) {
    if (weft__load(&rt->life.done, WA_ACQ))
      return 0;
    int64_t busy = weft__load(&rt->life.busy, WA_SC);
    if (finished(rt)) {
      declare_done(rt);
      return 0;
    }
    uint64_t now = weft__now_ns();
    wake_due(rt, m, now);
    unsigned n = steppable(rt, m), jobs = weft__blocking_sim_queued(rt);
    uint64_t next = next_deadline(rt);
    bool work = have_work(rt, next, now);
    if (!work && !jobs && poll_io(rt, m, n, next, deadline))
      continue;
    if (!work && !jobs) {
      if (next != UINT64_MAX && next <= deadline) {
        weft__store(&weft__sim_clock, next, WA_RLX); /* nothing till then */
        continue;
      }
      if (deadline == UINT64_MAX) {
        if (outside_busy_ends(rt, busy))
          continue;
        /* A real runtime would wait for ever: only a thread outside
         * could end it, and the one that would is the caller. */
        if (weft__load(&rt->life.closing, WA_RLX))
          weft__log(rt, WEFT_LOG_ERROR,
                    "simulation: nothing left to run and no timer armed, "
                    "but the shutdown cannot finish (%" PRId64 " busy)",
                    weft__load(&rt->life.busy, WA_RLX));
        else
          weft__log(rt, WEFT_LOG_ERROR,
                    "simulation: nothing left to run, no timer armed and no "
                    "shutdown started: this wait could only end by another "
                    "thread");
        return -EDEADLK;
      }
      weft__store(&weft__sim_clock, deadline > now ? deadline : now, WA_RLX);
      return -ETIMEDOUT;
    }
    if (now >= deadline)
      return -ETIMEDOUT;
    step(rt, m, work ? n : 0, jobs);
  }
}

/* The driver inside a stall: steps what can run around the stalled
 * threads and makes the monitor's looks, until the clock reaches until.
 * The runtime cannot finish meanwhile (a handler is running), and every
 * step, or the clock's jump to the next event, moves the clock, so it
 * ends. A timer due on a shard whose thread is stalled fires when another
 * shard takes it over (timer_serve.c) or the shard is handed on. */
static void run_stalled(weft_rt *rt, struct weft__sim *m, uint64_t until) {
  for (;;) {
    uint64_t now = weft__now_ns();
    if (now >= until)
      return;
    wake_due(rt, m, now);
    uint64_t look = looks(rt, m, now), to = look < until ? look : until;
    unsigned n = steppable(rt, m), jobs = weft__blocking_sim_queued(rt);
    uint64_t next = next_deadline(rt);
    bool work = n && have_work(rt, next, now);
    if (work || jobs) {
      step(rt, m, work ? n : 0, jobs);
      continue;
    }
    if (poll_io(rt, m, n, next, to))
      continue;
    weft__store(&weft__sim_clock, next > now && next < to ? next : to, WA_RLX);
  }
}

/* The clock never goes past this: ~292 years, "for ever" to a stall,
 * and far from a wrap of the steps' additions. */
#define STALL_END_MAX (UINT64_MAX / 2)

/* t, inside a handler, blocks for ns of virtual time. The caller's
 * identity (the thread, its strand) is put back for its handler after. */
static void stall(weft_rt *rt, struct weft__sim *m, struct weft__thread *t,
                  uint64_t ns) {
  uint64_t now = weft__now_ns(), th = rt->mon.stall_ns;
  struct seen *se = &m->seen[t->idx];
  struct stall st = {.t = t, .look = UINT64_MAX, .outer = m->stalls};
  st.until = ns < STALL_END_MAX - now ? now + ns : STALL_END_MAX;
  if (watched(m, t, se)) /* reported: no spare at the last look */
    st.look =
        se->reported ? now + th / 2 : se->since + th + rnd(m) % (th / 2 + 1);
  int shard = t->shard ? (int)t->shard->idx : -1;
  event(m, "stall", t->idx, shard, st.until - now);
  weft_strand *cur = weft__current_strand();
  m->stalls = &st;
  m->nstalls++;
  weft__set_self(NULL);
  weft__set_current_strand(NULL);
  run_stalled(rt, m, st.until);
  weft__set_self(t);
  weft__set_current_strand(cur);
  m->stalls = st.outer;
  m->nstalls--;
  event(m, "resumes", t->idx, shard, se->handed);
}

void weft__sim_handler(struct weft__thread *t, const void *fn,
                       const void *strand) {
  weft_rt *rt = t->rt;
  struct weft__sim *m = rt->sim;
  m->seen[t->idx] = (struct seen){.epoch = t->epoch, .since = weft__now_ns()};
  weft__sim_note(rt, (int)t->shard->idx, fn, strand);
  /* Up to 3 thresholds: some end before the monitor looks, some after. */
  if (m->nstalls < rt->nshards && weft__sim_fault(rt, WEFT_SIM_FAULT_STALL))
    stall(rt, m, t, 1 + rnd(m) % (3 * rt->mon.stall_ns));
}

int weft_sim_stall(uint64_t ns) {
  struct weft__thread *t = weft__self();
  if (t && t->rt->sim && t->in_handler) {
    if (ns)
      stall(t->rt, t->rt->sim, t, ns);
    return 0;
  }
  pthread_mutex_lock(&g_lock);
  weft_rt *rt = g_sim;
  if (rt)
    weft__log(rt, WEFT_LOG_DEBUG,
              "weft_sim_stall: not inside a handler on one of the "
              "simulation's shards (main, a blocking job, another thread)");
  pthread_mutex_unlock(&g_lock);
  return rt ? -EPERM : -ENOTSUP;
}

int weft__sim_run(weft_rt *rt, uint64_t deadline) {
  struct weft__sim *m = rt->sim;
  if (tl_driving == m)
    return run(rt, deadline);
  pthread_mutex_lock(&rt->life.lock);
  for (;;) {
    if (weft__load(&rt->life.done, WA_ACQ)) {
      pthread_mutex_unlock(&rt->life.lock);
      return 0;
    }
    if (!m->driving)
      break;
    if (weft__now_ns() >= deadline) {
      pthread_mutex_unlock(&rt->life.lock);
      return -ETIMEDOUT;
    }
    if (deadline < weft__load(&m->wake_at, WA_RLX))
      weft__store(&m->wake_at, deadline, WA_RLX);
    pthread_cond_wait(&rt->life.cond, &rt->life.lock);
  }
  m->driving = true;
  pthread_mutex_unlock(&rt->life.lock);
  tl_driving = m;
  int r = run(rt, deadline);
  tl_driving = NULL;
  pthread_mutex_lock(&rt->life.lock);
  m->driving = false;
  pthread_cond_broadcast(&rt->life.cond); /* a sleeper drives on */
  pthread_mutex_unlock(&rt->life.lock);
  return r;
}

int weft_rt_sim_info_sized(weft_rt *rt, weft_sim_info *out, size_t size) {
  if (!rt || !out)
    return -EINVAL;
  struct weft__sim *m = rt->sim;
  if (!m)
    return -ENOTSUP;
  weft_sim_info s = {
      .seed = m->seed,
      .now_ns = weft__now_ns(),
      .steps = weft__load(&m->steps, WA_RLX),
      .handlers = weft__load(&m->handlers, WA_RLX),
      .log_hash = weft__load(&m->hash, WA_RLX),
      .faults = weft__load(&m->faults, WA_RLX),
  };
  memcpy(out, &s, size < sizeof(s) ? size : sizeof(s));
  if (size > sizeof(s))
    memset((char *)out + sizeof(s), 0, size - sizeof(s));
  return 0;
}

#endif
