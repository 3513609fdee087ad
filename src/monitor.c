/*
 * monitor.c - the monitor thread: notices a shard whose thread has been
 * inside one handler longer than the stall threshold, reports it, and hands
 * the shard (run queue, timers, pool caches) to a spare thread, Go's
 * sysmon/handoffp idea. Owns the monitor and the spare threads.
 *
 * Handlers are never interrupted, only bypassed: the stuck thread keeps
 * running its handler; when it returns, it finds its shard gone, pushes the
 * strand it was draining to the inject queue and becomes a spare itself.
 *
 * The handoff protocol. A runtime thread T publishes hstate = (epoch << 2)
 * | state: IN inside a handler, BUSY inside a handler while it uses its
 * shard (a post: weft__local_begin), OUT otherwise. The monitor may take the
 * shard only while T is IN (never BUSY: T is using the shard then), and T
 * must never touch the shard after that.
 *   monitor:  taken = 1; membarrier(); h2 = hstate;
 *             h2 is the same IN epoch it saw stalled -> committed;
 *             else CAS(taken, 1 -> 0): success -> aborted, T never knew;
 *                                      failure (T wrote 2) -> committed.
 *   T, leaving IN (to BUSY or OUT):  hstate = X; compiler barrier;
 *             if taken == 1: CAS(taken, 1 -> 2) -> T has lost its shard.
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) runs a full barrier on every
 * thread of the process: T's hstate store is either before its barrier (the
 * monitor then reads it and does not commit on IN) or after (T's later load
 * then sees taken == 1). So if the monitor commits on "still IN", T will see
 * taken before it touches the shard again, and if T already moved on, the
 * CAS decides between them. T pays two plain stores per handler; the
 * monitor pays one membarrier per stall. The registration for it is done in
 * weft_rt_create before the runtime starts a thread: with other threads of
 * the process running, the kernel waits for an RCU grace period first,
 * tens of milliseconds (docs/cases.md, "Glommio's first sleep").
 * Without membarrier (old kernel, seccomp) stalls are reported, not handed
 * off, and handlers are never stamped (below). ThreadSanitizer builds use
 * seq_cst stores and loads instead, a correct Dekker protocol on its own that
 * TSan can check.
 *
 * The spare inherits T's place in the park protocol (T was unparked and
 * not searching), so the idle accounting does not change at a handoff; T,
 * until its handler returns, counts as busy work outside the run loop
 * (rt.c).
 *
 * When to look (scan's return). Sampled, a handler is known to run since
 * the first look that saw its epoch, so looks come every half threshold.
 * Stamped (rt->mon.stamp on: few handlers and membarrier, stamp_mode), T
 * stores each handler's start in hstart before its hstate (and reads the
 * flag again after it when it did not stamp); the monitor looks when the
 * oldest running handler is 1.4 thresholds old, and at most that far
 * apart: a handler that began during the sleep is then seen by its start
 * + 1.4 thresholds as well. Both notice a blocked handler between 1 and
 * 1.5 thresholds (weft.h; docs/design.md, "Stamps and samples").
 */
#include "monitor.h"

#include "backtrace.h"
#include "clock.h"
#include "futex.h"
#include "log.h"
#include "park.h"
#include "rt.h"
#include "shard.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPARE_IDLE_NS (10ull * 1000000000u)

struct weft__monitor {
  pthread_t tid;
  _Atomic uint32_t wake;     /* futex word: 1 = nudged or stopping */
  _Atomic uint32_t sleeping; /* 1 while waiting for any shard to run */
  _Atomic uint32_t stop;
  bool joined; /* weft__monitor_join returned (the destroying thread's) */
  bool handoff_ok;
  uint64_t tick_ns;
  uint64_t last_scan; /* when scan last ran, for the handler rate; 0: none
                         since the monitor last slept idle */
  uint64_t *last_hs, *since;
  struct weft__thread **last_t;
  bool *reported, *handed;
  bool *sampled;           /* since is a look's time, not a stamp */
  uint64_t on_at, on_next; /* the last switch on's scan; the next's earliest */
  uint64_t stamp_rate_max; /* handlers a second (stamp_mode) */
  uint64_t *cpu_mark, *cpu_at; /* the stuck thread's CPU time, and when */
  uint64_t last_print_ns, suppressed;
  uint64_t last_bt_ns; /* the last backtrace's report (take_bt); 0: none */
  uint64_t dump_at;    /* when to dump the recorder after a stall; 0: never */
};

/* Stall thresholds from a stall's report to the recorder's dump, so that
 * the dump shows the other strands moving on after the handoff. */
#define STALL_DUMP_DELAY 2

bool weft__membarrier_register(void) {
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || !(q & MEMBARRIER_CMD_PRIVATE_EXPEDITED))
    return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
                 0) == 0;
}

void weft__monitor_nudge(weft_rt *rt) {
  struct weft__monitor *m = rt->mon.m;
  if (m && weft__load(&m->sleeping, WA_SC)) {
    weft__store(&m->wake, 1, WA_REL);
    weft__futex_wake(&m->wake, 1);
  }
}

/* ---- spares ------------------------------------------------------------- */

/* Slot states are read by stats and destroy: always under spare_lock. */
static void set_slot_state(weft_rt *rt, struct weft__thread *t, int state) {
  pthread_mutex_lock(&rt->th.spare_lock);
  t->slot_state = state;
  pthread_mutex_unlock(&rt->th.spare_lock);
}

/* Starts one more thread, which waits as a spare; false at max_threads. */
static bool spawn_spare(weft_rt *rt) {
  pthread_mutex_lock(&rt->th.spare_lock);
  unsigned live = 0;
  struct weft__thread *slot = NULL;
  for (unsigned i = 0; i < rt->th.n; i++) {
    struct weft__thread *t = &rt->threads[i];
    if (t->slot_state == WEFT_TH_LIVE || t->slot_state == WEFT_TH_DORMANT)
      live++; /* a dormant slot is its shard's: never a spare's */
    else if (!slot)
      slot = t;
  }
  if (live >= rt->th.max || weft__load(&rt->life.done, WA_ACQ)) {
    pthread_mutex_unlock(&rt->th.spare_lock);
    return false;
  }
  if (!slot)
    slot = &rt->threads[rt->th.n++];
  if (slot->slot_state == WEFT_TH_EXITED)
    pthread_join(slot->tid, NULL); /* it has returned from its entry */
  unsigned idx = (unsigned)(slot - rt->threads);
  memset(slot, 0, sizeof(*slot));
  slot->rt = rt;
  slot->idx = idx;
  slot->slot_state = WEFT_TH_LIVE;
  /* Started with no shard: its loop makes it wait as a spare. Created
   * under spare_lock, so that join_all, which reads tid under it, never
   * sees a LIVE slot whose tid is not written yet (it would skip the join
   * and free the runtime under the new thread). */
  bool ok =
      weft__spawn(&slot->tid, &rt->th.attr, weft__thread_entry, slot) == 0;
  if (!ok)
    slot->slot_state = WEFT_TH_FREE;
  pthread_mutex_unlock(&rt->th.spare_lock);
  return ok;
}

int weft__spare_prestart(weft_rt *rt) {
  return rt->th.max > rt->nshards && !spawn_spare(rt) ? -EAGAIN : 0;
}

bool weft__spare_wait(struct weft__thread *t) {
  weft_rt *rt = t->rt;
  weft__store(&t->taken, 0, WA_RLX);
  uint32_t two = 2;
  weft__cas(&t->wake, &two, 0, WA_RLX, WA_RLX); /* a stale kick */
  pthread_mutex_lock(&rt->th.spare_lock);
  if (weft__load(&rt->life.done, WA_ACQ)) {
    t->slot_state = WEFT_TH_EXITED;
    pthread_mutex_unlock(&rt->th.spare_lock);
    return false;
  }
  rt->th.spares[rt->th.nspares++] = t;
  pthread_mutex_unlock(&rt->th.spare_lock);
  uint64_t deadline = weft__now_ns() + SPARE_IDLE_NS;
  for (;;) {
    uint32_t w = weft__load(&t->wake, WA_ACQ);
    if (w == 1)
      break;
    if (weft__now_ns() >= deadline) {
      pthread_mutex_lock(&rt->th.spare_lock);
      for (unsigned i = 0; i < rt->th.nspares && rt->th.nspares > 1; i++) {
        if (rt->th.spares[i] == t) {
          rt->th.spares[i] = rt->th.spares[--rt->th.nspares];
          t->slot_state = WEFT_TH_EXITED;
          pthread_mutex_unlock(&rt->th.spare_lock);
          return false; /* idle for long, and not the last spare: exit */
        }
      }
      pthread_mutex_unlock(&rt->th.spare_lock);
      /* The last spare stays; so does one popped by a handoff, which
       * waits for its waker's 1, but on a deadline still: a handoff that
       * gives up puts it back, and it must idle out from there. */
      deadline = weft__now_ns() + SPARE_IDLE_NS;
      continue;
    }
    weft__futex_wait_until(&t->wake, w, deadline);
  }
  weft__store(&t->wake, 0, WA_RLX);
  if (weft__load(&rt->life.done, WA_ACQ) || !t->shard) {
    set_slot_state(rt, t, WEFT_TH_EXITED);
    return false;
  }
  return true;
}

void weft__spares_wake_all(weft_rt *rt) {
  pthread_mutex_lock(&rt->th.spare_lock);
  while (rt->th.nspares) {
    struct weft__thread *t = rt->th.spares[--rt->th.nspares];
    weft__store(&t->wake, 1, WA_REL);
    weft__futex_wake(&t->wake, 1);
  }
  pthread_mutex_unlock(&rt->th.spare_lock);
}

/* ---- handoff and reports ------------------------------------------------ */

/* Puts back a spare that a handoff took and did not use. If the runtime is
 * done, weft__spares_wake_all ran while sp was out of the list and will
 * not run again, so sp is woken to exit instead (it has no shard). done is
 * read under spare_lock, which spares_wake_all holds. */
static void spare_put_back(weft_rt *rt, struct weft__thread *sp) {
  pthread_mutex_lock(&rt->th.spare_lock);
  bool done = weft__load(&rt->life.done, WA_ACQ);
  if (!done)
    rt->th.spares[rt->th.nspares++] = sp;
  pthread_mutex_unlock(&rt->th.spare_lock);
  if (done) {
    weft__store(&sp->wake, 1, WA_REL);
    weft__futex_wake(&sp->wake, 1);
  }
}

/* 1: handed off; 0: T moved on meanwhile (nothing to do); -1: not handed
 * off, for want of a spare or (rarely, ENOMEM) of the barrier: scan tries
 * again each tick and reports it as "no thread to move its shard to". */
static int handoff(weft_rt *rt, struct weft__shard *sh, struct weft__thread *t,
                   uint64_t hs) {
  pthread_mutex_lock(&rt->th.spare_lock);
  struct weft__thread *sp =
      rt->th.nspares ? rt->th.spares[--rt->th.nspares] : NULL;
  pthread_mutex_unlock(&rt->th.spare_lock);
  if (!sp) {
    spawn_spare(rt); /* for the next tick, or the next stall */
    return -1;
  }
  /* T stops counting as busy when its handler returns (strand.c, count),
   * which it may do as soon as it sees taken: counted before, so the
   * count never drops below what is outstanding (rt.c). */
  weft__busy_add(rt, 1);
  weft__store(&t->taken, 1, WA_SC);
  bool fenced = true;
#ifndef WEFT_TSAN
  /* It can fail after registration (ENOMEM for its CPU mask): without the
   * barrier, "still IN" proves nothing, so give up unless T has already
   * taken the loss itself (the CAS below then fails on its 2). */
  fenced = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
  if (!weft__handoff_commit(t, hs, fenced)) {
    /* T never knew. It may have moved on and parked since, and the
     * runtime may have been done before this handoff began:
     * spare_put_back. */
    spare_put_back(rt, sp);
    weft__busy_drop(rt, 1);
    return fenced ? 0 : -1;
  }
  /* Committed: T will not touch sh again. */
  weft__trace(WEFT_EV_HANDOFF, sh->idx, t->idx, sp->idx);
  sp->shard = sh;
  sp->searching = false;
  weft__store(&sh->owner, sp, WA_REL);
  weft__store(&sp->wake, 1, WA_REL);
  weft__futex_wake(&sp->wake, 1);
  pthread_mutex_lock(&rt->th.spare_lock);
  bool none_left = rt->th.nspares == 0;
  pthread_mutex_unlock(&rt->th.spare_lock);
  if (none_left)
    spawn_spare(rt); /* T becomes one when it returns; do not wait for it */
  return 1;
}

/* What the thread is stuck in. cur_fn and cur_strand are stored before
 * the epoch's hstate (release, read with acquire): read while that epoch
 * is still current, they name its handler. False if it moved on. */
static bool stuck_in(struct weft__thread *t, uint64_t hs, weft_stall *st) {
  st->strand = weft__load(&t->cur_strand, WA_RLX);
  st->handler = weft__load(&t->cur_fn, WA_RLX);
  return (weft__load(&t->hstate, WA_ACQ) >> 2) == (hs >> 2);
}

static char thread_state(int tid);

/* What the stuck thread t is doing (backtrace.c): its backtrace if it
 * computes, its system call if it is blocked; at most once a second, as
 * each costs the thread a signal and the monitor up to 20 ms of waiting.
 * It runs in the epoch of hs still: stuck_in saw it, and the handler of
 * the signal checks again. */
static void take_bt(weft_rt *rt, struct weft__monitor *m,
                    struct weft__thread *t, uint64_t hs, uint64_t now,
                    struct weft__bt *bt) {
  int tid = weft__load(&t->kernel_tid, WA_ACQ);
  if (!tid || (m->last_bt_ns && now - m->last_bt_ns < 1000000000u))
    return;
  m->last_bt_ns = now;
  weft__backtrace_take(rt, t, hs, thread_state(tid), bt);
}

void weft__stall_log(weft_rt *rt, const weft_stall *st, uint64_t suppressed,
                     const char *why) {
  char name[256], more[64] = "";
  if (suppressed)
    snprintf(more, sizeof(more), " (%llu more stalls not shown)",
             (unsigned long long)suppressed);
  weft__log(rt, WEFT_LOG_WARN,
            "stall: %s on strand %p has run %.1f ms on shard %u; %s%s%s",
            weft__addr_name(st->handler, name, sizeof(name)),
            (void *)st->strand, st->running_ns / 1e6, st->shard,
            st->handed_off ? "its shard moved to another thread"
                           : "no thread to move its shard to",
            more, why);
}

/* The stall line, then the frames (one line each, as weft_log_fn takes
 * one line a call): at most one report a second is printed, and frames
 * only with a printed line. on_stall gets every stall, with frames when
 * take_bt took them. */
static void report(weft_rt *rt, struct weft__monitor *m, weft_stall st,
                   struct weft__thread *t, uint64_t hs, uint64_t now) {
  struct weft__bt bt = {.frames = NULL, .why = ""};
  if (rt->mon.on_stall) {
    take_bt(rt, m, t, hs, now, &bt);
    st.frames = bt.frames;
    st.nframes = bt.nframes;
    rt->mon.on_stall(&st, rt->mon.on_stall_ctx);
    return;
  }
  if (m->last_print_ns && now - m->last_print_ns < 1000000000u) {
    m->suppressed++;
    return;
  }
  take_bt(rt, m, t, hs, now, &bt);
  weft__stall_log(rt, &st, m->suppressed, bt.why);
  weft__backtrace_log(rt, &bt);
  m->last_print_ns = now;
  m->suppressed = 0;
}

/* The kernel's view of a thread: 'R' running or waiting for a CPU, 'S'
 * or 'D' blocked, '?' unknown. Read only for a thread past the threshold. */
static char thread_state(int tid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return '?';
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return '?';
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  return p && p[1] == ' ' ? p[2] : '?';
}

/* Whether the thread past the threshold is only waiting for a CPU (an
 * oversubscribed machine preempted it): runnable, and it got less than a
 * quarter of the time since the last look. Handing its shard to a spare
 * would add a runnable thread where CPU, not threads, is short; it is
 * looked at again next tick. A blocked thread, or one computing, is not. */
static bool preempted(struct weft__monitor *m, unsigned i,
                      struct weft__thread *t, uint64_t now) {
  int tid = weft__load(&t->kernel_tid, WA_ACQ);
  struct timespec ts;
  if (!tid || !t->cpu_clock_ok || thread_state(tid) != 'R' ||
      clock_gettime(t->cpu_clock, &ts) != 0)
    return false;
  uint64_t cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  bool first = m->cpu_at[i] < m->since[i];
  uint64_t used = cpu - m->cpu_mark[i], wall = now - m->cpu_at[i];
  /* A window shorter than a tick (a look that another shard's deadline
   * brought early) is not judged: a short handler's few tens of
   * microseconds of CPU would be a quarter of it. The marks stay, so the
   * window grows to the next look. */
  if (!first && wall < m->tick_ns)
    return true;
  m->cpu_mark[i] = cpu;
  m->cpu_at[i] = now;
  return first || used * 4 < wall; /* first look: decide next tick */
}

/* When the handler of epoch hs>>2 began, if its thread stamped it; 0 if
 * not, or if the thread moved on meanwhile; WEFT_HSTART_LATE if stamping
 * turned on while it began (stamp_mode). The thread stores hstart
 * (release), 0 when it does not stamp, before that epoch's hstate
 * (release), maybe WEFT_HSTART_LATE just after it, and the next epoch's
 * hstart only after storing OUT for this one. hs was loaded with acquire,
 * so this load sees the epoch's own first store (0 while a late one is
 * not stored or not visible yet: then sampled), its late one, or a later
 * epoch's; a later epoch's was stored after OUT, so the second, acquire,
 * load of hstate would then see OUT or a later epoch. Still IN or BUSY in
 * the same epoch: s is its own.
 * The clock is read just before the epoch begins: a thread descheduled in
 * between counts that time as its handler's, as the shard waited all the
 * same; preempted() then keeps it from being handed on at the first look. */
static uint64_t known_start(struct weft__thread *t, uint64_t hs) {
  uint64_t s = weft__load(&t->hstart, WA_ACQ);
  uint64_t h2 = weft__load(&t->hstate, WA_ACQ);
  return (h2 >> 2) == (hs >> 2) && (h2 & 3) != WEFT_HS_OUT ? s : 0;
}

/* When to stamp. Stamps cost a clock read per handler on every thread;
 * samples cost looks, every half threshold instead of every 1.4, that is
 * 9 / (7 thresholds) more a second, and under load each look preempts a
 * running worker. So threads stamp while the busiest shard runs fewer
 * handlers a second than
 *     rate_max = 9 / (7 * threshold) * LOOK_COST_NS / clock read cost
 * and stop above twice that. LOOK_COST_NS is what a look costs the
 * machine when every CPU is busy: the monitor's own run (perf sched
 * shows tens of microseconds on a small VM) and about as much again for
 * the worker it preempts (bench/net's proxy under both). The clock
 * read is timed at monitor start (clock_cost): tens of nanoseconds
 * through the vDSO, a microsecond or more where the clock source makes it
 * a system call. At the default threshold that is about a million
 * handlers a second at 25 ns a read, and tens of thousands at 1 us; a
 * shard running tens of millions (bench/post) is sampled. */
#define LOOK_COST_NS 20000u

/* A full barrier on every thread of the runtime, after the flag's store
 * (false: none). TSan builds need none: the flag's store, the scan's
 * loads of hstate and the thread's side are all seq_cst there. */
static bool stamp_fence(void) {
#ifdef WEFT_TSAN
  return true;
#else
  return syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

/* Ticks after a switch on before the next may happen: each costs every
 * CPU running a thread of the process an interrupt (membarrier), and a
 * bursty rate could otherwise switch every other tick. */
#define STAMP_ON_GAP_TICKS 64

/* Turns stamping on or off from the busiest shard's handler rate since
 * the last scan (busiest: the epochs its thread went through).
 *
 * Switching on: a thread that read the flag as off just before, and lost
 * its CPU before publishing its epoch, would show an unstamped handler to
 * a monitor that sleeps 1.4 thresholds from now on, and a stall there
 * would be noticed by 2.4 thresholds. So the store is followed by a
 * barrier on every thread (membarrier, as in handoff), and each thread
 * reads the flag a second time after publishing its epoch, with a
 * compiler barrier between (weft__handler_enter). The epoch's store is
 * either before that thread's barrier, and then the look a tick from now
 * (scan) sees the epoch, or after it, and then so is the second read,
 * which sees the flag on: the thread stores WEFT_HSTART_LATE, which
 * counts the handler from this scan's clock (m->on_at, read before this
 * scan read any hstate). That is no later than the epoch's publication
 * (after this scan read its shard, or this scan or an earlier look saw
 * the epoch first and timed it), and no earlier than the thread's first
 * read, less this scan's own microseconds: like a stamp, it counts the
 * time the thread lost before publishing, as the shard waited all the
 * same. A later switch on cannot move it: m->on_at changes only after the
 * scan that switched has looked at every shard. A look between the
 * publication and the late store sees hstart 0 and samples the handler
 * from then, as any first look does. Without the barrier (no membarrier:
 * an old kernel, seccomp) the monitor never stamps.
 * Switching off needs nothing: sampling is always safe. */
static void stamp_mode(weft_rt *rt, struct weft__monitor *m, uint64_t busiest,
                       uint64_t now) {
  uint64_t span = m->last_scan ? now - m->last_scan : 0;
  m->last_scan = now;
  if (!span)
    return; /* the first scan, or the first after an idle sleep: no rate */
  uint64_t lim = m->stamp_rate_max * span / 1000000000u;
  uint32_t on = weft__load(&rt->mon.stamp, WA_RLX);
  if (!on && busiest < lim && m->handoff_ok && now >= m->on_next) {
    m->on_at = now;
    m->on_next = now + STAMP_ON_GAP_TICKS * m->tick_ns;
    weft__store(&rt->mon.stamp, 1, WA_SC);
    if (!stamp_fence())
      weft__store(&rt->mon.stamp, 0, WA_REL); /* ENOMEM: sample instead */
  } else if (on && busiest > 2 * lim) {
    weft__store(&rt->mon.stamp, 0, WA_REL);
  }
}

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Per shard the monitor remembers what it last saw (owner thread and its
 * hstate), since when (the handler's stamped start, or the first look that
 * saw it), and whether that handler was reported and handed off: a handler
 * that runs for seconds is reported once. Returns when to look next. */
static uint64_t scan(weft_rt *rt, struct weft__monitor *m, uint64_t now) {
  bool stamping = weft__load(&rt->mon.stamp, WA_RLX);
  /* A stamped handler is noticed at its start + wait: within the promise
   * of weft.h (between 1 and 1.5 thresholds, the timer slack of a tenth
   * of a tick included); so is one that begins while the monitor sleeps,
   * as no sleep is longer than wait. A sampled one (its since is the
   * first look that saw it) needs a look every tick, stamping or not. */
  uint64_t wait = rt->mon.stall_ns + 4 * rt->mon.stall_ns / 10;
  uint64_t next = now + (stamping ? wait : m->tick_ns), busiest = 0;
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    struct weft__thread *t = weft__load(&sh->owner, WA_ACQ);
    uint64_t hs = weft__load(&t->hstate, WEFT_SCAN_HS_MO);
    bool in = (hs & 3) != WEFT_HS_OUT;
    if (t == m->last_t[i] && (hs >> 2) - (m->last_hs[i] >> 2) > busiest)
      busiest = (hs >> 2) - (m->last_hs[i] >> 2);
    /* One handler is one epoch; IN and BUSY alternate within it. */
    bool same = in && t == m->last_t[i] && (hs >> 2) == (m->last_hs[i] >> 2);
    m->last_hs[i] = hs;
    if (!same) {
      uint64_t start = in ? known_start(t, hs) : 0;
      if (start == WEFT_HSTART_LATE)
        start = m->on_at; /* stamp_mode */
      m->last_t[i] = t;
      m->since[i] = start ? start : now;
      m->sampled[i] = in && !start;
      m->reported[i] = m->handed[i] = false;
      if (!in)
        continue;
    }
    if (m->sampled[i])
      next = min_u64(next, now + m->tick_ns);
    /* A stamp can be later than now: taken after this scan read the
     * clock. That handler has run for no time yet. */
    uint64_t ran = now > m->since[i] ? now - m->since[i] : 0;
    if (ran < rt->mon.stall_ns) {
      next = min_u64(next, m->since[i] + wait);
      continue;
    }
    if (m->handed[i])
      continue;
    next = min_u64(next, now + m->tick_ns); /* decided within a tick */
    if ((hs & 3) != WEFT_HS_IN)
      continue; /* BUSY: it is using its shard right now; next tick */
    weft_stall st = {.shard = i, .running_ns = ran};
    if (preempted(m, i, t, now) || !stuck_in(t, hs, &st))
      continue;
    int r = m->handoff_ok ? handoff(rt, sh, t, hs) : -1;
    if (r == 0)
      continue; /* it returned meanwhile: not a stall after all */
    if (r > 0) {
      m->handed[i] = true;
      weft__stat_add(&sh->st.handoffs, 1);
    } else if (m->handoff_ok && ran < 4 * rt->mon.stall_ns) {
      continue; /* a spare is starting: report if still none in a while */
    }
    const char *w = r > 0 ? weft__load(&t->waits_in, WA_RLX) : NULL;
    if (w && !m->reported[i]) {
      m->reported[i] = true; /* a wait its caller was told of */
      weft__log(rt, WEFT_LOG_DEBUG,
                "shard %u moved to another thread while a handler waits in "
                "%s",
                i, w);
    } else if (!m->reported[i]) {
      m->reported[i] = true;
      weft__stat_add(&sh->st.stalls, 1);
      weft__trace(WEFT_EV_STALL, i, (uintptr_t)st.handler,
                  (uintptr_t)st.strand);
      if (weft__trace_stall_dumps(rt) && !m->dump_at)
        m->dump_at = now + STALL_DUMP_DELAY * rt->mon.stall_ns;
      st.handed_off = r > 0;
      report(rt, m, st, t, hs, now);
    }
  }
  stamp_mode(rt, m, busiest, now);
  /* Switched: a look within a tick, so that a handler published unstamped
   * before the switch's barrier is seen and sampled (stamp_mode). */
  if (stamping != weft__load(&rt->mon.stamp, WA_RLX))
    next = min_u64(next, now + m->tick_ns);
  return next;
}

static bool runtime_idle(weft_rt *rt) {
  return (weft__load(&rt->idle.state, WA_SC) >> 32) == 0;
}

/* Continuous idleness (in ticks) before the monitor sleeps until nudged.
 * A server under load parks and unparks all its threads thousands of times
 * a second; a monitor that slept at each idle moment cost each of those
 * unparks a futex wake and itself a context switch. 64 ticks: 32 ms. */
#define IDLE_TICKS_BEFORE_SLEEP 64

static void *monitor_main(void *arg) {
  weft_rt *rt = arg;
  struct weft__monitor *m = rt->mon.m;
  uint64_t idle_since = 0; /* 0: not idle at the last look */
  uint64_t next = weft__now_ns() + m->tick_ns;
  /* Its own timer slack, not the creating thread's: an application thread
   * with a slack of milliseconds (PR_SET_TIMERSLACK, systemd's
   * TimerSlackNSec=) would otherwise stretch every tick by that much, and
   * every stall would be noticed that much later. A tenth of a tick (50 us
   * at the default threshold, Linux's default slack) lets the kernel batch
   * the wakeup with others and delays a tick by at most that. */
  prctl(PR_SET_TIMERSLACK,
        (unsigned long)(m->tick_ns / 10 ? m->tick_ns / 10 : 1), 0, 0, 0);
  weft__trace_attach(rt, WEFT_RING_MONITOR, 0);
  while (!weft__load(&m->stop, WA_ACQ)) {
    uint64_t now = weft__now_ns();
    if (m->dump_at && now >= m->dump_at) {
      m->dump_at = 0;
      weft__trace_stall_dump(rt);
      continue;
    }
    bool idle = runtime_idle(rt);
    if (!idle || !idle_since)
      idle_since = idle ? now : 0;
    if (idle && now - idle_since > IDLE_TICKS_BEFORE_SLEEP * m->tick_ns) {
      /* Nothing runs: sleep until a thread unparks (weft__monitor_nudge).
       * sleeping and idle.state are both seq_cst: either we see the
       * unpark, or the unparker sees sleeping and wakes us. */
      weft__store(&m->sleeping, 1, WA_SC);
      m->last_scan = 0; /* the time asleep says nothing of the rate */
      if (runtime_idle(rt) && !weft__load(&m->stop, WA_SC))
        weft__futex_wait(&m->wake, 0);
      weft__store(&m->sleeping, 0, WA_SC);
      weft__store(&m->wake, 0, WA_RLX);
      idle_since = 0;
      next = weft__now_ns(); /* look at once */
      continue;
    }
    weft__futex_wait_until(&m->wake, 0,
                           m->dump_at ? min_u64(next, m->dump_at) : next);
    weft__store(&m->wake, 0, WA_RLX);
    next = scan(rt, m, weft__now_ns());
  }
  weft__trace_detach();
  return NULL;
}

/* What weft__now_ns costs, in ns (at least 1): the least of 4 rounds of
 * 16 reads, so that a preemption during one does not count. */
static uint64_t clock_cost(void) {
  uint64_t best = UINT64_MAX;
  for (int r = 0; r < 4; r++) {
    uint64_t t0 = weft__now_ns(), t1 = t0;
    for (int i = 0; i < 16; i++)
      t1 = weft__now_ns();
    if ((t1 - t0) / 16 < best)
      best = (t1 - t0) / 16;
  }
  return best ? best : 1;
}

static void monitor_free(struct weft__monitor *m) {
  free(m->last_hs);
  free(m->since);
  free(m->last_t);
  free(m->reported);
  free(m->handed);
  free(m->sampled);
  free(m->cpu_mark);
  free(m->cpu_at);
  free(m);
}

int weft__monitor_start(weft_rt *rt) {
  struct weft__monitor *m = calloc(1, sizeof(*m));
  if (!m)
    return -ENOMEM;
  m->last_hs = calloc(rt->nshards, sizeof(uint64_t));
  m->since = calloc(rt->nshards, sizeof(uint64_t));
  m->last_t = calloc(rt->nshards, sizeof(*m->last_t));
  m->reported = calloc(rt->nshards, sizeof(bool));
  m->handed = calloc(rt->nshards, sizeof(bool));
  m->sampled = calloc(rt->nshards, sizeof(bool));
  m->cpu_mark = calloc(rt->nshards, sizeof(uint64_t));
  m->cpu_at = calloc(rt->nshards, sizeof(uint64_t));
  if (!m->last_hs || !m->since || !m->last_t || !m->reported || !m->handed ||
      !m->sampled || !m->cpu_mark || !m->cpu_at) {
    monitor_free(m);
    return -ENOMEM;
  }
  bool mb = rt->mon.membarrier_ok;
#ifdef WEFT_TSAN
  mb = true; /* seq_cst protocol, no membarrier needed */
#endif
  m->handoff_ok = mb;
  m->tick_ns = rt->mon.stall_ns / 2;
  m->stamp_rate_max =
      9000000000u / 7 * LOOK_COST_NS / rt->mon.stall_ns / clock_cost();
  rt->mon.m = m;
  int err = weft__spawn(&m->tid, &rt->th.attr, monitor_main, rt);
  if (err) {
    rt->mon.m = NULL;
    monitor_free(m);
    return -err;
  }
  return 0;
}

static void stop_soon(weft_rt *rt) {
  struct weft__monitor *m = rt->mon.m;
  if (!m)
    return;
  weft__store(&m->stop, 1, WA_SC);
  weft__store(&m->wake, 1, WA_REL);
  weft__futex_wake(&m->wake, 1);
}

void weft__monitor_join(weft_rt *rt) {
  struct weft__monitor *m = rt->mon.m;
  if (!m || m->joined)
    return;
  stop_soon(rt);
  pthread_join(m->tid, NULL);
  m->joined = true;
}

void weft__monitor_stop(weft_rt *rt) {
  struct weft__monitor *m = rt->mon.m;
  if (!m)
    return;
  weft__monitor_join(rt);
  monitor_free(m);
  rt->mon.m = NULL;
}
