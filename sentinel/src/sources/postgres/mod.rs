//! Backlog from the Airflow metadata database: one `GROUP BY queue` over `task_instance` per
//! refresh, for all queues at once — the cheap path at scale. The same query counts tasks,
//! sums their `pool_slots` and finds the oldest `queued_dttm`.
//!
//! Executor callbacks (Airflow 3.3 with edge3 5.x) are Edge jobs, not task instances: the same
//! query adds the queued and running ones from the provider's `edge_job` table, each one task
//! of one slot (see [`airflow::edge_callback_jobs`]). A role that may not read `edge_job`, or a
//! database without it, gets the task instances alone, and the log says so once per connection.
//!
//! Give the Sentinel a read-only role (`GRANT SELECT ON task_instance, edge_job, edge_worker`).
//! The connection is opened lazily and reopened on the next refresh after any failure; the
//! statement is prepared once per connection, so each refresh is a single round trip.

pub mod connection_url;
mod tls;

use crate::config::file::PostgresOptions;
use crate::sources::{BacklogSource, QueueBacklog, QueueOutcome};
use airflow::edge_worker_list::{ListedEdgeWorker, ReportedSysInfo};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use prometheus::IntCounter;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tls::{postgres_tls, PostgresTls};
use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

/// Tasks and task slots queued and running, and how long the oldest queued task has waited
/// (measured on the database's clock, so the Sentinel's clock does not matter), for the given
/// queues only. Queues with no such task instance return no row: their counts are a true 0.
const BACKLOG_SQL: &str = "SELECT queue, \
     count(*) FILTER (WHERE state = 'queued'), \
     count(*) FILTER (WHERE state = 'running'), \
     coalesce(sum(greatest(pool_slots, 1)) FILTER (WHERE state = 'queued'), 0)::bigint, \
     coalesce(sum(greatest(pool_slots, 1)) FILTER (WHERE state = 'running'), 0)::bigint, \
     extract(epoch FROM now() - min(queued_dttm) FILTER (WHERE state = 'queued'))::float8 \
     FROM task_instance \
     WHERE state IN ('queued', 'running') AND queue = ANY($1::text[]) \
     GROUP BY queue";

/// [`BACKLOG_SQL`] with the executor callbacks on the same queues: `edge_job` rows with the
/// whole identity the Edge executor gives a callback, one slot each.
const BACKLOG_WITH_CALLBACKS_SQL: &str = "SELECT queue, \
     count(*) FILTER (WHERE state = 'queued'), \
     count(*) FILTER (WHERE state = 'running'), \
     coalesce(sum(slots) FILTER (WHERE state = 'queued'), 0)::bigint, \
     coalesce(sum(slots) FILTER (WHERE state = 'running'), 0)::bigint, \
     extract(epoch FROM now() - min(queued_dttm) FILTER (WHERE state = 'queued'))::float8 \
     FROM ( \
       SELECT queue, state, greatest(pool_slots, 1) AS slots, queued_dttm \
       FROM task_instance \
       WHERE state IN ('queued', 'running') AND queue = ANY($1::text[]) \
       UNION ALL \
       SELECT queue, state, 1, queued_dttm \
       FROM edge_job \
       WHERE dag_id = 'ExecuteCallback' AND run_id = 'ExecuteCallback-' || task_id \
         AND try_number = 0 AND map_index = -1 \
         AND state IN ('queued', 'running') AND queue = ANY($1::text[]) \
     ) AS backlog \
     GROUP BY queue";

/// Whether this role may read the provider's `edge_job` table (NULL: there is no such table).
const EDGE_JOB_READABLE_SQL: &str = "SELECT CASE WHEN to_regclass('edge_job') IS NULL THEN NULL \
     ELSE has_table_privilege('edge_job', 'SELECT') END";

/// Task instances held in `scheduled` on the given queues (queues with none return no row).
const HELD_SQL: &str = "SELECT queue, count(*) \
     FROM task_instance \
     WHERE state = 'scheduled' AND queue = ANY($1::text[]) \
     GROUP BY queue";

/// Task slots of the running task instances of the given queues, by the worker running them.
const RUNNING_SLOTS_SQL: &str = "SELECT hostname, sum(pool_slots)::bigint \
     FROM task_instance \
     WHERE state = 'running' AND queue = ANY($1::text[]) AND hostname <> '' \
     GROUP BY hostname";

/// Airflow's Edge workers (the edge3 provider's table; `queues` holds a Python list literal),
/// with `first_online` as the REST API writes it (RFC 3339, UTC, microseconds) and `sysinfo`
/// (what the worker reports of itself, a JSON column) as text.
const EDGE_WORKERS_SQL: &str = "SELECT worker_name, state, queues, \
     to_char(first_online AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
     sysinfo::text \
     FROM edge_worker";

/// The first task each of the given hosts started on the given queues since a moment, as
/// seconds since the epoch (the bound on `start_date` keeps the scan to recent task instances).
const FIRST_STARTS_SQL: &str = "SELECT hostname, extract(epoch FROM min(start_date))::float8 \
     FROM task_instance \
     WHERE queue = ANY($1::text[]) AND hostname = ANY($2::text[]) \
       AND start_date >= to_timestamp($3::float8) \
     GROUP BY hostname";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A query that takes longer is abandoned and its connection dropped (the next refresh
/// reconnects): a wedged connection must not hold every queue's value back.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct PostgresSource {
    config: tokio_postgres::Config,
    tls: PostgresTls,
    connection: Mutex<Option<Connection>>,
    /// Counts every query sent (the backlog query; connection set-up is not counted).
    queries: IntCounter,
}

struct Connection {
    client: Client,
    /// The backlog query: with the executor callbacks when `edge_job` can be read.
    statement: Statement,
    running_slots: Statement,
    held: Statement,
    /// An error when a column it reads cannot be (a role granted only the backlog's columns):
    /// only the cold starts' last phase is then unknown, never the backlog.
    first_starts: Result<Statement, String>,
    /// An error when the edge3 provider's table is missing: only that question fails.
    edge_workers: Result<Statement, String>,
}

impl PostgresSource {
    pub fn new(
        mut config: tokio_postgres::Config,
        options: &PostgresOptions,
        queries: IntCounter,
    ) -> Result<Self, String> {
        let tls = postgres_tls(options)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("astro-sentinel");
        }
        config.keepalives(true);
        if let PostgresTls::Rustls { mode, .. } = &tls {
            config.ssl_mode(*mode);
        } else {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        }
        Ok(PostgresSource {
            config,
            tls,
            connection: Mutex::new(None),
            queries,
        })
    }

    async fn connect(&self) -> Result<Connection, String> {
        let client = match &self.tls {
            PostgresTls::Plain => {
                let (client, conn) = self
                    .config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(describe)?;
                tokio::spawn(drive(conn));
                client
            }
            PostgresTls::Rustls { connector, .. } => {
                let (client, conn) = self
                    .config
                    .connect(connector.clone())
                    .await
                    .map_err(describe)?;
                tokio::spawn(drive(conn));
                client
            }
        };
        let edge_job_readable: Option<bool> = client
            .query_one(EDGE_JOB_READABLE_SQL, &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(describe)?;
        let statement = if edge_job_readable == Some(true) {
            client
                .prepare(BACKLOG_WITH_CALLBACKS_SQL)
                .await
                .map_err(describe)?
        } else {
            let why = match edge_job_readable {
                Some(_) => "this role may not read the table edge_job (GRANT SELECT ON edge_job)",
                None => "the database has no edge_job table (no Edge provider)",
            };
            tracing::warn!("the backlog counts task instances without executor callbacks: {why}");
            client.prepare(BACKLOG_SQL).await.map_err(describe)?
        };
        let running_slots = client.prepare(RUNNING_SLOTS_SQL).await.map_err(describe)?;
        let held = client.prepare(HELD_SQL).await.map_err(describe)?;
        let first_starts = client.prepare(FIRST_STARTS_SQL).await.map_err(describe);
        let edge_workers = client.prepare(EDGE_WORKERS_SQL).await.map_err(describe);
        tracing::info!("connected to the Airflow metadata database");
        Ok(Connection {
            client,
            statement,
            running_slots,
            held,
            first_starts,
            edge_workers,
        })
    }

    /// Runs one of the connection's statements with `queues`, connecting first if needed; a
    /// failed or overlong query drops the connection (the next call reconnects).
    async fn query(
        &self,
        which: fn(&Connection) -> Result<&Statement, String>,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, String> {
        let mut guard = self.connection.lock().await;
        if guard.as_ref().is_none_or(|c| c.client.is_closed()) {
            *guard = None;
            *guard = Some(self.connect().await?);
        }
        let conn = guard.as_ref().expect("connected above");
        let statement = which(conn)?;
        self.queries.inc();
        match tokio::time::timeout(QUERY_TIMEOUT, conn.client.query(statement, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => {
                *guard = None;
                Err(describe(e))
            }
            Err(_) => {
                *guard = None;
                Err(format!(
                    "query took longer than {}",
                    humantime::format_duration(QUERY_TIMEOUT)
                ))
            }
        }
    }

    async fn running_slots(&self, queues: &[String]) -> Result<HashMap<String, u64>, String> {
        let rows = self.query(|c| Ok(&c.running_slots), &[&queues]).await?;
        let mut slots = HashMap::new();
        for row in rows {
            let host: String = row.try_get(0).map_err(describe)?;
            let n: i64 = row.try_get(1).map_err(describe)?;
            slots.insert(host, u64::try_from(n).unwrap_or(0));
        }
        Ok(slots)
    }

    async fn first_starts(
        &self,
        queues: &[String],
        hosts: &[String],
        since: SystemTime,
    ) -> Result<HashMap<String, SystemTime>, String> {
        let since = since
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let rows = self
            .query(
                |c| c.first_starts.as_ref().map_err(Clone::clone),
                &[&queues, &hosts, &since],
            )
            .await?;
        let mut first = HashMap::new();
        for row in rows {
            let host: String = row.try_get(0).map_err(describe)?;
            let at: f64 = row.try_get(1).map_err(describe)?;
            first.insert(host, UNIX_EPOCH + Duration::from_secs_f64(at.max(0.0)));
        }
        Ok(first)
    }

    async fn held(&self, queues: &[String]) -> Result<HashMap<String, u64>, String> {
        let rows = self.query(|c| Ok(&c.held), &[&queues]).await?;
        let mut held: HashMap<String, u64> = queues.iter().map(|q| (q.clone(), 0)).collect();
        for row in rows {
            let queue: String = row.try_get(0).map_err(describe)?;
            let n: i64 = row.try_get(1).map_err(describe)?;
            held.insert(queue, u64::try_from(n).unwrap_or(0));
        }
        Ok(held)
    }

    async fn edge_worker_list(&self) -> Result<Vec<ListedEdgeWorker>, String> {
        let rows = self
            .query(|c| c.edge_workers.as_ref().map_err(Clone::clone), &[])
            .await?;
        rows.iter()
            .map(|row| {
                let queues: Option<String> = row.try_get(2).map_err(describe)?;
                let sysinfo: Option<String> = row.try_get(4).map_err(describe)?;
                Ok(ListedEdgeWorker {
                    worker_name: row.try_get(0).map_err(describe)?,
                    state: row.try_get(1).map_err(describe)?,
                    queues: queues.as_deref().map(python_str_list).transpose()?,
                    first_online: row.try_get(3).map_err(describe)?,
                    sysinfo: sysinfo.as_deref().and_then(ReportedSysInfo::from_json_text),
                })
            })
            .collect()
    }

    async fn backlogs(&self, queues: &[String]) -> Result<HashMap<String, QueueBacklog>, String> {
        let rows = self.query(|c| Ok(&c.statement), &[&queues]).await?;
        let mut backlogs = HashMap::new();
        for row in rows {
            let queue: String = row.try_get(0).map_err(describe)?;
            let count = |i: usize| -> Result<u64, String> {
                let n: i64 = row.try_get(i).map_err(describe)?;
                Ok(u64::try_from(n).unwrap_or(0))
            };
            let oldest: Option<f64> = row.try_get(5).map_err(describe)?;
            backlogs.insert(
                queue,
                QueueBacklog {
                    queued_tasks: count(1)?,
                    running_tasks: count(2)?,
                    queued_slots: count(3)?,
                    running_slots: count(4)?,
                    // A queued_dttm ahead of the database's clock (it should not be) waits 0 s.
                    oldest_queued_age: oldest.map(|s| Duration::from_secs_f64(s.max(0.0))),
                },
            );
        }
        Ok(backlogs)
    }
}

impl BacklogSource for PostgresSource {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn running_slots_by_host<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        self.running_slots(queues).boxed()
    }

    fn first_task_starts<'a>(
        &'a self,
        queues: &'a [String],
        hosts: &'a [String],
        since: SystemTime,
    ) -> BoxFuture<'a, Result<HashMap<String, SystemTime>, String>> {
        async move {
            self.first_starts(queues, hosts, since)
                .await
                .map_err(|e| format!("started task instances: {e}"))
        }
        .boxed()
    }

    fn held_tasks<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        async move {
            self.held(queues)
                .await
                .map_err(|e| format!("scheduled task instances: {e}"))
        }
        .boxed()
    }

    fn edge_workers(&self) -> BoxFuture<'_, Result<Vec<ListedEdgeWorker>, String>> {
        async move {
            self.edge_worker_list()
                .await
                .map_err(|e| format!("Edge workers: {e}"))
        }
        .boxed()
    }

    fn fetch<'a>(&'a self, queues: &'a [String]) -> BoxFuture<'a, Vec<(String, QueueOutcome)>> {
        async move {
            match self.backlogs(queues).await {
                Ok(mut backlogs) => queues
                    .iter()
                    .map(|q| (q.clone(), Ok(backlogs.remove(q).unwrap_or_default())))
                    .collect(),
                // One query for all queues: when it fails, every queue failed.
                Err(e) => queues.iter().map(|q| (q.clone(), Err(e.clone()))).collect(),
            }
        }
        .boxed()
    }
}

/// The provider stores a worker's queues as Python's `str()` of a list of strings
/// (`['default', 'gpu']`); queue names hold no quotes or commas.
fn python_str_list(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("edge_worker.queues is not a list: {text:?}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.strip_prefix('\'')
                .and_then(|i| i.strip_suffix('\''))
                .or_else(|| item.strip_prefix('"').and_then(|i| i.strip_suffix('"')))
                .map(str::to_owned)
                .ok_or_else(|| format!("edge_worker.queues holds a non-string item: {text:?}"))
        })
        .collect()
}

async fn drive<C>(connection: C)
where
    C: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    if let Err(e) = connection.await {
        tracing::warn!(error = %describe(e), "metadata database connection closed");
    }
}

/// tokio-postgres' message plus its cause (its Display alone can be just "db error").
fn describe(e: tokio_postgres::Error) -> String {
    use std::error::Error;
    match e.source() {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::python_str_list;

    #[test]
    fn reads_the_providers_queue_list_literal() {
        assert_eq!(
            python_str_list("['default', 'gpu']").unwrap(),
            vec!["default".to_string(), "gpu".to_string()]
        );
        assert_eq!(python_str_list("[]").unwrap(), Vec::<String>::new());
        assert_eq!(python_str_list("[\"x\"]").unwrap(), vec!["x".to_string()]);
        let err = python_str_list("default").unwrap_err();
        assert!(err.contains("edge_worker.queues"), "{err}");
        assert!(python_str_list("[1, 2]").is_err());
    }
}
