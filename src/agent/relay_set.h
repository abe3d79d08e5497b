/*
 * relay_set: sockets watched by a private epoll instance instead of the
 * event base, handed to their owner at most `burst` at a time.
 *
 * Why: the openai backend's relaying streams (up to --slots of them) were
 * level-triggered events on the agent's base, served AGENT_RELAY_BURST
 * callbacks at a time so that new work is looked at between bursts. Every
 * look was an epoll_wait that returned (and the kernel polled again) every
 * socket still readable: at 1,000 paced streams that re-reporting was 45 %
 * of the agent's CPU. Here the base watches one descriptor, the set's
 * epoll instance, at the caller's priority; each time it is readable one
 * epoll_wait takes at most `burst` ready sockets, and only those are
 * polled. The set is level-triggered too: a socket its owner left readable
 * comes back in a later burst (the kernel moves a reported socket to the
 * end of the ready list, so bursts go round the streams).
 *
 * Linux only (epoll), like the agent's eventfd. Loop thread only.
 */
#ifndef AGENT_RELAY_SET_H
#define AGENT_RELAY_SET_H

#include <stdbool.h>

#include <event2/event.h>

/* One ready socket: fd and what it is ready for (EV_READ, EV_WRITE; an
 * error or hang-up reports both of those it was watched for). */
typedef struct {
    int fd;
    short what;
} relay_ready;

/* Called with the n (1..burst) sockets one look found ready. It may watch
 * and unwatch sockets, these included: an entry unwatched (or its number
 * reused) by an earlier one's handling is still in r, for the callback to
 * skip (relay_set_has) or to bear a spurious readiness. */
typedef void (*relay_set_fn)(void *arg, const relay_ready *r, int n);

typedef struct relay_set relay_set;

/* A set on evb whose readiness runs at priority pri. NULL on failure
 * (epoll_create1 or memory; errno says which). */
relay_set *relay_set_new(struct event_base *evb, int pri, int burst, relay_set_fn fn, void *arg);
/* Watch fd for what (EV_READ and/or EV_WRITE), or change what it is
 * watched for. 0, or -1 with errno (epoll_ctl's, ENOMEM, or EINVAL);
 * after -1 fd is not watched. */
int relay_set_watch(relay_set *rs, int fd, short what);
/* Stop watching fd; nothing when it is not watched. Call it before fd is
 * closed: a closed descriptor leaves the kernel's set by itself only when
 * no other descriptor (dup, fork) holds its file, and the set would still
 * count it. One the kernel still reports unwatched is taken out then. */
void relay_set_unwatch(relay_set *rs, int fd);
/* Whether fd is watched here. */
bool relay_set_has(const relay_set *rs, int fd);
/* Sockets watched. */
int relay_set_count(const relay_set *rs);
void relay_set_free(relay_set *rs);

#endif
