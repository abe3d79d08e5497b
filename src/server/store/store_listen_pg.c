/*
 * store_listen_pg.c: the store's listeners (store.h, gps_store_listen) on
 * libpq. One PostgreSQL connection per store (the hub), never used for
 * statements, that LISTENs to the channels of every listener of the store
 * and hands each notification to those that listen to its channel (issue
 * 28: the hand-off and the native tasks once held a connection each). It
 * runs on the loop thread without ever blocking it: libpq in non-blocking
 * use (PQconnectStartParams and PQconnectPoll driven by socket events, then
 * one LISTEN query, then PQconsumeInput and PQnotifies whenever the socket
 * is readable).
 *
 * Why not the DB thread's connection: a notification arrives only while
 * the session reads, and the DB thread blocks on its queue, not on the
 * socket; and why not a thread of its own: the notification's work is the
 * loop's (claims, follows), so the loop may as well read it.
 *
 * A connection that breaks (PostgreSQL restarted: it ends every session;
 * a network error) is closed and made again after a backoff (0.1 s,
 * doubling up to 5 s, back to 0.1 s once listening). Each time it listens
 * again every listener hears channel NULL: what was notified meanwhile is
 * lost. A connection silently cut (a host gone, no FIN) is not noticed
 * here; the callers' slow polls cover it.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "common/gp_log.h"
#include "server/store/store_engine.h"

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 5000
#define CONNECT_TIMEOUT_SEC 10 /* PQconnectPoll has none of its own */

/* One listener: its channels and its callback, in its hub's list. */
struct gps_store_listener {
    gps_store__listen_hub *hub;
    char **channels;       /* NULL-terminated copies */
    gps_store_notify_fn fn;
    void *arg;
    gps_store_listener *next;
};

struct gps_store__listen_hub {
    gps_store__listen_hub **slot; /* the store's pointer to this hub, cleared
                                     when the hub goes (NULL once the store
                                     closed: the hub lives on while listeners
                                     are left) */
    gps_store_listener *subs;     /* never empty while the hub lives */
    struct event_base *base;
    char *target;          /* the URI: it may hold a password, never logged */
    char *label;           /* the URI without its password, for logs */
    PGconn *pg;            /* NULL between connections */
    struct event *io;      /* pg's socket, assigned again for each wait (the fd
                              may change while connecting): never freed from
                              its own callback */
    struct event *retry;   /* the next connect */
    int retry_ms;
    bool connecting;       /* PQconnectPoll drives io */
    bool listening;        /* LISTEN answered: notifications flow */
    bool down;             /* lost and not listening again yet (logged once) */
};

typedef gps_store__listen_hub hub;

static void on_io(evutil_socket_t fd, short what, void *arg);
static char *listen_sql(const hub *l);

/* ------------------------------------------------------------------ */
/* Connection life                                                     */
/* ------------------------------------------------------------------ */

/* Close the connection and try again after the backoff. why: libpq's
 * message (may end in a newline). */
static void drop(hub *l, const char *why)
{
    if (!l->down) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", why && *why ? why : "connection closed");
        msg[strcspn(msg, "\n")] = '\0';
        gp_log_write(GP_LOG_WARN, "store_listen_lost", NULL,
                     json_pack("{s:s,s:s}", "db", l->label, "reason", msg),
                     "the database's notifications are not heard: polling only until the "
                     "listener is back");
        l->down = true;
    }
    event_del(l->io);
    if (l->pg)
        PQfinish(l->pg);
    l->pg = NULL;
    l->connecting = l->listening = false;
    struct timeval tv = {l->retry_ms / 1000, (l->retry_ms % 1000) * 1000};
    evtimer_add(l->retry, &tv);
    l->retry_ms = l->retry_ms * 2 < RETRY_MAX_MS ? l->retry_ms * 2 : RETRY_MAX_MS;
}

/* Watch pg's socket for what (EV_READ or EV_WRITE, EV_PERSIST once
 * listening), within timeout_sec when > 0. 0, or -1 (then dropped). */
static int watch(hub *l, short what, int timeout_sec)
{
    event_del(l->io);
    int fd = PQsocket(l->pg);
    struct timeval tv = {timeout_sec, 0};
    if (fd < 0 || event_assign(l->io, l->base, fd, what, on_io, l) != 0 ||
        event_add(l->io, timeout_sec > 0 ? &tv : NULL) != 0) {
        drop(l, "cannot watch the connection's socket");
        return -1;
    }
    return 0;
}

static void connect_start(hub *l)
{
    const char *const keys[] = {"dbname", NULL};
    const char *const vals[] = {l->target, NULL};
    l->pg = PQconnectStartParams(keys, vals, 1);
    if (!l->pg || PQstatus(l->pg) == CONNECTION_BAD) {
        drop(l, l->pg ? PQerrorMessage(l->pg) : "out of memory");
        return;
    }
    l->connecting = true;
    /* libpq's rule: after PQconnectStart, wait until writable. */
    watch(l, EV_WRITE, CONNECT_TIMEOUT_SEC);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    connect_start(arg);
}

/* Connected: send the LISTENs of every listener (blocking mode for that
 * one send: a fresh socket takes a few bytes at once), then read without
 * blocking. */
static void connected(hub *l)
{
    l->connecting = false;
    char *sql = listen_sql(l);
    if (!sql) {
        drop(l, "out of memory");
        return;
    }
    int sent = PQsendQuery(l->pg, sql);
    free(sql);
    if (!sent || PQsetnonblocking(l->pg, 1) != 0) {
        drop(l, PQerrorMessage(l->pg));
        return;
    }
    watch(l, EV_READ | EV_PERSIST, 0);
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

/* The LISTEN query's results, until it is complete. 0, or -1 (dropped). */
static int read_results(hub *l)
{
    while (!l->listening && !PQisBusy(l->pg)) {
        PGresult *res = PQgetResult(l->pg);
        if (!res) {
            /* Listening from now on: whatever was notified before is
             * the caller's to look for. */
            l->listening = true;
            l->retry_ms = RETRY_MIN_MS;
            if (l->down)
                gp_log_write(GP_LOG_INFO, "store_listen_back", NULL,
                             json_pack("{s:s}", "db", l->label),
                             "the database's notifications are heard again");
            l->down = false;
            for (gps_store_listener *sub = l->subs; sub; sub = sub->next)
                sub->fn(sub->arg, NULL, NULL);
            return 0;
        }
        bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        char why[256];
        snprintf(why, sizeof why, "LISTEN failed: %s", PQresultErrorMessage(res));
        PQclear(res);
        if (!ok) {
            drop(l, why);
            return -1;
        }
    }
    return 0;
}

/* One notification to each listener of its channel. */
static void dispatch(hub *l, const char *channel, const char *payload)
{
    for (gps_store_listener *sub = l->subs; sub; sub = sub->next)
        for (char **c = sub->channels; *c; c++)
            if (strcmp(*c, channel) == 0) {
                sub->fn(sub->arg, channel, payload);
                break;
            }
}

static void on_read(hub *l)
{
    if (!PQconsumeInput(l->pg)) {
        drop(l, PQerrorMessage(l->pg));
        return;
    }
    if (read_results(l) != 0)
        return;
    PGnotify *n;
    while ((n = PQnotifies(l->pg))) {
        dispatch(l, n->relname, n->extra);
        PQfreemem(n);
    }
    if (PQstatus(l->pg) == CONNECTION_BAD)
        drop(l, PQerrorMessage(l->pg));
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    hub *l = arg;
    if (!l->connecting) {
        on_read(l);
        return;
    }
    if (what & EV_TIMEOUT) {
        drop(l, "connect timed out");
        return;
    }
    switch (PQconnectPoll(l->pg)) {
    case PGRES_POLLING_READING:
        watch(l, EV_READ, CONNECT_TIMEOUT_SEC);
        break;
    case PGRES_POLLING_WRITING:
        watch(l, EV_WRITE, CONNECT_TIMEOUT_SEC);
        break;
    case PGRES_POLLING_OK:
        connected(l);
        break;
    default:
        drop(l, PQerrorMessage(l->pg));
        break;
    }
}

/* ------------------------------------------------------------------ */
/* Life                                                                */
/* ------------------------------------------------------------------ */

/* "LISTEN a; LISTEN b; " for every listener's channels (new string; a
 * channel twice is harmless), NULL on ENOMEM. */
static char *listen_sql(const hub *l)
{
    size_t len = 1;
    for (const gps_store_listener *sub = l->subs; sub; sub = sub->next)
        for (char **c = sub->channels; *c; c++)
            len += strlen(*c) + 9;
    char *sql = malloc(len);
    if (!sql)
        return NULL;
    sql[0] = '\0';
    for (const gps_store_listener *sub = l->subs; sub; sub = sub->next)
        for (char **c = sub->channels; *c; c++) {
            strcat(sql, "LISTEN ");
            strcat(sql, *c);
            strcat(sql, "; ");
        }
    return sql;
}

static void channels_free(char **channels)
{
    for (size_t i = 0; channels && channels[i]; i++)
        free(channels[i]);
    free(channels);
}

/* Copies of channels (NULL-terminated), NULL on ENOMEM, on none or on a
 * name that is not [a-z0-9_]+: names go into SQL unquoted. */
static char **channels_dup(const char *const *channels)
{
    size_t n = 0;
    while (channels && channels[n]) {
        const char *c = channels[n++];
        if (!*c || strspn(c, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(c))
            return NULL;
    }
    char **out = n ? calloc(n + 1, sizeof *out) : NULL;
    for (size_t i = 0; out && i < n; i++)
        if (!(out[i] = strdup(channels[i]))) {
            channels_free(out);
            return NULL;
        }
    return out;
}

static void hub_free(hub *l)
{
    if (!l)
        return;
    if (l->slot)
        *l->slot = NULL;
    if (l->io)
        event_free(l->io);
    if (l->retry)
        event_free(l->retry);
    if (l->pg)
        PQfinish(l->pg);
    free(l->target);
    free(l->label);
    free(l);
}

/* The store's hub, created (and its connect started) on the first call. */
static hub *hub_get(hub **slot, const char *target, const char *label,
                    struct event_base *base)
{
    if (*slot)
        return *slot;
    hub *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->base = base;
    l->retry_ms = RETRY_MIN_MS;
    l->target = strdup(target);
    l->label = strdup(label ? label : "");
    l->retry = evtimer_new(base, retry_cb, l);
    l->io = event_new(base, -1, 0, on_io, l);
    if (!l->target || !l->label || !l->retry || !l->io) {
        hub_free(l);
        return NULL;
    }
    l->slot = slot;
    *slot = l;
    return l;
}

gps_store_listener *gps_store__listener_new(gps_store__listen_hub **slot, const char *target,
                                            const char *label, struct event_base *base,
                                            const char *const *channels,
                                            gps_store_notify_fn fn, void *arg)
{
    gps_store_listener *sub = calloc(1, sizeof *sub);
    hub *l = NULL;
    if (!sub || !(sub->channels = channels_dup(channels)))
        goto err;
    if (!(l = hub_get(slot, target, label, base)))
        goto err;
    sub->hub = l;
    sub->fn = fn;
    sub->arg = arg;
    sub->next = l->subs;
    l->subs = sub;
    if (!l->subs->next) {
        connect_start(l); /* the first listener */
    } else if (l->pg && !l->connecting) {
        /* The LISTENs were sent without this one's channels: connect
         * again (each listener then hears channel NULL and looks). A
         * connect under way, or a retry waiting, sends them all. */
        event_del(l->io);
        PQfinish(l->pg);
        l->pg = NULL;
        l->listening = false;
        connect_start(l);
    }
    return sub;
err:
    if (sub)
        channels_free(sub->channels);
    free(sub);
    return NULL;
}

void gps_store__listen_detach(gps_store__listen_hub *l)
{
    if (l)
        l->slot = NULL;
}

void gps_store_listener_free(gps_store_listener *sub)
{
    if (!sub)
        return;
    hub *l = sub->hub;
    gps_store_listener **pp = &l->subs;
    while (*pp != sub)
        pp = &(*pp)->next;
    *pp = sub->next;
    channels_free(sub->channels);
    free(sub);
    if (!l->subs)
        hub_free(l); /* the last one: close the connection */
}
