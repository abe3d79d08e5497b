/*
 * timer: a periodic libevent timer in one call, for the server's modules
 * that tick (the cluster's heartbeat and re-reads, the hand-off's claims
 * and follows).
 */
#ifndef GPS_TIMER_H
#define GPS_TIMER_H

#include <event2/event.h>

/* A persistent timer on base that runs fn(arg) every ms milliseconds,
 * already added. NULL when it could not be made or added. Free it with
 * event_free. */
struct event *gps_timer_every(struct event_base *base, int ms, event_callback_fn fn, void *arg);

#endif
