//! The paths the HTTP port answers, parsed once per request into a [`Route`].
//!
//! | path                  | auth | answer                                                     |
//! | --------------------- | ---- | ---------------------------------------------------------- |
//! | `GET /v1/workers/{n}` | yes  | 200 backlog JSON; 404 unknown; 503 stale / not loaded yet  |
//! | `GET /v1/workers`     | yes  | 200 `{"workers": [...]}`, each with `available`            |
//! | `GET /v1/workers/{n}/history?range=` | yes | 200 scaling history; 400 bad `range`; 404  |
//! | `GET /v1/queues/events?queue=` | agents too | the wake-up stream ([`crate::serve::queue_events`]) |
//! | `GET /metrics`        | no   | Prometheus text format                                     |
//! | `GET /healthz`        | no   | 200 while the process serves                               |
//! | `GET /readyz`         | no   | 200 after the first successful refresh, else 503           |
//! | `GET /ui/…`           | no   | the page ([`crate::serve::ui`]); its calls to `/v1` need auth |

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    Readyz,
    Metrics,
    /// `/v1/…`: answered only to an authenticated caller.
    V1(V1Route<'a>),
    /// `/ui` or anything under `/ui/`; the page's own module knows its files.
    Ui,
    /// No such endpoint.
    Other,
}

/// The routes under `/v1`, which need auth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Route<'a> {
    /// `/v1/workers`
    Workers,
    /// `/v1/workers/{name}`
    Worker(&'a str),
    /// `/v1/workers/{name}/history`
    History(&'a str),
    /// `/v1/queues/events`: the only route an agent's token opens.
    QueueEvents,
}

const WORKERS: &str = "/v1/workers";
const WORKER_PREFIX: &str = "/v1/workers/";
const HISTORY_SUFFIX: &str = "/history";

impl<'a> Route<'a> {
    pub fn parse(path: &'a str) -> Route<'a> {
        match path {
            "/healthz" => Route::Healthz,
            "/readyz" => Route::Readyz,
            "/metrics" => Route::Metrics,
            WORKERS => Route::V1(V1Route::Workers),
            "/v1/queues/events" => Route::V1(V1Route::QueueEvents),
            "/ui" => Route::Ui,
            _ if path.starts_with("/ui/") => Route::Ui,
            _ => match path.strip_prefix(WORKER_PREFIX) {
                // A name may hold anything, even a slash: an unknown one is a 404 of its own.
                Some(rest) => match rest.strip_suffix(HISTORY_SUFFIX) {
                    Some(name) => Route::V1(V1Route::History(name)),
                    None => Route::V1(V1Route::Worker(rest)),
                },
                None => Route::Other,
            },
        }
    }

    /// The `handler` label of `astro_sentinel_http_requests_total`.
    pub fn handler(self) -> &'static str {
        match self {
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Metrics => "metrics",
            Route::V1(V1Route::Workers) => "workers",
            Route::V1(V1Route::Worker(_)) => "worker",
            Route::V1(V1Route::History(_)) => "history",
            Route::V1(V1Route::QueueEvents) => "queue_events",
            Route::Ui => "ui",
            Route::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_has_one_route() {
        for (path, route) in [
            ("/healthz", Route::Healthz),
            ("/readyz", Route::Readyz),
            ("/metrics", Route::Metrics),
            ("/v1/workers", Route::V1(V1Route::Workers)),
            ("/v1/queues/events", Route::V1(V1Route::QueueEvents)),
            ("/v1/queues", Route::Other),
            ("/v1/workers/", Route::V1(V1Route::Worker(""))),
            ("/v1/workers/a", Route::V1(V1Route::Worker("a"))),
            ("/v1/workers/history", Route::V1(V1Route::Worker("history"))),
            ("/v1/workers/a/history", Route::V1(V1Route::History("a"))),
            ("/v1/workers//history", Route::V1(V1Route::History(""))),
            ("/ui", Route::Ui),
            ("/ui/", Route::Ui),
            ("/ui/app.js", Route::Ui),
            ("/uix", Route::Other),
            ("/v1/workersx", Route::Other),
            ("/", Route::Other),
        ] {
            assert_eq!(Route::parse(path), route, "{path}");
        }
    }
}
