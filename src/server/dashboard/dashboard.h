/*
 * dashboard: the operator's live web page and its event stream
 * (docs/operations.md "Dashboard").
 *
 *   GET /                     302 to /dashboard (a browser opening the address)
 *   GET /dashboard            the page (HTML); /dashboard/app.js, /dashboard/app.css
 *                             its script and style. Static files embedded in the
 *                             binary at build time (cmake/Embed.cmake): no CDN, no
 *                             build step that needs a network. Public like /health:
 *                             they hold no data; every figure comes from the admin
 *                             API with the admin key the page asks for (kept in the
 *                             tab's sessionStorage, sent as a Bearer header).
 *   GET /admin/events         admin key. Server-sent events: `snapshot` at once and
 *                             then every second (gps_admin_snapshot: status,
 *                             agents, per-minute history), `: keepalive` comments
 *                             never needed (a snapshot a second). A client whose
 *                             unsent output passes 1 MiB skips snapshots until it
 *                             drains; at most 64 streams (then 503).
 *
 * The page reads the stream with fetch() (EventSource cannot send an
 * Authorization header) and reconnects with backoff; it fetches the recent
 * jobs (GET /admin/jobs?limit=20) when requests_total moves, and wires
 * drain/undrain and key create/revoke to the admin API.
 */
#ifndef GPS_DASHBOARD_H
#define GPS_DASHBOARD_H

#include <event2/event.h>

#include "server/admin_api.h"
#include "server/http/http.h"

typedef struct gps_dashboard gps_dashboard;

/* admin is borrowed and must outlive the dashboard. NULL on ENOMEM. */
gps_dashboard *gps_dashboard_new(struct event_base *base, gps_admin *admin);
/* End every open event stream (shutdown: they would never end by
 * themselves, and new ones are refused by the http layer from then on). */
void gps_dashboard_close_streams(gps_dashboard *d);
/* Ends every open event stream. Before gps_http_free. NULL is a no-op. */
void gps_dashboard_free(gps_dashboard *d);
/* Add the routes above. 0 or -1. */
int gps_dashboard_register(gps_http *h, gps_dashboard *d);

/* Open event streams (for tests and /metrics). */
size_t gps_dashboard_streams(const gps_dashboard *d);

#endif
