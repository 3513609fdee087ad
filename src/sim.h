/*
 * sim.h, sim.c - simulation (weft.h, "Simulation"): a runtime that starts
 * no thread, whose shards and blocking jobs run one step at a time on the
 * thread that waits for it, in an order a PRNG seeded by the user chooses,
 * on a virtual clock. Built into the weft_sim library only (WEFT_SIM);
 * elsewhere every hook below compiles to nothing. Owns struct weft__sim,
 * the virtual clock and the process's count of live runtimes of each kind.
 *
 * Why a driver and not fibers for the runtime's threads: a runtime thread
 * between two items holds nothing but its shard, so running one shard's
 * next item (shard.c, weft__shard_step) as that shard's thread would is
 * the whole of what a thread does; the choice of which shard steps next
 * is where the interleavings come from. Parking never happens: the idle
 * state counts every shard's thread as awake, so producers wake nobody
 * (park.c, weft__notify_parked returns before its lock), and the driver
 * sees the queues itself.
 */
#ifndef WEFT_SIMULATION_H
#define WEFT_SIMULATION_H

#include "core.h"

#include <stdbool.h>
#include <stdint.h>

struct weft__sim;

#ifdef WEFT_SIM
/* Resolves cfg->sim_seed (WEFT_SIM_SEED from the environment, where set,
 * overrides it: a crash line's replay) and, if
 * the runtime is to be simulated, its faults (WEFT_SIM_FAULTS,
 * WEFT_SIM_FAULT_ODDS) and what simulation fixes: no monitor thread (the
 * driver makes its looks), no timer spin, no recorder, the epoll backend (Unix
 * sockets underneath), 4 shards by default (so the same seed gives the same run
 * on any machine). -EINVAL for a malformed variable. Before the configuration
 * is resolved. */
int weft__sim_config(weft_config *cfg);
/* After rt_init, before the shards read the clock: claims the process's
 * one simulation (or counts a real runtime: none may live beside one) and
 * sets up rt->sim. -EBUSY, -ENOMEM. */
int weft__sim_attach(weft_rt *rt, const weft_config *cfg);
/* Undoes weft__sim_attach; a no-op if it did not succeed. */
void weft__sim_detach(weft_rt *rt);
/* A seeded value for shard i's steal PRNG. */
uint32_t weft__sim_shard_seed(weft_rt *rt, unsigned i);
/* Runs the simulation on the calling thread until the shutdown has
 * finished (0) or the virtual clock reaches deadline (-ETIMEDOUT). */
int weft__sim_run(weft_rt *rt, uint64_t deadline);
/* A handler call (shard -1: a blocking job), for the log and its hash. */
void weft__sim_note(weft_rt *rt, int shard, const void *fn, const void *strand);
/* A handler begins on thread t (weft__handler_enter, once its epoch is
 * published): the log's line, and maybe a drawn stall (sim.c). */
void weft__sim_handler(struct weft__thread *t, const void *fn,
                       const void *strand);
/* Whether the simulation injects a fault of kind (WEFT_SIM_FAULT_*) at
 * this chance of one; false for a real runtime. */
bool weft__sim_fault(weft_rt *rt, unsigned kind);
/* TCP on the simulated host (its sockets are Unix sockets underneath):
 * every address of the host is one, so a port names a listener. Writes
 * the abstract Unix name of tcp's port into un. listener: a port 0 takes
 * the next free port, written back into tcp. -ENOTSUP for a family other
 * than AF_INET and AF_INET6. */
struct sockaddr;
struct sockaddr_storage;
struct sockaddr_un;
int weft__sim_tcp_name(weft_rt *rt, struct sockaddr_storage *tcp,
                       struct sockaddr_un *un, unsigned *unlen, bool listener);
/* UDP on the simulated host, the same way over Unix datagram sockets,
 * with ports of their own: the name of udp's port. bind: a port 0 takes
 * the next free port, written back into udp. -ENOTSUP as above. */
int weft__sim_udp_name(weft_rt *rt, struct sockaddr_storage *udp,
                       struct sockaddr_un *un, unsigned *unlen, bool bind);
/* Binds connecting socket fd to the name of a client port nobody holds,
 * which it returns; -EADDRNOTAVAIL when every ephemeral port is held, or
 * bind's -errno. */
int weft__sim_tcp_bind_client(weft_rt *rt, int fd);
/* The port a simulated name holds (a peer's, from getpeername or a
 * datagram's source), or 0. */
uint16_t weft__sim_port_of(const struct sockaddr_un *un, unsigned len);
/* The loopback address of family, with port, as the simulated host's
 * TCP and UDP addresses read. */
void weft__sim_host_addr(int family, uint16_t port, struct sockaddr *out,
                         unsigned *len);
/* The simulated host's ephemeral ports start here (sim_host.c); sim.c
 * keeps the sequence (the next one, taken; any thread) and the host's
 * serial, which its socket names carry. */
#define WEFT_SIM_FIRST_PORT 32768u
uint16_t weft__sim_next_port(weft_rt *rt);
unsigned weft__sim_serial(weft_rt *rt);
/* Puts n readiness events of one epoll wait in a drawn order (io_epoll.c). */
void weft__sim_shuffle(weft_rt *rt, uint64_t *data, uint32_t *bits, unsigned n);
#else
static inline bool weft__sim_fault(weft_rt *rt, unsigned kind) {
  (void)rt;
  (void)kind;
  return false;
}
#endif

#endif
