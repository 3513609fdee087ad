/*
 * internal.h - the runtime's internal types and the functions the parts of
 * src/ call in each other. Nothing here is visible outside the library.
 *
 * Ownership in one paragraph: a runtime owns its shards, its threads and
 * every pooled object (strands, handler nodes). A shard is owned by at most
 * one thread at a time (shard->owner); only that thread pushes to or pops
 * from the shard's run queue by the owner's path and only it touches the
 * shard's pool caches. Other threads only steal from the run queue (CAS on
 * its head) and read its counters.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

#include "atomics.h"
#include "lock.h"
#include "weft.h"

#include <pthread.h>
#include <time.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WEFT_CACHELINE 64
#define WEFT_ALIGNED __attribute__((aligned(WEFT_CACHELINE)))

/* ---- run-queue items ----------------------------------------------------
 * An item is a tagged pointer: a strand (tag 0) or a handler node posted with
 * weft_post_rt (tag 1). Both start with a link word, so the inject queue can
 * chain either. A link word holds the next item, tagged. */
typedef uintptr_t weft__item;
#define WEFT_ITEM_NODE ((uintptr_t)1)

struct weft__link {
  _Atomic uintptr_t next;
};

/* A handler node: 40 bytes. In a strand's queue `link.next` holds the next
 * node (untagged); in the inject queue it holds the next item (tagged).
 * An embedded node lives inside another object (a socket, tcp.c) and is
 * not returned to the pool after it ran. */
struct weft__node {
  struct weft__link link;
  weft_fn fn;
  weft_fn cancel;
  void *arg;
  uint32_t embedded;
};

#define WEFT_STRAND_MAGIC 0x57465354u /* "WFST" */
#define WEFT_STRAND_DEAD 0x44454144u  /* "DEAD" */

/* A strand. Its queue is an intrusive MPSC list whose tail word is also its
 * state (strand.c has the argument):
 *   tail == 0          idle: no pending handler, not scheduled
 *   tail == node       busy: scheduled or running; node is the newest
 *   tail == node | 1   busy and released: reclaim when drained */
struct weft_strand {
  struct weft__link qlink; /* inject-queue link; must stay first */
  _Atomic uintptr_t tail;  /* see above; pushers exchange it */
  struct weft__node *head; /* drainer only: next node to run */
  struct weft__node *ran;  /* drainer only: ran, successor unlinked */
  weft_rt *rt;
  _Atomic uint32_t released; /* set by weft_strand_release */
  uint32_t magic;
  /* its home shard, for good: the wheel its timers are on, and the pool
   * its memory and its timers' comes from (weft__home_pick) */
  uint32_t home;
  bool self_released; /* drainer only: released from its own handler */
};

/* ---- object pools (pool.c) ----------------------------------------------
 * Fixed-size objects carved from slabs that live as long as the runtime.
 * A shard keeps a private cache (owner only, no atomics); caches trade
 * batches with the runtime-wide depot under a mutex, so steady-state
 * alloc/free touches nothing shared. Threads outside the runtime use the
 * depot directly. */
struct weft__freeobj {
  struct weft__freeobj *next;
  struct weft__freeobj *batch_next; /* depot: next batch (first obj only) */
};

struct weft__pool_cache {
  struct weft__freeobj *head;
  uint32_t count;
};

struct weft__pool {
  pthread_mutex_t lock;
  size_t objsize;
  struct weft__freeobj *batches; /* full batches of WEFT_POOL_BATCH */
  struct weft__pool_cache loose; /* for threads outside the runtime */
  struct weft__slab *slabs;
  char *bump, *bump_end; /* uncarved rest of the newest slab */
};

#define WEFT_POOL_BATCH 64

int weft__pool_init(struct weft__pool *p, size_t objsize);
void weft__pool_destroy(struct weft__pool *p);
/* Gives p bytes at mem (cacheline aligned) to carve before any slab of its
 * own; the caller keeps mem mapped until weft__pool_destroy. */
void weft__pool_reserve(struct weft__pool *p, void *mem, size_t bytes);
/* cache may be NULL (caller outside the runtime). NULL on ENOMEM. */
void *weft__pool_alloc(struct weft__pool *p, struct weft__pool_cache *cache);
void weft__pool_free(struct weft__pool *p, struct weft__pool_cache *cache,
                     void *obj);

/* ---- run queues (runq.c) ------------------------------------------------- */
#define WEFT_RUNQ_CAP 256 /* power of two */

/* A bounded ring: the owner pushes at the tail and pops at the head,
 * thieves take half from the head; head moves only by CAS. */
struct weft__runq {
  _Atomic uint64_t head WEFT_ALIGNED;
  _Atomic uint64_t tail WEFT_ALIGNED;
  _Atomic uintptr_t slot[WEFT_RUNQ_CAP] WEFT_ALIGNED;
};

/* The runtime-wide queue for items posted from outside and for overflow:
 * producers never wait (one exchange), one consumer at a time by trylock,
 * and others skip it rather than wait. len counts pushed items, maybe late:
 * it is only a hint, see the park protocol in park.c. */
struct weft__inject {
  _Atomic uintptr_t tail WEFT_ALIGNED;
  _Atomic int64_t len;
  uintptr_t head WEFT_ALIGNED; /* consumer only */
  struct weft__link stub;
  pthread_mutex_t lock;
};

void weft__runq_init(struct weft__runq *q);
uint32_t weft__runq_len(struct weft__runq *q);
/* Owner: push; false when full. */
bool weft__runq_push(struct weft__runq *q, weft__item it);
/* Owner: pop; 0 when empty. */
weft__item weft__runq_pop(struct weft__runq *q);
/* Owner: claim up to n items from the head into out[]; returns how many. */
uint32_t weft__runq_grab(struct weft__runq *q, weft__item *out, uint32_t n);
/* Thief: move half of victim's items into dst (which the thief owns and
 * which must be empty); returns one of them to run, or 0. */
weft__item weft__runq_steal(struct weft__runq *victim, struct weft__runq *dst,
                            uint32_t *stolen);

void weft__inject_init(struct weft__inject *q);
void weft__inject_destroy(struct weft__inject *q);
/* Push items[0..n) as one chain. Any thread. */
void weft__inject_push(struct weft__inject *q, const weft__item *items,
                       uint32_t n);
/* Take up to max items; 0 taken if empty or another consumer is busy. */
uint32_t weft__inject_take(struct weft__inject *q, weft__item *out,
                           uint32_t max);

struct weft__shard;

/* ---- timers (timer.c) ----------------------------------------------------
 * A hierarchical timing wheel per shard: 6 levels of 64 slots; a level-0
 * slot is one tick of 2^10 ns, each level 64 times the one below, about 19.5
 * hours in all (further deadlines are parked in the last level and cascade
 * again). Slots are circular doubly-linked lists through the timers. All of
 * a shard's wheel and the state of the timers homed there (but the destroyed
 * bit in weft_timer.owner) are guarded by the shard's tlock, held only for a
 * few pointer operations, never across a handler; any thread may take it, so a
 * thread other than the shard's may serve its expired timers. */
#define WEFT_WHEEL_LEVELS 6
#define WEFT_WHEEL_SLOTS 64
#define WEFT_TICK_SHIFT 10

struct weft__tlist {
  struct weft__tlist *next, *prev;
};

struct weft__wheel {
  uint64_t elapsed; /* ticks: every deadline before it has been handled */
  uint64_t occupied[WEFT_WHEEL_LEVELS];
  struct weft__tlist slot[WEFT_WHEEL_LEVELS][WEFT_WHEEL_SLOTS];
  uint64_t count;
};

enum { WEFT_T_IDLE = 0, WEFT_T_ARMED = 1, WEFT_T_FIRED = 2 };

/* 64 bytes. All fields but `owner` are guarded by the home shard's tlock. */
struct weft_timer {
  struct weft__tlist link; /* wheel slot list while ARMED */
  uint64_t deadline;       /* ns */
  uint64_t period;         /* ns, 0: one-shot */
  weft_timer_fn fn;
  void *arg;
  /* its strand, or its home shard | WEFT_T_NOSTRAND; | WEFT_T_DESTROYED
   * once weft_timer_destroy ran. Set at create; the destroyed bit is set
   * under tlock and read without it by a firing about to run (timer.c). */
  _Atomic uintptr_t owner;
  /* state: WEFT_T_*; where: level * 64 + slot while ARMED; inflight: firings
   * queued or running; missed: reported to the next firing. */
  uint64_t state : 2, where : 9, inflight : 16, missed : 32;
};

/* owner's low bits: strands and shards are aligned to at least 8 bytes */
#define WEFT_T_NOSTRAND ((uintptr_t)1)
#define WEFT_T_DESTROYED ((uintptr_t)2)
#define WEFT_T_OWNER_BITS ((uintptr_t)3)

static inline weft_strand *weft__timer_strand(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  return (o & WEFT_T_NOSTRAND) ? NULL : (weft_strand *)(o & ~WEFT_T_OWNER_BITS);
}

void weft__wheel_init(struct weft__wheel *w, uint64_t now_ns);
/* Fires the timers of shard `home` due at now_ns, posting their handlers
 * from the calling thread's shard `local`. Returns false if another thread
 * was serving home (trylock), true once served. */
bool weft__timers_fire_due(struct weft__shard *home, struct weft__shard *local,
                           uint64_t now_ns);
/* At shutdown: every armed timer's handler is queued with -ECANCELED. */
void weft__timers_flush(weft_rt *rt);
uint64_t weft__now_ns(void);

/* ---- I/O backends (io.c, io_uring.c, io_epoll.c) -------------------------
 * Each shard has one backend instance (io_uring ring or epoll set) and an
 * eventfd that wakes the thread holding the shard when it sleeps there. The
 * backend is used only by the shard's holder (the same exclusion as its run
 * queue's owner side): submissions from handlers bracket it with
 * weft__local_begin / weft__local_end. Completions and readiness events are
 * turned into bits on the socket (tcp.c) and a post to its strand. */
struct weft__sock;
struct weft__thread;
struct io_uring_sqe;

#define WEFT_IO_EVBUF 64

/* uring: a provided receive buffer (io_bufring.c). next links it in a
 * socket's queue or on the return stack; len and off: its data, unread
 * from off on. */
struct weft__rbuf {
  struct weft__rbuf *next;
  struct weft__io *io; /* the shard ring it belongs to */
  char *data;
  uint32_t len, off;
  uint16_t bid;
};

/* Pushes b on a stack of buffers that a consumer takes whole, with one
 * exchange (acquire): release, so that b's fields written before the push
 * are seen by the taker. Nothing pops single nodes, so there is no ABA. */
static inline void weft__rbuf_push(_Atomic(struct weft__rbuf *) *top,
                                   struct weft__rbuf *b) {
  struct weft__rbuf *head = atomic_load_explicit(top, memory_order_relaxed);
  do
    b->next = head;
  while (!atomic_compare_exchange_weak_explicit(
      top, &head, b, memory_order_release, memory_order_relaxed));
}

#define WEFT_RBUF_COUNT 128u /* a power of two */
#define WEFT_RBUF_SIZE 4096u

/* uring: a count that stays raised while an entry sits in a ring's SQ.
 * The ring's holder drops it (seq_cst) after the enter that consumed the
 * entry, so a thread that sees it at 0 knows the kernel has issued it
 * (listen.c: accepts that must not race a descriptor shortage). */
struct weft__sq_hold {
  struct weft__sq_hold *next;
  _Atomic uint32_t *count;
  uint32_t pos; /* the entry's SQ index + 1: consumed once khead is there */
};

struct weft__io {
  int kind; /* WEFT_BACKEND_URING or WEFT_BACKEND_EPOLL */
  int efd;  /* eventfd: written to wake the holder from its wait */
  struct weft__shard *sh;
  unsigned unsubmitted;        /* uring: SQEs prepared and not yet entered */
  struct weft__sq_hold *holds; /* uring: dropped once their entry is in */
  unsigned close_n;   /* uring: close entries not yet entered (tcp_open) */
  uint32_t close_pos; /* uring: the last one's SQ index + 1 */
  bool wake_armed;    /* uring: a poll of efd is in the ring */
  void *ring;         /* uring: struct io_uring */
  /* uring: provided receive buffers, NULL if the kernel has none */
  void *br; /* struct io_uring_buf_ring */
  struct weft__rbuf *rbufs;
  char *rbuf_mem;
  _Atomic(struct weft__rbuf *) rbuf_ret; /* handed back by other threads */
  /* buffers given to sockets, and given back: by the holder, by others */
  _Atomic uint64_t st_rbuf_out, st_rbuf_in, st_rbuf_ret;
  int epfd;            /* epoll */
  unsigned nev, evpos; /* epoll: events waited for, not yet dispatched */
  uint64_t evdata[WEFT_IO_EVBUF];
  uint32_t evbits[WEFT_IO_EVBUF];
};

/* An operation in the kernel (io_uring): its user_data is the socket's
 * address with one of these in the low bits; 0 is the wake poll. */
#define WEFT_OP_READ 1u  /* receive, accept or connect */
#define WEFT_OP_WRITE 2u /* send; a listener's: accept (listen.c) */
#define WEFT_OP_RECVM 3u /* multishot receive */
#define WEFT_OP_MASK 3u
/* user_data of requests whose completion nobody waits for (cancels) */
#define WEFT_UD_QUIET ((uint64_t)WEFT_OP_READ)

/* At create: decides the backend, sets up shard 0's. */
int weft__io_init(weft_rt *rt, int backend);
/* Before the first socket: sets up every shard's backend (once). */
int weft__io_ensure(weft_rt *rt);
void weft__io_destroy(weft_rt *rt);
const char *weft__backend_name(int kind);
/* Run loop: submit what is prepared, dispatch what completed; idle: the
 * shard's run queue is empty. */
void weft__io_poll(struct weft__shard *sh, struct weft__io *io, bool idle);
/* Submits what the shard's ring has prepared (a no-op for epoll). */
void weft__io_flush(struct weft__shard *sh);
/* Park: sleep in the backend until woken (t->wake), an event, or deadline
 * (UINT64_MAX: none). Dispatches nothing (the thread is still counted
 * parked); returns true when events wait to be dispatched. */
bool weft__io_wait(struct weft__thread *t, struct weft__io *io,
                   uint64_t deadline);
/* Wakes t if it sleeps in a backend; false if it does not (use the futex). */
bool weft__io_wake_thread(struct weft__thread *t);
/* uring: an SQE of the shard's ring, NULL if the ring stays full. */
struct io_uring_sqe *weft__uring_sqe(struct weft__shard *sh);
/* uring: h->count, already raised by the caller, is dropped once the
 * entry just taken from the shard's ring has been entered. */
void weft__uring_hold(struct weft__shard *sh, struct weft__sq_hold *h);
/* uring: a close of fd in the entry just taken; the descriptor counts in
 * rt->tcp_open until the entry has been entered. */
void weft__uring_prep_close(struct weft__shard *sh, struct io_uring_sqe *sqe,
                            int fd);
/* uring: after every enter of io's ring that may have submitted. */
void weft__uring_entered(struct weft__io *io);
/* uring: whether accept requests can be made that never wait in the
 * kernel (IORING_ACCEPT_DONTWAIT, 6.10), as the probe ring found. */
bool weft__uring_accept_nowait(void);
/* uring: an accept of listening socket fd that never waits, for fds
 * with flags (SOCK_CLOEXEC ...). */
void weft__uring_prep_accept(struct io_uring_sqe *sqe, int fd, int flags);
void weft__uring_reap(struct weft__io *io);
int weft__uring_setup(struct weft__io *io, bool probe);
void weft__uring_teardown(struct weft__io *io);
void weft__uring_submit(struct weft__io *io);
bool weft__uring_wait(struct weft__io *io, uint64_t deadline);
/* epoll */
int weft__epoll_setup(struct weft__io *io);
bool weft__epoll_wait(struct weft__io *io, uint64_t deadline, bool block);
void weft__epoll_dispatch(struct weft__io *io);

/* Sockets (tcp.c): a completion or event for s; gen_tag: the generation
 * the event was registered with (epoll), or UINT32_MAX (an op: s is alive
 * while the op is in the kernel). */
void weft__sock_signal(struct weft__shard *local, struct weft__sock *s,
                       uint64_t bits, uint32_t gen_tag);
/* io_uring: the operation user_data names completed with res and the
 * completion's flags. */
void weft__sock_completed(struct weft__shard *local, uint64_t user_data,
                          int32_t res, uint32_t flags);
/* io_uring: a completion of a socket's multishot receive (tcp_recv.c) */
void weft__sock_recvm(struct weft__io *io, uint64_t user_data, int32_t res,
                      uint32_t flags);
/* io_bufring.c: set up (0, or the kernel's refusal: then io->br stays
 * NULL), free after the ring is gone, the buffer of an id, moving handed
 * back buffers to the ring and giving one to it (holder only), handing one
 * back (any thread). */
int weft__bufring_setup(struct weft__io *io);
void weft__bufring_free(struct weft__io *io);
struct weft__rbuf *weft__bufring_get(struct weft__io *io, unsigned bid);
void weft__bufring_drain(struct weft__io *io);
void weft__bufring_give(struct weft__io *io, struct weft__rbuf *b);
void weft__bufring_put(weft_rt *rt, struct weft__rbuf *b);
void weft__io_stats(weft_rt *rt, weft_stats *out);
/* epoll's registration word for s and its decoding */
void weft__sock_event(struct weft__shard *local, uint64_t data,
                      uint32_t events);
/* At shutdown: every socket closes (tcp.c). */
void weft__tcp_shutdown(weft_rt *rt);
void weft__tcp_destroy(weft_rt *rt);
size_t weft__sock_size(void);

/* ---- shards, threads, runtime ------------------------------------------- */
struct weft__thread;

struct weft__shard {
  struct weft__runq rq;
  /* Timer firings: served before rq, so a timer's handler does not wait
   * behind busy strands' batches. Stolen like rq. */
  struct weft__runq prq;
  /* Lines: what other threads read or take (rt, owner; timer_next; tlock
   * and the wheel) never shares one with what the owner writes all the
   * time (the fields below up to quiet), nor the one with the other: a
   * look at a shard's timer_next or a settle under its tlock otherwise
   * takes the line of the owner's pool caches with it, and the owner's
   * next allocation waits for it back. On the 2-vCPU guest (2026-12-02)
   * two workers caught up with 1000 overdue timers in 704 us with the
   * lines apart, 770 before (BENCHMARKS.md, "What two threads share in a
   * catch-up"). */
  weft_rt *rt;
  unsigned idx;
  _Atomic(struct weft__thread *) owner;
  /* owner only */
  uint32_t tick WEFT_ALIGNED;
  uint32_t peek;  /* the shard serve_one_overdue looks at last */
  uint32_t looks; /* next_item calls, for its look every 16 */
  uint32_t rng;
  uint32_t home_next; /* weft__home_pick: the home of the next object */
  struct weft__pool_cache node_cache;
  struct weft__pool_cache strand_cache;
  struct weft__pool_cache timer_cache;
  struct weft__pool_cache sock_cache;
  /* firing a batch of timers, whose pushes notify parked threads once
   * after tlock is released instead of once each (timer.c), or reaping
   * completions (io_uring.c, REAP_SHARE_MIN) */
  bool quiet;
  /* timers: next deadline (ns, UINT64_MAX: none) readable without tlock */
  _Atomic uint64_t timer_next WEFT_ALIGNED;
  weft__lock_t tlock WEFT_ALIGNED;
  struct weft__wheel wheel;
  /* counters: written by the owning thread, read by anyone */
  _Atomic uint64_t st_timers_fired WEFT_ALIGNED;
  _Atomic uint64_t st_stalls, st_handoffs; /* written by the monitor */
  _Atomic uint64_t st_handlers_run, st_handlers_cancelled, st_strands_run,
      st_steals, st_parks, st_wakeups, st_injected;
  _Atomic uint64_t st_strands_created, st_strands_freed;
  _Atomic uint64_t st_io_events, st_io_enters;
  /* NULL: backend NONE, or not set up yet (io.c: weft__io_ensure) */
  _Atomic(struct weft__io *) io;
  /* sockets registered here, for the shutdown sweep (tcp.c) */
  pthread_mutex_t tcp_lock;
  struct weft__sock *tcp_list;
  unsigned accept_rr; /* tcp.c: home shard for connections from outside */
  /* 1 while the shard's own thread (threads[idx]) is dormant (park.c);
   * here, not in the slot, since spares reuse slots (monitor.c) */
  _Atomic uint32_t thread_dormant;
  /* The memory of the strands and timers homed here. The owner's caches
   * above trade with them under their locks; so do other threads creating
   * or freeing such objects, without a cache (weft__home_pick). */
  struct weft__pool strand_pool WEFT_ALIGNED;
  struct weft__pool timer_pool;
} WEFT_ALIGNED;

#define WEFT__LINE_OF(f) (offsetof(struct weft__shard, f) / WEFT_CACHELINE)
_Static_assert(WEFT__LINE_OF(owner) < WEFT__LINE_OF(tick) &&
                   WEFT__LINE_OF(quiet) < WEFT__LINE_OF(timer_next) &&
                   WEFT__LINE_OF(timer_next) < WEFT__LINE_OF(tlock),
               "a shard's shared fields and its owner's do not share lines");
#undef WEFT__LINE_OF

/* The stall protocol (monitor.c has the argument). hstate is written only
 * by its thread: (epoch << 2) | HS_*, a new epoch per handler. */
#define WEFT_HS_OUT 0u  /* between handlers: the thread uses its shard */
#define WEFT_HS_IN 1u   /* inside a handler: the shard may be taken */
#define WEFT_HS_BUSY 2u /* inside a handler, using its shard (a post) */

/* A slot is DORMANT while its shard's thread has not been started yet
 * (weft_config.eager_workers; park.c's wake_dormant starts it). */
enum { WEFT_TH_FREE = 0, WEFT_TH_LIVE, WEFT_TH_EXITED, WEFT_TH_DORMANT };

struct weft__thread {
  weft_rt *rt;
  struct weft__shard *shard; /* held shard, NULL for a spare */
  pthread_t tid;
  unsigned idx;
  bool searching;
  bool in_handler; /* own copy of hstate's state, for the thread itself */
  /* futex word: 0 asleep or running, 1 woken by a notifier (popped from the
   * sleepers) or by the monitor (a shard to hold), 2 kicked (a timer moved
   * its shard's deadline earlier) */
  _Atomic uint32_t wake;
  /* while it sleeps in park: the timer deadline it sleeps until
   * (UINT64_MAX while it reads it); 0 otherwise (park.c, weft__kick) */
  _Atomic uint64_t sleep_until;
  /* the backend it sleeps in (park.c, io.c), NULL otherwise */
  _Atomic(struct weft__io *) io_sleep;
  _Atomic uint64_t hstate;
  /* when the handler of hstate's epoch began (CLOCK_MONOTONIC ns), or 0
   * when the runtime does not stamp handlers (rt->stamp; monitor.c), or
   * WEFT_HSTART_LATE: stamping turned on while the epoch began */
  _Atomic uint64_t hstart;
  uint64_t epoch;
  /* 0; 1: the monitor took the shard; 2: the thread saw it (monitor.c) */
  _Atomic uint32_t taken;
  _Atomic(void *) cur_fn;     /* handler running, for stall reports */
  _Atomic(void *) cur_strand; /* its strand, or NULL */
  /* set by the thread at start, for the monitor: its kernel id (0 until
   * then) and its CPU-time clock */
  _Atomic int kernel_tid;
  clockid_t cpu_clock;
  bool cpu_clock_ok;
  bool lazy;      /* started after weft_rt_create, by a wakeup (park.c) */
  int slot_state; /* WEFT_TH_*, under rt->spare_lock */
  /* while DORMANT: no start is tried before this time after a failed one
   * (park.c); under rt->spare_lock */
  uint64_t retry_ns;
  /* 1 while slot_state is DORMANT: a lock-free hint for wakers, cleared
   * (release, under spare_lock) once the thread is created */
  _Atomic uint32_t dormant;
} WEFT_ALIGNED;

/* Stores of hstate and loads of taken: a release store and a relaxed load
 * with a compiler barrier between, the monitor's membarrier() supplying the
 * store-load fence (monitor.c). ThreadSanitizer does not know membarrier,
 * so its builds use seq_cst, which is a correct protocol on its own. The
 * same goes for hstate and the second load of rt->stamp in
 * weft__handler_enter, against the monitor's switch (stamp_mode). */
#if defined(__SANITIZE_THREAD__)
#define WEFT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WEFT_TSAN 1
#endif
#endif
#ifdef WEFT_TSAN
#define WEFT_HS_STORE_MO WA_SC
#define WEFT_HS_LOAD_MO WA_SC
#define WEFT_STAMP_REREAD_MO WA_SC
#define WEFT_SCAN_HS_MO WA_SC
#else
#define WEFT_HS_STORE_MO WA_REL
#define WEFT_HS_LOAD_MO WA_RLX
#define WEFT_STAMP_REREAD_MO WA_RLX
#define WEFT_SCAN_HS_MO WA_ACQ
#endif
#define WEFT_HSTART_LATE 1u /* no clock reads 1 */

/* idle.state packs (unparked << 32) | searching; see park.c. */
struct weft__idle {
  _Atomic uint64_t state WEFT_ALIGNED;
  pthread_mutex_t lock; /* guards sleepers[] */
  unsigned nsleepers;
  struct weft__thread **sleepers;
  /* Once done: sleepers[0..done_n) are the threads to wake, claimed by
   * index (park.c, wake_done_share). */
  unsigned done_n;
  _Atomic unsigned done_next;
};

struct weft_rt {
  unsigned nshards;
  unsigned batch;
  struct weft__shard *shards;   /* in arena */
  struct weft__thread *threads; /* in arena */
  void *arena; /* one mapping: shards, threads, the pools' first objects */
  size_t arena_bytes;
  struct weft__inject inject;
  struct weft__idle idle;
  struct weft__pool node_pool;
  struct weft__pool sock_pool;
  unsigned timer_slack_ns;
  unsigned timer_spin_ns;          /* 0: never spin */
  _Atomic uint32_t stamp;          /* handlers record their start (monitor.c) */
  pthread_attr_t thread_attr;      /* stack size of every runtime thread */
  pthread_attr_t lazy_attr;        /* the same and the creator's CPU affinity */
  int backend;                     /* WEFT_BACKEND_URING, _EPOLL or _NONE */
  bool ring_accept;                /* uring: accepts are ring requests */
  struct weft__io *ios;            /* one per shard, NULL for NONE */
  _Atomic uint32_t io_all;         /* every shard's backend is set up */
  pthread_mutex_t io_lock;         /* setting them up (weft__io_ensure) */
  _Atomic int64_t tcp_open;        /* sockets whose descriptor is open */
  _Atomic uint64_t tcp_live;       /* sockets not yet freed */
  _Atomic uint32_t tcp_rr;         /* home shard of sockets made outside */
  _Atomic uint32_t home_rr;        /* of strands, timers made outside */
  _Atomic uint32_t no_poll_first;  /* the kernel refused RECVSEND_POLL_FIRST */
  _Atomic uint32_t no_multishot;   /* the kernel refused a multishot receive */
  _Atomic uint64_t recv_nobufs;    /* multishot receives that found no buffer */
  struct weft_listener *listeners; /* under life_lock; freed at destroy */

  /* lifecycle; closing and cancelling only go 0 -> 1 */
  _Atomic uint32_t closing WEFT_ALIGNED;
  _Atomic uint32_t cancelling;
  _Atomic uint32_t done;            /* all accepted work finished */
  _Atomic int64_t foreign_inflight; /* posts from outside in progress */
  _Atomic uint64_t foreign_strands_created, foreign_strands_freed;
  _Atomic int64_t lost_inflight;        /* handlers running on threads that lost
                                           their shard to a handoff */
  _Atomic int64_t blocking_inflight;    /* blocking jobs accepted, not done */
  _Atomic uint64_t orphan_handlers_run; /* run by threads after a handoff */
  _Atomic uint64_t orphan_handlers_cancelled;
  _Atomic uint64_t foreign_timers_fired;
  _Atomic uint64_t thread_start_errors; /* lazy starts that failed (park.c) */
  _Atomic uint32_t start_failed; /* 1 once a lazy start failed (park.c) */
  _Atomic uint32_t all_started;  /* 1 once no shard's thread is dormant */
  pthread_mutex_t life_lock;     /* guards the fields below */
  pthread_cond_t life_cond;
  unsigned started; /* threads that reached their loop */
  bool shutdown_called;
  bool joined;

  /* threads beyond the shards' own: spares for handoffs (monitor.c) */
  unsigned max_threads;
  unsigned neager;   /* shards whose threads weft_rt_create starts */
  unsigned nthreads; /* slots in use in threads[] */
  pthread_mutex_t spare_lock;
  unsigned nspares;
  struct weft__thread **spares;
  struct weft__monitor *monitor;
  struct weft__blocking *blocking;
  uint64_t stall_ns;
  bool membarrier_ok; /* registered in create, before our threads */
  weft_stall_fn on_stall;
  void *on_stall_ctx;
};

/* The thread-local identity of runtime threads (shard.c). */
extern _Thread_local struct weft__thread *weft__tls_self
    __attribute__((tls_model("initial-exec")));
static inline struct weft__thread *weft__self(void) { return weft__tls_self; }
void weft__set_current_strand(weft_strand *s);

/* The calling thread acknowledges that the monitor took its shard: true if
 * it did (the thread then holds no shard). */
static inline bool weft__lost(struct weft__thread *t) {
  uint32_t one = 1;
  if (!weft__cas(&t->taken, &one, 2, WA_AR, WA_ACQ))
    return false;
  t->shard = NULL;
  return true;
}

/* The calling thread's shard if it is a thread of rt holding one, for use
 * until weft__local_end. Inside a handler this brackets the use so that the
 * monitor cannot hand the shard to another thread meanwhile; if it already
 * has, the thread is now outside any shard and this returns NULL. */
static inline struct weft__shard *weft__local_begin(weft_rt *rt) {
  struct weft__thread *t = weft__self();
  if (!t || t->rt != rt || !t->shard)
    return NULL;
  if (t->in_handler) {
    weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_BUSY, WEFT_HS_STORE_MO);
    atomic_signal_fence(memory_order_seq_cst);
    if (weft__load(&t->taken, WEFT_HS_LOAD_MO) && weft__lost(t)) {
      weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
      return NULL;
    }
  }
  return t->shard;
}

static inline void weft__local_end(struct weft__shard *sh) {
  struct weft__thread *t = weft__self();
  if (sh && t->in_handler)
    weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
}

/* Around every handler a runtime thread runs (shard.c, strand.c). */
static inline void weft__handler_enter(struct weft__thread *t, void *fn,
                                       weft_strand *s) {
  t->epoch++;
  weft__store(&t->cur_fn, fn, WA_RLX);
  weft__store(&t->cur_strand, (void *)s, WA_RLX);
  /* release, before the epoch's hstate: the monitor's acquire loads
   * (monitor.c, known_start). A clock read only while the monitor asks. */
  uint64_t start = weft__load(&t->rt->stamp, WA_RLX) ? weft__now_ns() : 0;
  weft__store(&t->hstart, start, WA_REL);
  t->in_handler = true;
  weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
  /* Stamping may have turned on since the flag was read: say so, and the
   * monitor, maybe asleep for 1.4 thresholds already, counts the handler
   * from the switch (monitor.c, stamp_mode, has the argument). */
  atomic_signal_fence(memory_order_seq_cst);
  if (!start && weft__load(&t->rt->stamp, WEFT_STAMP_REREAD_MO))
    weft__store(&t->hstart, WEFT_HSTART_LATE, WA_REL);
}

/* Returns the thread's shard, or NULL if the monitor took it meanwhile. */
static inline struct weft__shard *weft__handler_leave(struct weft__thread *t) {
  t->in_handler = false;
  weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_OUT, WEFT_HS_STORE_MO);
  atomic_signal_fence(memory_order_seq_cst);
  if (weft__load(&t->taken, WEFT_HS_LOAD_MO))
    weft__lost(t);
  return t->shard;
}

/* Monitor and spares (monitor.c). */
/* MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED; whether handoffs may use it. */
bool weft__membarrier_register(void);
int weft__monitor_start(weft_rt *rt);
int weft__spare_prestart(weft_rt *rt);
/* Tells the monitor thread to exit; stop joins it and frees its state,
 * which a late nudge may still read until then. */
void weft__monitor_stop_soon(weft_rt *rt);
void weft__monitor_stop(weft_rt *rt);
void weft__monitor_nudge(weft_rt *rt); /* a thread unparked */
/* A thread without a shard: wait as a spare; false when it must exit. */
bool weft__spare_wait(struct weft__thread *t);
void weft__spares_wake_all(weft_rt *rt);
/* A thread that lost its shard finished the handler it was stuck in. */
void weft__lost_done(weft_rt *rt);

/* Blocking pool (blocking.c). */
int weft__blocking_init(weft_rt *rt, const weft_config *cfg);
void weft__blocking_shutdown(weft_rt *rt);
void weft__blocking_destroy(weft_rt *rt);
void weft__blocking_stats(weft_rt *rt, weft_stats *out);

/* Homes. A strand, and a timer without strand, gets a home shard when it
 * is created (weft__home_pick) and keeps it: the shard whose wheel its
 * timers are on, and whose pools its memory and its timers' come from.
 * So one home's objects lie together in memory, apart from the others'.
 * Hashed from the address, as before, the two homes' timers and strands
 * alternated line by line, and a catch-up of 1000 overdue timers by two
 * workers took 521-649 us (medians of 40) where it takes 312-362 now
 * (BENCHMARKS.md, "A home chosen at creation"). */
static inline struct weft__shard *weft__timer_home(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  if (o & WEFT_T_NOSTRAND)
    return (struct weft__shard *)(o & ~WEFT_T_OWNER_BITS);
  weft_strand *s = (weft_strand *)(o & ~WEFT_T_OWNER_BITS);
  return &s->rt->shards[s->home];
}
/* Its runtime, without the detour through the strand's home shard. */
static inline weft_rt *weft__timer_rt(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  if (o & WEFT_T_NOSTRAND)
    return ((struct weft__shard *)(o & ~WEFT_T_OWNER_BITS))->rt;
  return ((weft_strand *)(o & ~WEFT_T_OWNER_BITS))->rt;
}
/* A new object's home: the shards in turn, each creating thread (a
 * worker's own count, or one count for every thread outside) starting
 * from its own shard. Not the creator's shard always: 1000 strands made
 * by one handler then had all their timers on one wheel, and one thread
 * firing 10^6 timers a second ran p99 0.47-0.92 ms late where homes in
 * turn run 44-54 us (BENCHMARKS.md, "A home chosen at creation"). An
 * object of another home than the creator's comes from that home's
 * depot, under its lock. */
static inline unsigned weft__home_pick(weft_rt *rt, struct weft__shard *local) {
  if (!local)
    return weft__fetch_add(&rt->home_rr, 1, WA_RLX) % rt->nshards;
  unsigned h = local->home_next;
  local->home_next = h + 1 == rt->nshards ? 0 : h + 1;
  return h;
}

/* Scheduling (shard.c). */
void weft__schedule(weft_rt *rt, struct weft__shard *local, weft__item it);
/* The same for a timer firing: to the shard's priority ring. */
void weft__schedule_prio(weft_rt *rt, struct weft__shard *local, weft__item it);
void weft__thread_main_loop(struct weft__thread *t);
void *weft__thread_entry(void *arg);

/* Strands (strand.c). Push without the shutdown check: for work that was
 * already accepted (timer firings). */
void weft__strand_push(weft_strand *s, struct weft__shard *local,
                       struct weft__node *n, bool prio);
void weft__strand_run(struct weft__shard *sh, weft_strand *s);
void weft__node_run(struct weft__shard *sh, struct weft__node *n);

/* Park protocol (park.c). */
void weft__idle_init(struct weft__idle *idle, unsigned nthreads);
int weft__idle_alloc(struct weft__idle *idle, unsigned nthreads);
void weft__idle_destroy(struct weft__idle *idle);
void weft__notify_parked(weft_rt *rt);
void weft__poke(weft_rt *rt);
/* tcp.c: n socket descriptors were closed (rt->tcp_open). */
void weft__tcp_closed(weft_rt *rt, int64_t n);
bool weft__to_searching(weft_rt *rt, struct weft__thread *t);
void weft__from_searching(weft_rt *rt, struct weft__thread *t);
/* Parks t until woken; returns false when the runtime is done. */
bool weft__park(weft_rt *rt, struct weft__thread *t);
/* Puts the dormant threads (shards neager..nshards) in the sleepers, as
 * if parked; before any thread starts. */
void weft__idle_add_dormant(weft_rt *rt);
/* The first step of a lazily started thread: what its park would have
 * done after its sleep. False: the runtime is done. */
bool weft__park_resume(weft_rt *rt, struct weft__thread *t);
/* Starts every dormant thread: the first socket needs them all, since
 * every shard serves sockets. -EAGAIN if one could not be started (the
 * next call tries again). */
int weft__start_dormant_all(weft_rt *rt);
/* Creates the thread of a dormant slot (rt.c); spare_lock held. 0 or a
 * negative errno from pthread_create. */
int weft__thread_create_dormant(weft_rt *rt, struct weft__thread *t);
void weft__futex_wait(_Atomic uint32_t *addr, uint32_t expected);
/* Waits until *addr != expected or CLOCK_MONOTONIC reaches deadline_ns. */
void weft__futex_wait_until(_Atomic uint32_t *addr, uint32_t expected,
                            uint64_t deadline_ns);
/* A timer made shard sh's earliest deadline earlier: wake its thread. */
void weft__kick(struct weft__shard *sh, uint64_t deadline);
void weft__futex_wake(_Atomic uint32_t *addr, int n);

/* Posting from outside (rt.c). */
int weft__foreign_enter(weft_rt *rt);
void weft__foreign_exit(weft_rt *rt);

#endif
