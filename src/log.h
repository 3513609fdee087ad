/*
 * log.h, log.c - weft's messages: every line weft writes goes through
 * weft__log to the runtime's log function (weft_config.log_fn) or to
 * stderr, filtered by its level; and naming a code address for a person
 * (stall reports).
 */
#ifndef WEFT_LOG_H
#define WEFT_LOG_H

#include "core.h"

struct weft__log {
  weft_log_fn fn; /* NULL: stderr */
  void *ctx;
  int level; /* the least severe level passed on */
};

/* The configuration's choice, resolved (log_level 0: WEFT_LOG, else the
 * default). */
void weft__log_init(struct weft__log *lg, const weft_config *c);
/* Formats one message and passes it on if its level is let through. */
void weft__log(weft_rt *rt, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "name+0x12 (object+0x3456)", "object+0x3456", or the bare address, in
 * buf: the nearest dynamic symbol, if any, and the loaded object. */
const char *weft__addr_name(const void *addr, char *buf, size_t len);

#endif
