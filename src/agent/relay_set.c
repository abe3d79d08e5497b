/* relay_set: see relay_set.h. */
#include "agent/relay_set.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

struct relay_set {
    int epfd;
    struct event *ev; /* epfd on the caller's base */
    int burst;
    relay_set_fn fn;
    void *arg;
    uint8_t *what;    /* by descriptor: EV_READ|EV_WRITE watched, 0 = not in the set */
    int n_what;
    int count;
    struct epoll_event *evs; /* burst of them */
    relay_ready *ready;      /* burst of them */
};

static uint32_t to_epoll(short what)
{
    return ((what & EV_READ) ? EPOLLIN : 0) | ((what & EV_WRITE) ? EPOLLOUT : 0);
}

static void on_ready(evutil_socket_t fd, short ev_what, void *arg)
{
    relay_set *rs = arg;
    (void)fd;
    (void)ev_what;
    int n = epoll_wait(rs->epfd, rs->evs, rs->burst, 0);
    if (n <= 0)
        return; /* EINTR, or what was ready was taken since */
    int k = 0;
    for (int i = 0; i < n; i++) {
        int s = rs->evs[i].data.fd;
        uint32_t e = rs->evs[i].events;
        short watched = s >= 0 && s < rs->n_what ? rs->what[s] : 0;
        if (!watched) {
            /* In the kernel's set but not in ours (a failed change, or a
             * descriptor closed while its file stayed open elsewhere):
             * level-triggered, it would keep the set readable and the
             * loop from sleeping. */
            epoll_ctl(rs->epfd, EPOLL_CTL_DEL, s, NULL);
            continue;
        }
        short w = 0;
        if (e & (EPOLLIN | EPOLLERR | EPOLLHUP))
            w |= EV_READ;
        if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            w |= EV_WRITE;
        /* An error or hang-up is reported whatever was asked for: hand on
         * only what the owner watches (libevent does the same). */
        w &= watched;
        if (w) {
            rs->ready[k].fd = s;
            rs->ready[k].what = w;
            k++;
        }
    }
    if (k > 0)
        rs->fn(rs->arg, rs->ready, k);
}

relay_set *relay_set_new(struct event_base *evb, int pri, int burst, relay_set_fn fn, void *arg)
{
    relay_set *rs = calloc(1, sizeof *rs);
    if (!rs)
        return NULL;
    rs->epfd = epoll_create1(EPOLL_CLOEXEC);
    rs->burst = burst > 0 ? burst : 1;
    rs->fn = fn;
    rs->arg = arg;
    rs->evs = calloc((size_t)rs->burst, sizeof *rs->evs);
    rs->ready = calloc((size_t)rs->burst, sizeof *rs->ready);
    if (rs->epfd < 0 || !rs->evs || !rs->ready)
        goto fail;
    rs->ev = event_new(evb, rs->epfd, EV_READ | EV_PERSIST, on_ready, rs);
    if (!rs->ev || event_priority_set(rs->ev, pri) != 0 || event_add(rs->ev, NULL) != 0) {
        errno = ENOMEM;
        goto fail;
    }
    return rs;
fail:;
    int e = errno;
    relay_set_free(rs);
    errno = e;
    return NULL;
}

static bool fit(relay_set *rs, int fd)
{
    if (fd < rs->n_what)
        return true;
    int n = rs->n_what ? rs->n_what : 64;
    while (n <= fd)
        n *= 2;
    uint8_t *t = realloc(rs->what, (size_t)n);
    if (!t)
        return false;
    memset(t + rs->n_what, 0, (size_t)(n - rs->n_what));
    rs->what = t;
    rs->n_what = n;
    return true;
}

int relay_set_watch(relay_set *rs, int fd, short what)
{
    what &= EV_READ | EV_WRITE;
    if (!rs || fd < 0 || !what) {
        errno = EINVAL;
        return -1;
    }
    if (!fit(rs, fd)) {
        errno = ENOMEM;
        return -1;
    }
    /* An unchanged mask is changed all the same (MOD): a descriptor closed
     * without an unwatch and reused must enter the kernel's set again. */
    struct epoll_event e = {.events = to_epoll(what), .data.fd = fd};
    int op = rs->what[fd] ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    int rc = epoll_ctl(rs->epfd, op, fd, &e);
    /* A descriptor closed without an unwatch left the kernel's set (MOD:
     * ENOENT), or one the set lost count of is still in it (ADD: EEXIST). */
    if (rc < 0 && op == EPOLL_CTL_MOD && errno == ENOENT)
        rc = epoll_ctl(rs->epfd, EPOLL_CTL_ADD, fd, &e);
    else if (rc < 0 && op == EPOLL_CTL_ADD && errno == EEXIST)
        rc = epoll_ctl(rs->epfd, EPOLL_CTL_MOD, fd, &e);
    if (rc < 0) {
        if (rs->what[fd]) {
            int e = errno;
            epoll_ctl(rs->epfd, EPOLL_CTL_DEL, fd, NULL); /* not half in */
            errno = e;
            rs->what[fd] = 0;
            rs->count--;
        }
        return -1;
    }
    if (!rs->what[fd])
        rs->count++;
    rs->what[fd] = (uint8_t)what;
    return 0;
}

void relay_set_unwatch(relay_set *rs, int fd)
{
    if (!relay_set_has(rs, fd))
        return;
    epoll_ctl(rs->epfd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT/EBADF: already gone */
    rs->what[fd] = 0;
    rs->count--;
}

bool relay_set_has(const relay_set *rs, int fd)
{
    return rs && fd >= 0 && fd < rs->n_what && rs->what[fd];
}

int relay_set_count(const relay_set *rs)
{
    return rs ? rs->count : 0;
}

void relay_set_free(relay_set *rs)
{
    if (!rs)
        return;
    if (rs->ev)
        event_free(rs->ev);
    if (rs->epfd >= 0)
        close(rs->epfd);
    free(rs->what);
    free(rs->evs);
    free(rs->ready);
    free(rs);
}
