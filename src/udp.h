/*
 * udp.h, udp.c - UDP sockets: a socket (sock.h) of kind SK_UDP that reads
 * datagrams in batches when readable and sends queued ones in batches,
 * on both backends (weft_udp_*).
 */
#ifndef WEFT_UDP_H
#define WEFT_UDP_H

#include "core.h"

/* The runtime's side: the pool at create, freed at destroy. */
void weft__udp_init(weft_rt *rt);
void weft__udp_destroy(weft_rt *rt);

#endif
