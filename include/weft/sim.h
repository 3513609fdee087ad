/*
 * weft/sim.h - simulation, for tests: the weft_sim library runs a whole
 * program under a seed, on a virtual clock, with the network's faults.
 * Part of weft's API: include <weft.h>, which includes this file.
 */
#ifndef WEFT_SIM_H
#define WEFT_SIM_H

#ifndef WEFT_H
#error "include <weft.h>, which includes this header"
#endif

/* ---- simulation ----------------------------------------------------------
 * For tests. The weft_sim library (CMake: weft::weft_sim; -lweft_sim) is
 * weft built for it. A runtime created there with weft_config.sim_seed
 * (or WEFT_SIM_SEED, which overrides it) starts no thread: its shards
 * run on the thread that waits for it, in weft_rt_wait, weft_rt_shutdown
 * without WEFT_SHUTDOWN_NOWAIT and weft_rt_destroy, one step at a time.
 * A step is
 * a shard running its next run-queue item (a strand's turn, a timer's
 * firing, a post from outside; a shard with none of its own steals), or a
 * queued blocking job running. A PRNG seeded with sim_seed chooses each
 * step, which job, and whom a shard steals from. Time is virtual:
 * weft_now_ns and the timers read a clock that moves 1-2000 ns (drawn)
 * with each handler call and each step and, when nothing can run, jumps
 * to the next timer's deadline, so an hour of timeouts passes in
 * milliseconds. weft_rt_wait's timeout is virtual too: when nothing is
 * left to run before it, the clock jumps to it. What main posts or starts
 * before the wait is taken in when the wait begins. One thread runs the
 * simulation at a time: while several wait at once (weft_rt_wait and
 * weft_rt_shutdown from any thread), one runs it and the others sleep
 * until the shutdown has finished, their timeout has passed on the
 * virtual clock, or the running thread's wait returns, when one of them
 * runs it on. A blocking job, which a simulation runs on the running
 * thread, gets -EDEADLK from a wait, as in a real runtime; a wait from
 * on_stall, which also runs there, runs the simulation on from inside that
 * step, as a stall does (weft_sim_stall), faults included, until it
 * returns.
 *
 * The same program and seed call the same handlers in the same order at
 * the same virtual times, in any process. weft_sim_info.log_hash sums
 * that sequence up; WEFT_SIM_LOG=FILE writes it out, a line per call
 * (virtual ns, shard or -1 for a blocking job, function, strand, each
 * numbered by first appearance), to compare two runs (each simulated
 * runtime writes the file anew). A run that crashes (an assert, a fault)
 * prints its seed and how to replay it first (WEFT_SIM_SEED=N, which
 * every simulated runtime of the process then takes), if the application
 * left that signal's action at its default.
 *
 * The network is the kernel's Unix sockets: between two sockets of one
 * process its answers follow from the calls alone, so they replay too.
 * weft_tcp_listen and weft_tcp_connect take Unix addresses as always,
 * and TCP ones (IPv4 or IPv6) as ports of one simulated host, each a
 * Unix stream socket underneath: every address of the host is the same
 * one, a port 0 listener gets the next free port (weft_listener_addr
 * tells which), a connect's own port is the next one nobody holds
 * (ephemeral ports are 32768-65535; when every one is held,
 * weft_tcp_connect fails with -EADDRNOTAVAIL, as a kernel's connect
 * does), a connect to a port nobody listens on is refused, the
 * connections' addresses read as the loopback address of their family
 * with their ports, and TCP options succeed. UDP sockets are ports of
 * the same host (a port space of their own), each a Unix datagram socket
 * underneath: addresses read as UDP ones, a port 0 gets a port nobody
 * holds, datagrams between two sockets arrive in the order sent, and one
 * is lost where UDP could lose it: to a port nobody holds (a connected
 * socket's send then fails with -ECONNREFUSED), or when the receiver
 * holds too many unread (11 by the kernel's default,
 * net.unix.max_dgram_qlen, fewer of large ones, since unread datagrams
 * count against the sender's buffer, net.core.wmem_default: runs that
 * fill a socket replay on hosts with the same settings). A connected
 * socket receives from its peer only, datagrams that waited from others
 * included. There are no multicast groups (weft_udp_membership:
 * -ENOTSUP). Each shard takes in what its sockets
 * have ready when nothing else is queued, and a drawn order is given to
 * the events of each wait. The seed also injects faults where asked
 * (weft_config.sim_faults, WEFT_SIM_FAULT_*).
 *
 * The monitor runs in virtual time. A handler that calls weft_sim_stall
 * (or meets WEFT_SIM_FAULT_STALL) blocks for a span of virtual time while
 * everything else runs on, and the monitor notices it, reports it and
 * hands its shard to a spare thread as it would a real one's, on the
 * thread that runs the simulation (on_stall is called there; a report has
 * no backtrace). A handler that really blocks, in a system call, holds up
 * the whole simulation instead.
 *
 * Differences from a real runtime: 4 shards unless workers says
 * otherwise; the epoll backend; no flight recorder; name resolution,
 * signal watchers and child processes fail with -ENOTSUP; files go
 * through the blocking pool. Timers due at the same instant fire
 * in the order they were started, as on a real runtime. While a
 * simulation lives it is the process's only runtime: creating another of
 * either kind fails with -EBUSY. A wait that only a thread outside could
 * end (nothing to run, no timer armed, no shutdown started, no timeout)
 * returns -EDEADLK and logs why. Posts from other threads of the
 * application during a wait are taken in when they come, which a seed
 * does not repeat. Simulated TCP answers as its Unix socket underneath
 * does in two places where real TCP would not: a connect to a TCP port
 * whose listener's backlog is full completes at once with -EAGAIN (real
 * TCP retransmits its SYN until the listener accepts or the attempt times
 * out, so its connect completes later, usually with 0); and an abortive
 * weft_tcp_close sends no RST, so the peer sees an orderly end (a read
 * gets 0, not -ECONNRESET) once it has read what was sent. */

/* Faults a simulation injects (weft_config.sim_faults), each where the
 * kernel could have caused it, so the code under test meets it as it
 * would for real; only on the thread that runs the simulation while it
 * runs (in a wait), never in what main does before it, nor in the calls
 * of other threads meanwhile (their posts, say). */
#define WEFT_SIM_FAULT_REFUSE 1u /* a connect fails with -ECONNREFUSED */
/* A connection breaks before a receive or a send: both ends see it end
 * (end of file, -EPIPE). */
#define WEFT_SIM_FAULT_BREAK 2u
/* Descriptors run out: weft_tcp_connect fails with -EMFILE, or a
 * listener's accept does (it drops the connections waiting, and pauses). */
#define WEFT_SIM_FAULT_EMFILE 4u
/* A new connection gets the kernel's smallest socket buffers: large
 * writes go out in pieces and reads return less. */
#define WEFT_SIM_FAULT_SMALLBUF 8u
/* Memory runs out: a post, weft_strand_create, weft_timer_create or a
 * connection's object fails with -ENOMEM (a connection being accepted is
 * dropped: its client sees it closed). */
#define WEFT_SIM_FAULT_ENOMEM 16u
/* The network is slow: with nothing else to run, a shard leaves what its
 * sockets have ready for up to 1 ms of virtual time; timers due meanwhile
 * fire first. */
#define WEFT_SIM_FAULT_DELAY 32u
/* A handler blocks at its start for a drawn span of up to 3 stall
 * thresholds, as if it called weft_sim_stall; at most as many at once as
 * there are shards. */
#define WEFT_SIM_FAULT_STALL 64u
/* A UDP datagram is lost on its way: its send completes with 0 and
 * nobody receives it. */
#define WEFT_SIM_FAULT_DROP 128u
#define WEFT_SIM_FAULT_ALL 255u

/* Where a simulation stands (weft_rt_sim_info). */
typedef struct weft_sim_info {
  uint64_t seed;     /* the seed in use */
  uint64_t now_ns;   /* the virtual clock (weft_now_ns) */
  uint64_t steps;    /* steps taken */
  uint64_t handlers; /* handler and job calls */
  uint64_t log_hash; /* FNV-1a over the calls, as WEFT_SIM_LOG writes them */
  uint64_t faults;   /* faults injected */
} weft_sim_info;

/* Reads rt's simulation state. Errors: -EINVAL (rt or out NULL),
 * -ENOTSUP (rt is not simulated). Any thread; from one other than the
 * thread running the simulation, each count is a recent one, perhaps of
 * another step than its neighbours'. */
WEFT_API int weft_rt_sim_info_sized(weft_rt *rt, weft_sim_info *out,
                                    size_t size);
static inline int weft_rt_sim_info(weft_rt *rt, weft_sim_info *out) {
  return weft_rt_sim_info_sized(rt, out, sizeof(*out));
}

/* Blocks the calling handler for ns nanoseconds of virtual time, as a
 * blocking call would (a sleep, a slow disk, a lock held elsewhere):
 * the thread stays inside the handler, so its strand waits, while every
 * other strand, timer and socket runs on. Once the handler has run past
 * the stall threshold (counted from its start: several stalls in one
 * handler add up), the monitor reports it once (weft_config.on_stall, or
 * the log) and hands the shard to a spare thread, and the shard's other
 * work goes on there; a handler whose shard was handed on finishes
 * outside the runtime, as on a real one. For a test that the rest of a
 * program keeps its pace while one handler is slow; on a real runtime,
 * sleep instead. 0 once the span has passed (at once for 0), or later,
 * as a sleep may return: a stall that began during this one's and ends
 * after it holds this one until then (the simulation runs stalls as
 * nested calls), and a wait whose timeout passes during a stall returns
 * once it has ended. Errors: -EPERM from a simulated runtime's main
 * thread or blocking job or from another thread: only a handler running
 * on a shard can block; -ENOTSUP when no simulated runtime lives (always
 * outside the weft_sim library). */
WEFT_API int weft_sim_stall(uint64_t ns);

#endif /* WEFT_SIM_H */
