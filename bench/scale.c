/*
 * scale - what a strand and a timer cost when a server holds millions.
 *
 * Everything runs on a one-worker runtime (a fresh one for the strands and
 * for each timer count), from handlers on that worker, in chunks per turn
 * (100 strands or 1000 timer operations: a turn that ran for milliseconds
 * would be a stall, and the monitor would hand the shard off).
 *
 * Strands (--strands N, default 10 million):
 *  held: N strands created, each posted one handler (it counts itself) and
 *    kept until every handler has run; then all N released; twice.
 *    strand_cold_ns: the first round's wall time on the worker for create +
 *    post + run and for release, over N; it also pays the kernel's first
 *    touch of the pools' new pages. strand_ns: the same for the second
 *    round, which reuses them, as a server does once its pools have grown.
 *    strand_bytes: the process's RSS growth over N in the first round,
 *    once all have run (the array of N pointers is faulted in before).
 *  churn: N times create, post one handler, release at once, the handlers
 *    running as the loop goes: strand_churn_ns.
 * The strands' floor, in the same run: the same lives of N lines with no
 *  runtime (measure_strand_floor): floor_strand_ns (held) and
 *  floor_strand_churn_ns, which say what holding N costs by itself.
 * Timers (--timers N, default 1 million), for P pending = 10^3, 10^5, 10^6
 *  (those not above N): P timers (no strand) armed between 1 s and 1 h
 *  ahead (a fixed-seed xorshift), then, in windows of P/2 that walk the
 *  array and wrap, each window cancelled and then started again with new
 *  deadlines, until at least 10^6 of each: timer_cancel_ns_1eK and
 *  timer_start_ns_1eK (time summed over chunks, per operation), and
 *  timer_bytes, the RSS growth per timer at the largest P. Flat cost is the
 *  point: timer_start_flat and timer_cancel_flat are the largest P's figure
 *  over 10^3's.
 * The timers' floor, in the same run: the same protocol on a bare wheel
 *  of weft's shape (measure_floor): floor_start_ns_1eK, floor_cancel_ns_1eK
 *  and their flat ratios, which say how much of the growth any wheel of
 *  intrusive lists pays on this machine's caches. timer_rearm_flat and
 *  floor_rearm_flat: the same for a cancel and a start together, what a
 *  connection's idle timeout costs per request.
 *
 * Peers in the same run, same protocol (their top comments):
 * build/bench/peers/asio_scale (asio::strand<> and io_context::strand at
 * min(N, 1 million), steady_timer) and uv_scale (uv_timer_t). Their keys
 * are repeated with prefixes asio_ and uv_.
 *   build/bench/scale [--strands N] [--timers N] [--no-peer]
 */
#include <weft.h>

#include <malloc.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"

/* Operations per turn. A strand chunk stays below half the run queue's
 * ring (256), so the chunk's strands and then the driver, posted without a
 * strand, queue in order there: each chunk's handlers run before the next
 * chunk. */
#define STRAND_CHUNK 100
#define TIMER_CHUNK 1000
#define CYCLE_OPS 1000000

static void check(int r, const char *what) {
  if (r) {
    fprintf(stderr, "scale: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

/* Resident bytes of this process, once what earlier phases freed but
 * glibc kept resident is given back (else the next phase would reuse it
 * unseen; the peers do the same). */
static double rss_bytes(void) {
  malloc_trim(0);
  long r = bench_rss_bytes();
  if (r < 0) {
    fprintf(stderr, "scale: cannot read /proc/self/statm\n");
    exit(1);
  }
  return (double)r;
}

static uint64_t rng = BENCH_SCALE_SEED;

static weft_rt *rt;
static weft_strand **strands;
static weft_timer **timers;
static long npending; /* timers: the array's length; windows wrap at it */
static long base;     /* timers: the window's first index */

/* Handlers counted by the one worker: a load and a store, not an atomic
 * read-modify-write, as a plain counter in the peers. */
static atomic_long ran;

static void bump(void *arg) {
  (void)arg;
  atomic_store_explicit(&ran,
                        atomic_load_explicit(&ran, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

static void never(void *arg, int status, uint64_t missed) {
  (void)arg;
  (void)status;
  (void)missed;
}

static void held_create(long i) {
  check(weft_strand_create(rt, &strands[i]), "weft_strand_create");
  check(weft_post(strands[i], bump, NULL), "weft_post");
}

static void held_release(long i) { weft_strand_release(strands[i]); }

static void churn(long i) {
  (void)i;
  weft_strand *s;
  check(weft_strand_create(rt, &s), "weft_strand_create");
  check(weft_post(s, bump, NULL), "weft_post");
  weft_strand_release(s);
}

static void timer_arm(long i) {
  check(weft_timer_create(rt, NULL, &timers[i]), "weft_timer_create");
  check(weft_timer_start(timers[i], bench_scale_deadline_ns(&rng), 0, never,
                         NULL),
        "weft_timer_start");
}

static void timer_cancel(long i) {
  /* -EALREADY: a timer of the first arming that came due (1 s ahead at
   * the least) and fired; it is idle either way. */
  int r = weft_timer_cancel(timers[(base + i) % npending]);
  if (r && r != -EALREADY)
    check(r, "weft_timer_cancel");
}

static void timer_restart(long i) {
  check(weft_timer_start(timers[(base + i) % npending],
                         bench_scale_deadline_ns(&rng), 0, never, NULL),
        "weft_timer_start");
}

static void timer_destroy(long i) { weft_timer_destroy(timers[i]); }

/* One loop of n operations, chunk by chunk in a handler without strand
 * that posts itself again; done once `ran` reaches `await` too. busy: the
 * chunks' time; wall: from the first chunk's start to the turn that saw the
 * loop done. */
struct loop {
  void (*op)(long i);
  long n, next, chunk, await;
  uint64_t t0, busy, wall;
  sem_t done;
};

static void drive(void *arg) {
  struct loop *l = arg;
  uint64_t a = bench_now_ns();
  if (!l->t0)
    l->t0 = a;
  if (l->next < l->n) {
    long end = l->next + l->chunk < l->n ? l->next + l->chunk : l->n;
    for (long i = l->next; i < end; i++)
      l->op(i);
    l->next = end;
    l->busy += bench_now_ns() - a;
  } else if (atomic_load_explicit(&ran, memory_order_relaxed) >= l->await) {
    l->wall = a - l->t0;
    sem_post(&l->done);
    return;
  }
  check(weft_post_rt(rt, drive, l), "weft_post_rt");
}

/* Runs op(0..n-1) on the worker; returns its busy (chunks) or wall time. */
static uint64_t run_loop(void (*op)(long), long n, long chunk, long await,
                         bool wall) {
  struct loop l = {.op = op, .n = n, .chunk = chunk, .await = await};
  sem_init(&l.done, 0, 0);
  check(weft_post_rt(rt, drive, &l), "weft_post_rt");
  while (sem_wait(&l.done))
    ;
  sem_destroy(&l.done);
  return wall ? l.wall : l.busy;
}

/* A fresh one-worker runtime per phase, as the peers take a fresh
 * io_context or loop: memory freed into one phase's pools is not reused
 * unseen by the next. */
static void rt_begin(void) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 1;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
}

static void *alloc_faulted(size_t bytes) {
  void *p = malloc(bytes);
  if (!p) {
    fprintf(stderr, "scale: out of memory for %zu bytes\n", bytes);
    exit(1);
  }
  bench_prefault(p, bytes);
  return p;
}

struct strand_figures {
  double bytes, cold_ns, ns, churn_ns;
};

/* Create + post + run of n held strands, then their release: wall ns. */
static uint64_t held_round(long n) {
  atomic_store(&ran, 0);
  uint64_t t = run_loop(held_create, n, STRAND_CHUNK, n, true);
  return t + run_loop(held_release, n, STRAND_CHUNK, 0, true);
}

/* Two held rounds: the first (cold) also pays the kernel's first touch of
 * the pools' new pages; the second (strand_ns) reuses them, as a server
 * does once its pools have grown. bytes: from the first. */
static struct strand_figures measure_strands(long n) {
  struct strand_figures f;
  rt_begin();
  strands = alloc_faulted((size_t)n * sizeof(*strands));
  atomic_store(&ran, 0);
  double rss0 = rss_bytes();
  uint64_t t = run_loop(held_create, n, STRAND_CHUNK, n, true);
  f.bytes = (rss_bytes() - rss0) / (double)n;
  t += run_loop(held_release, n, STRAND_CHUNK, 0, true);
  f.cold_ns = (double)t / (double)n;
  f.ns = (double)held_round(n) / (double)n;
  free(strands);
  atomic_store(&ran, 0);
  f.churn_ns = (double)run_loop(churn, n, STRAND_CHUNK, n, true) / (double)n;
  weft_rt_destroy(rt);
  return f;
}

/* The pending counts measured: 10^3, 10^5, 10^6, those not above max. */
static const long sizes[] = {1000, 100000, 1000000};
static const char *const size_names[] = {"1e3", "1e5", "1e6"};
#define NSIZES 3

struct timer_figures {
  double bytes;
  double start_ns[NSIZES], cancel_ns[NSIZES];
  int nsizes;
};

static struct timer_figures measure_timers(long max) {
  struct timer_figures f = {0};
  for (int k = 0; k < NSIZES && sizes[k] <= max; k++) {
    long p = sizes[k], window = p / 2;
    rt_begin();
    timers = alloc_faulted((size_t)p * sizeof(*timers));
    npending = p;
    double rss0 = rss_bytes();
    run_loop(timer_arm, p, TIMER_CHUNK, 0, false);
    f.bytes = (rss_bytes() - rss0) / (double)p;
    uint64_t cancel = 0, start = 0;
    long ops = 0;
    for (base = 0; ops < CYCLE_OPS; ops += window) {
      cancel += run_loop(timer_cancel, window, TIMER_CHUNK, 0, false);
      start += run_loop(timer_restart, window, TIMER_CHUNK, 0, false);
      base = (base + window) % p;
    }
    f.cancel_ns[k] = (double)cancel / (double)ops;
    f.start_ns[k] = (double)start / (double)ops;
    run_loop(timer_destroy, p, TIMER_CHUNK, 0, false);
    weft_rt_destroy(rt);
    free(timers);
    f.nsizes = k + 1;
  }
  return f;
}

/* The floor of a timer's start and cancel: what any wheel of intrusive
 * lists must touch, with no runtime (no lock, no state, no clock read).
 * P nodes of a cache line each in one array, as weft's pool lays its
 * timers out; a wheel of weft's shape (6 levels of 64 slots, 1.024 us
 * ticks, the level by the highest bit in which a deadline and now differ,
 * a timer appended to its slot); the same deadlines and windows as
 * measure_timers. A cancel unlinks a node, writing its two neighbours,
 * and clears the slot's bit if that empties it; a start appends it. */
struct flink {
  struct flink *prev, *next;
};
struct fnode {
  struct flink link;
  unsigned where;
} __attribute__((aligned(64)));
struct fwheel {
  uint64_t elapsed, occupied[6];
  long count;
  struct flink slot[6][64];
};

static void fw_insert(struct fwheel *w, struct fnode *n, uint64_t deadline) {
  uint64_t when = (deadline >> 10) + 1;
  uint64_t masked = (w->elapsed ^ when) | 63;
  unsigned level = (63 - (unsigned)__builtin_clzll(masked)) / 6;
  if (level > 5)
    level = 5;
  unsigned slot = (unsigned)(when >> (level * 6)) & 63;
  struct flink *h = &w->slot[level][slot];
  n->link.prev = h->prev;
  n->link.next = h;
  h->prev->next = &n->link;
  h->prev = &n->link;
  w->occupied[level] |= (uint64_t)1 << slot;
  n->where = level * 64 + slot;
  w->count++;
}

static void fw_remove(struct fwheel *w, struct fnode *n) {
  n->link.prev->next = n->link.next;
  n->link.next->prev = n->link.prev;
  struct flink *h = &w->slot[n->where / 64][n->where % 64];
  if (h->next == h)
    w->occupied[n->where / 64] &= ~((uint64_t)1 << (n->where % 64));
  w->count--;
}

static struct timer_figures measure_floor(long max) {
  struct timer_figures f = {0};
  uint64_t frng = BENCH_SCALE_SEED;
  for (int k = 0; k < NSIZES && sizes[k] <= max; k++) {
    long p = sizes[k], window = p / 2;
    struct fwheel *w = calloc(1, sizeof(*w));
    struct fnode *nodes = aligned_alloc(64, (size_t)p * sizeof(*nodes));
    if (!w || !nodes) {
      fprintf(stderr, "scale: out of memory for the floor\n");
      exit(1);
    }
    uint64_t now = weft_now_ns();
    w->elapsed = now >> 10;
    for (int l = 0; l < 6; l++)
      for (int sl = 0; sl < 64; sl++)
        w->slot[l][sl].prev = w->slot[l][sl].next = &w->slot[l][sl];
    for (long i = 0; i < p; i++)
      fw_insert(w, &nodes[i], now + bench_scale_deadline_ns(&frng));
    uint64_t cancel = 0, start = 0;
    long ops = 0;
    for (long b = 0; ops < CYCLE_OPS; ops += window) {
      uint64_t t0 = weft_now_ns();
      for (long i = 0; i < window; i++)
        fw_remove(w, &nodes[(b + i) % p]);
      uint64_t t1 = weft_now_ns();
      for (long i = 0; i < window; i++)
        fw_insert(w, &nodes[(b + i) % p], now + bench_scale_deadline_ns(&frng));
      start += weft_now_ns() - t1;
      cancel += t1 - t0;
      b = (b + window) % p;
    }
    if (w->count != p) { /* and the work is not optimised away */
      fprintf(stderr, "scale: the floor's wheel lost timers\n");
      exit(1);
    }
    f.cancel_ns[k] = (double)cancel / (double)ops;
    f.start_ns[k] = (double)start / (double)ops;
    f.nsizes = k + 1;
    free(nodes);
    free(w);
  }
  return f;
}

/* The strands' floor: the same lives with no runtime (no queue, no
 * scheduling, no clock), to tell what holding N of them costs any design
 * that gives a strand a line of its own. A strand is one line taken from a
 * LIFO free list, as weft's pool gives them; create writes its fields, a
 * post links a node (one hot line, as weft's node is freed after its run
 * and reused), a run unlinks it, and release reads the line again and
 * frees it. held: a chunk's creates and posts, then its runs, as
 * measure_strands' chunks; then all released in the same order; twice,
 * the second round timed (floor_strand_ns). churn: one strand at a time
 * (floor_strand_churn_ns). held minus churn is what the lines cost when
 * N are held: two misses per strand (the free list's pop, the release). */
struct fstrand {
  struct fstrand *next;
  struct fstrand *tail, *head;
  void *owner;
  uint32_t home, refs, magic, released;
} __attribute__((aligned(64)));

struct ffloor {
  struct fstrand *free, node;
  long ran;
};

static __attribute__((noinline)) struct fstrand *
ff_create_post(struct ffloor *f) {
  struct fstrand *s = f->free;
  f->free = s->next;
  s->next = NULL;
  s->owner = f;
  s->home = 0;
  s->refs = 1;
  s->magic = 0x57465354;
  s->released = 0;
  f->node.next = NULL;
  s->tail = s->head = &f->node;
  return s;
}

static __attribute__((noinline)) void ff_run(struct ffloor *f,
                                             struct fstrand *s) {
  if (s->head == &f->node)
    f->ran++;
  s->head = s->tail = NULL;
}

static __attribute__((noinline)) void ff_release(struct ffloor *f,
                                                 struct fstrand *s) {
  if (s->tail || s->refs != 1) {
    fprintf(stderr, "scale: the strands' floor lost a run\n");
    exit(1);
  }
  s->magic = 0;
  s->next = f->free;
  f->free = s;
}

static uint64_t ff_held_round(struct ffloor *f, struct fstrand **held, long n) {
  uint64_t t0 = bench_now_ns();
  for (long c = 0; c < n; c += STRAND_CHUNK) {
    long end = c + STRAND_CHUNK < n ? c + STRAND_CHUNK : n;
    for (long i = c; i < end; i++)
      held[i] = ff_create_post(f);
    for (long i = c; i < end; i++)
      ff_run(f, held[i]);
  }
  for (long i = 0; i < n; i++)
    ff_release(f, held[i]);
  return bench_now_ns() - t0;
}

static void measure_strand_floor(long n, double *held_ns, double *churn_ns) {
  struct ffloor f = {0};
  struct fstrand *lines = aligned_alloc(64, (size_t)n * sizeof(*lines));
  struct fstrand **held = alloc_faulted((size_t)n * sizeof(*held));
  if (!lines) {
    fprintf(stderr, "scale: out of memory for the strands' floor\n");
    exit(1);
  }
  for (long i = n - 1; i >= 0; i--) { /* popped in address order */
    lines[i].next = f.free;
    f.free = &lines[i];
  }
  ff_held_round(&f, held, n); /* the first touch of the lines */
  *held_ns = (double)ff_held_round(&f, held, n) / (double)n;
  uint64_t t0 = bench_now_ns();
  for (long i = 0; i < n; i++) {
    struct fstrand *s = ff_create_post(&f);
    ff_run(&f, s);
    ff_release(&f, s);
  }
  *churn_ns = (double)(bench_now_ns() - t0) / (double)n;
  if (f.ran != 3 * n) {
    fprintf(stderr, "scale: the strands' floor lost a run\n");
    exit(1);
  }
  free(held);
  free(lines);
}

/* Runs a peer and returns its last line (malloc'd), or NULL. */
static char *run_peer(const char *name, long strands_n, long timers_n) {
  char path[4096], sn[32], tn[32];
  if (!bench_peer_path(name, path, sizeof(path)))
    return NULL;
  snprintf(sn, sizeof(sn), "%ld", strands_n);
  snprintf(tn, sizeof(tn), "%ld", timers_n);
  char *asio_argv[] = {path, "--strands", sn, "--timers", tn, NULL};
  char *uv_argv[] = {path, "--timers", tn, NULL};
  char *out = bench_capture(strcmp(name, "asio_scale") ? uv_argv : asio_argv);
  if (!out) {
    fprintf(stderr, "scale: peer %s failed\n", name);
    return NULL;
  }
  char *line = strdup(bench_last_line(out));
  free(out);
  return line;
}

/* Prints the numeric "key":value pairs of a peer's JSON line, prefixed. */
static void print_prefixed(const char *line, const char *prefix) {
  const char *p = strchr(line, '"');
  while (p) {
    const char *end = strchr(p + 1, '"');
    if (!end || end[1] != ':')
      break;
    char *num_end;
    double v = strtod(end + 2, &num_end);
    if (num_end != end + 2)
      printf(",\"%s%.*s\":%.10g", prefix, (int)(end - p - 1), p + 1, v);
    p = strpbrk(end + 2, ",}");
    p = p && *p == ',' ? strchr(p, '"') : NULL;
  }
}

int main(int argc, char **argv) {
  long nstrands = 10000000, ntimers = 1000000;
  bool peer = true;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--strands") && i + 1 < argc)
      nstrands = atol(argv[++i]);
    else if (!strcmp(argv[i], "--timers") && i + 1 < argc)
      ntimers = atol(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer"))
      peer = false;
    else {
      fprintf(stderr, "usage: scale [--strands N] [--timers N] [--no-peer]\n");
      return 2;
    }
  }
  if (nstrands < STRAND_CHUNK || ntimers < 1000) {
    fprintf(stderr, "scale: --strands >= %d, --timers >= 1000\n", STRAND_CHUNK);
    return 2;
  }
  struct strand_figures s = measure_strands(nstrands);
  double floor_held_ns, floor_churn_ns;
  measure_strand_floor(nstrands, &floor_held_ns, &floor_churn_ns);
  struct timer_figures t = measure_timers(ntimers);
  struct timer_figures fl = measure_floor(ntimers);

  long peer_strands = nstrands < 1000000 ? nstrands : 1000000;
  char *asio = peer ? run_peer("asio_scale", peer_strands, ntimers) : NULL;
  char *uv = peer ? run_peer("uv_scale", 0, ntimers) : NULL;

  printf("weft: %ld strands: %.1f bytes, %.1f ns held (%.1f ns cold), "
         "%.1f ns churn\n",
         nstrands, s.bytes, s.ns, s.cold_ns, s.churn_ns);
  printf("floor: %.1f ns held, %.1f ns churn\n", floor_held_ns, floor_churn_ns);
  printf("weft: timers: %.1f bytes at %ld pending\n", t.bytes,
         sizes[t.nsizes - 1]);
  for (int k = 0; k < t.nsizes; k++)
    printf("weft: %ld pending: start %.1f ns, cancel %.1f ns (floor %.1f, "
           "%.1f)\n",
           sizes[k], t.start_ns[k], t.cancel_ns[k], fl.start_ns[k],
           fl.cancel_ns[k]);
  if (asio)
    printf("asio: %s\n", asio);
  if (uv)
    printf("libuv: %s\n", uv);

  printf("{\"bench\":\"scale\",\"strands\":%ld,\"timers\":%ld,"
         "\"strand_bytes\":%.2f,\"strand_ns\":%.2f,\"strand_cold_ns\":%.2f,"
         "\"strand_churn_ns\":%.2f,\"floor_strand_ns\":%.2f,"
         "\"floor_strand_churn_ns\":%.2f,\"timer_bytes\":%.2f",
         nstrands, ntimers, s.bytes, s.ns, s.cold_ns, s.churn_ns, floor_held_ns,
         floor_churn_ns, t.bytes);
  for (int k = 0; k < t.nsizes; k++)
    printf(",\"timer_start_ns_%s\":%.2f,\"timer_cancel_ns_%s\":%.2f",
           size_names[k], t.start_ns[k], size_names[k], t.cancel_ns[k]);
  int last = t.nsizes - 1;
  printf(",\"timer_start_flat\":%.3f,\"timer_cancel_flat\":%.3f",
         t.start_ns[last] / t.start_ns[0], t.cancel_ns[last] / t.cancel_ns[0]);
  for (int k = 0; k < fl.nsizes; k++)
    printf(",\"floor_start_ns_%s\":%.2f,\"floor_cancel_ns_%s\":%.2f",
           size_names[k], fl.start_ns[k], size_names[k], fl.cancel_ns[k]);
  printf(",\"floor_start_flat\":%.3f,\"floor_cancel_flat\":%.3f",
         fl.start_ns[last] / fl.start_ns[0],
         fl.cancel_ns[last] / fl.cancel_ns[0]);
  printf(",\"timer_rearm_flat\":%.3f,\"floor_rearm_flat\":%.3f",
         (t.start_ns[last] + t.cancel_ns[last]) /
             (t.start_ns[0] + t.cancel_ns[0]),
         (fl.start_ns[last] + fl.cancel_ns[last]) /
             (fl.start_ns[0] + fl.cancel_ns[0]));
  if (asio)
    print_prefixed(asio, "asio_");
  if (uv)
    print_prefixed(uv, "uv_");
  printf("}\n");
  free(asio);
  free(uv);
  return 0;
}
