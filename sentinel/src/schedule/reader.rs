//! Reads Airflow's schedule into a [`Plan`]: which unpaused DAGs have tasks on a pre-warming
//! pool's queues, when each runs next, and what its runs needed at their start.
//!
//! Cost, bounded per read (one read per `schedule.readInterval`, a minute by default): the DAG
//! list (`ceil(DAGs / page)` requests), then at most [`CALLS_PER_READ`] calls for the rest: a
//! DAG's task list (re-read every [`TASKS_TTL`]) is one request, learning a DAG's demand is two
//! (its finished runs, their task instances; more pages only for very wide DAGs) and happens
//! when its next run moved (a run was created) or after [`LEARNED_TTL`] ([`GUESS_TTL`] while
//! the demand is a guess from the tasks: no run has finished yet). What does not fit
//! waits for the next read, oldest first. So a steady state of D DAGs costs about
//! `ceil(D / 100) + D / 10 + 2 × (runs created)` requests a minute, at most
//! `ceil(D / 100) + 2 × 40 + extra pages`.
//!
//! A failed call keeps what the previous read learned for that DAG; a DAG never read
//! successfully has no entry (no guessed number). A failed DAG list fails the whole read: the
//! caller keeps the previous plan.

use super::demand::{self, Demand, RUNS_LEARNED};
use super::plan::{Plan, UpcomingRun};
use crate::config::file::WorkerConfig;
use airflow::dag_schedule::{DagTask, ListedDag, RunTaskInstance};
use airflow::rest_api::RestApiClient;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use prometheus::IntCounter;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls (task lists, learnings) one read may make after the DAG list.
pub const CALLS_PER_READ: usize = 40;
/// A DAG's tasks change only with its file: re-read this often.
pub const TASKS_TTL: Duration = Duration::from_secs(600);
/// A DAG's demand is learned again at least this often.
pub const LEARNED_TTL: Duration = Duration::from_secs(600);
/// A demand guessed from the DAG's tasks (no finished run to learn from) is learned again this
/// often: the next run moves when a run is created, before that run has finished, so without
/// this the run under way would teach the following one nothing until [`LEARNED_TTL`].
pub const GUESS_TTL: Duration = Duration::from_secs(30);
/// Pages of task instances read to learn one DAG's demand before giving up on it.
const MAX_TASK_INSTANCE_PAGES: u32 = 5;

/// A DAG's finished runs and their task instances on the asked queues.
#[derive(Debug, Clone, Default)]
pub struct RecentRuns {
    pub run_ids: Vec<String>,
    pub instances: Vec<RunTaskInstance>,
}

/// What the reader asks Airflow; one-line reasons on failure.
pub trait ScheduleSource: Send + Sync + 'static {
    /// Every DAG that is not paused.
    fn unpaused_dags(&self) -> BoxFuture<'_, Result<Vec<ListedDag>, String>>;
    fn dag_tasks<'a>(&'a self, dag: &'a str) -> BoxFuture<'a, Result<Vec<DagTask>, String>>;
    /// The latest [`RUNS_LEARNED`] finished runs of `dag`, and their task instances on `queues`.
    fn recent_runs<'a>(
        &'a self,
        dag: &'a str,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<RecentRuns, String>>;
}

/// The REST API through the client the backlog source uses.
pub struct RestScheduleSource {
    pub client: Arc<RestApiClient>,
    /// Counts requests (the `schedule` line of the upstream request counter).
    pub requests: IntCounter,
}

impl ScheduleSource for RestScheduleSource {
    fn unpaused_dags(&self) -> BoxFuture<'_, Result<Vec<ListedDag>, String>> {
        async move {
            let mut dags = Vec::new();
            loop {
                self.requests.inc();
                let page = self
                    .client
                    .unpaused_dags_page(dags.len() as u64)
                    .await
                    .map_err(|e| format!("DAG list: {e}"))?;
                let got = page.dags.len();
                dags.extend(page.dags);
                if got == 0 || dags.len() as u64 >= page.total_entries {
                    return Ok(dags);
                }
            }
        }
        .boxed()
    }

    fn dag_tasks<'a>(&'a self, dag: &'a str) -> BoxFuture<'a, Result<Vec<DagTask>, String>> {
        async move {
            self.requests.inc();
            self.client
                .dag_tasks(dag)
                .await
                .map_err(|e| format!("tasks of DAG {dag}: {e}"))
        }
        .boxed()
    }

    fn recent_runs<'a>(
        &'a self,
        dag: &'a str,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<RecentRuns, String>> {
        async move {
            self.requests.inc();
            let runs = self
                .client
                .finished_dag_runs(dag, RUNS_LEARNED)
                .await
                .map_err(|e| format!("runs of DAG {dag}: {e}"))?;
            let Some(oldest) = runs
                .iter()
                .map(|r| r.run_after.as_str())
                .min_by_key(|t| demand::parse_time(t))
            else {
                return Ok(RecentRuns::default());
            };
            self.requests.inc();
            let instances = self
                .client
                .run_task_instances(dag, queues, oldest, MAX_TASK_INSTANCE_PAGES)
                .await
                .map_err(|e| format!("task instances of DAG {dag}: {e}"))?
                .ok_or_else(|| {
                    format!(
                        "task instances of DAG {dag}: more than {MAX_TASK_INSTANCE_PAGES} pages"
                    )
                })?;
            Ok(RecentRuns {
                run_ids: runs.into_iter().map(|r| r.dag_run_id).collect(),
                instances,
            })
        }
        .boxed()
    }
}

/// A pre-warming worker: its queues and the slots of one worker (the cap of a guess).
#[derive(Debug, Clone)]
pub struct PoolQueues {
    pub worker: String,
    pub queues: Vec<String>,
    pub sync_slots: u32,
}

impl From<&WorkerConfig> for PoolQueues {
    fn from(w: &WorkerConfig) -> Self {
        PoolQueues {
            worker: w.name.clone(),
            queues: w.queues.clone(),
            sync_slots: w.sync_slots,
        }
    }
}

/// What the reader knows of one DAG between reads.
#[derive(Default)]
struct DagKnowledge {
    tasks: Option<(Vec<DagTask>, Instant)>,
    /// Per worker, learned for the DAG's `next_dagrun_run_after` of that time.
    learned: Option<Learned>,
}

struct Learned {
    by_worker: HashMap<String, Demand>,
    for_next_run: String,
    at: Instant,
}

/// Keeps what earlier reads learned, so a read costs only what changed.
pub struct ScheduleReader {
    source: Arc<dyn ScheduleSource>,
    pools: Vec<PoolQueues>,
    dags: HashMap<String, DagKnowledge>,
}

impl ScheduleReader {
    pub fn new(source: Arc<dyn ScheduleSource>, pools: Vec<PoolQueues>) -> Self {
        ScheduleReader {
            source,
            pools,
            dags: HashMap::new(),
        }
    }

    /// One read; `Err` only when the DAG list could not be read.
    pub async fn read(&mut self, now: Instant) -> Result<Plan, String> {
        let listed = self.source.unpaused_dags().await?;
        // A DAG paused (or gone) since is forgotten: it would not run.
        let listed: Vec<ListedDag> = listed.into_iter().filter(|d| !d.is_paused).collect();
        let names: HashSet<&str> = listed.iter().map(|d| d.dag_id.as_str()).collect();
        self.dags.retain(|dag, _| names.contains(dag.as_str()));
        let mut calls = CALLS_PER_READ;
        self.read_tasks(&listed, now, &mut calls).await;
        self.learn(&listed, now, &mut calls).await;
        Ok(self.plan(&listed))
    }

    /// Task lists missing or older than [`TASKS_TTL`], never-read first, then oldest.
    async fn read_tasks(&mut self, listed: &[ListedDag], now: Instant, calls: &mut usize) {
        let mut due: Vec<(Option<Instant>, &str)> = listed
            .iter()
            .map(|d| {
                let read_at = self
                    .dags
                    .get(&d.dag_id)
                    .and_then(|k| k.tasks.as_ref().map(|(_, at)| *at));
                (read_at, d.dag_id.as_str())
            })
            .filter(|(at, _)| at.is_none_or(|at| now.saturating_duration_since(at) >= TASKS_TTL))
            .collect();
        due.sort();
        for (_, dag) in due {
            if *calls == 0 {
                return;
            }
            *calls -= 1;
            match self.source.dag_tasks(dag).await {
                Ok(tasks) => {
                    self.dags.entry(dag.to_owned()).or_default().tasks = Some((tasks, now))
                }
                Err(error) => {
                    tracing::warn!(%error, "schedule: keeping what was known of the DAG's tasks")
                }
            }
        }
    }

    /// Demand for DAGs with a next run and tasks on a pool's queues, where the next run moved
    /// since it was learned (or it is older than [`LEARNED_TTL`]).
    async fn learn(&mut self, listed: &[ListedDag], now: Instant, calls: &mut usize) {
        for dag in listed {
            let Some(next) = &dag.next_dagrun_run_after else {
                continue;
            };
            let Some(knowledge) = self.dags.get(&dag.dag_id) else {
                continue;
            };
            let Some((tasks, _)) = &knowledge.tasks else {
                continue;
            };
            let pools: Vec<&PoolQueues> = self
                .pools
                .iter()
                .filter(|p| uses(tasks, &p.queues))
                .collect();
            if pools.is_empty() {
                continue;
            }
            let fresh = knowledge.learned.as_ref().is_some_and(|l| {
                let guessed = l
                    .by_worker
                    .values()
                    .any(|d| matches!(d.basis, demand::Basis::Declared { .. }));
                let ttl = if guessed { GUESS_TTL } else { LEARNED_TTL };
                &l.for_next_run == next && now.saturating_duration_since(l.at) < ttl
            });
            if fresh || *calls < 2 {
                continue;
            }
            *calls -= 2;
            let mut queues: Vec<String> = pools
                .iter()
                .flat_map(|p| p.queues.iter().cloned())
                .collect();
            queues.sort();
            queues.dedup();
            match self.source.recent_runs(&dag.dag_id, &queues).await {
                Ok(recent) => {
                    let by_worker = pools
                        .iter()
                        .map(|p| {
                            let on: HashSet<&str> = p.queues.iter().map(String::as_str).collect();
                            let d = demand::learned(&recent.run_ids, &recent.instances, &on)
                                .unwrap_or_else(|| demand::declared(tasks, &on, p.sync_slots));
                            (p.worker.clone(), d)
                        })
                        .collect();
                    let learned = Learned {
                        by_worker,
                        for_next_run: next.clone(),
                        at: now,
                    };
                    if let Some(k) = self.dags.get_mut(&dag.dag_id) {
                        k.learned = Some(learned);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "schedule: keeping what was learned of the DAG's runs")
                }
            }
        }
    }

    fn plan(&self, listed: &[ListedDag]) -> Plan {
        let mut plan = Plan::default();
        for dag in listed {
            let Some(run_after) = dag
                .next_dagrun_run_after
                .as_deref()
                .and_then(demand::parse_time)
            else {
                continue;
            };
            let Some(learned) = self.dags.get(&dag.dag_id).and_then(|k| k.learned.as_ref()) else {
                continue;
            };
            for (worker, demand) in &learned.by_worker {
                if demand.slots == 0 {
                    continue;
                }
                plan.runs
                    .entry(worker.clone())
                    .or_default()
                    .push(UpcomingRun {
                        dag: dag.dag_id.clone(),
                        run_after,
                        demand: *demand,
                    });
            }
        }
        plan
    }
}

/// Whether any of `tasks` runs on one of `queues`.
fn uses(tasks: &[DagTask], queues: &[String]) -> bool {
    tasks.iter().any(|t| {
        queues
            .iter()
            .any(|q| q == t.queue.as_deref().unwrap_or(demand::DEFAULT_QUEUE))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Airflow as the reader sees it; each call can be made to fail.
    #[derive(Default)]
    struct FakeAirflow {
        dags: Mutex<Vec<ListedDag>>,
        tasks: Mutex<HashMap<String, Vec<DagTask>>>,
        runs: Mutex<HashMap<String, RecentRuns>>,
        failing: Mutex<HashSet<&'static str>>,
        calls: Mutex<Vec<String>>,
    }

    impl FakeAirflow {
        fn answer<T: Clone>(
            &self,
            call: &'static str,
            what: String,
            value: Option<T>,
        ) -> Result<T, String> {
            self.calls.lock().unwrap().push(what);
            if self.failing.lock().unwrap().contains(call) {
                return Err(format!("{call}: HTTP 503"));
            }
            value.ok_or_else(|| format!("{call}: HTTP 404"))
        }
        fn fail(&self, call: &'static str, failing: bool) {
            let mut f = self.failing.lock().unwrap();
            if failing {
                f.insert(call);
            } else {
                f.remove(call);
            }
        }
    }

    impl ScheduleSource for FakeAirflow {
        fn unpaused_dags(&self) -> BoxFuture<'_, Result<Vec<ListedDag>, String>> {
            let dags = self.dags.lock().unwrap().clone();
            std::future::ready(self.answer("dags", "dags".into(), Some(dags))).boxed()
        }
        fn dag_tasks<'a>(&'a self, dag: &'a str) -> BoxFuture<'a, Result<Vec<DagTask>, String>> {
            let tasks = self.tasks.lock().unwrap().get(dag).cloned();
            std::future::ready(self.answer("tasks", format!("tasks {dag}"), tasks)).boxed()
        }
        fn recent_runs<'a>(
            &'a self,
            dag: &'a str,
            _: &'a [String],
        ) -> BoxFuture<'a, Result<RecentRuns, String>> {
            let runs = Some(
                self.runs
                    .lock()
                    .unwrap()
                    .get(dag)
                    .cloned()
                    .unwrap_or_default(),
            );
            std::future::ready(self.answer("runs", format!("runs {dag}"), runs)).boxed()
        }
    }

    fn dag(id: &str, next: &str, paused: bool) -> ListedDag {
        ListedDag {
            dag_id: id.into(),
            is_paused: paused,
            next_dagrun_run_after: Some(next.into()),
        }
    }

    fn task(queue: &str, slots: f64) -> DagTask {
        DagTask {
            task_id: Some("t".into()),
            queue: Some(queue.into()),
            pool_slots: Some(slots),
        }
    }

    fn setup() -> (Arc<FakeAirflow>, ScheduleReader) {
        let airflow = Arc::new(FakeAirflow::default());
        airflow.dags.lock().unwrap().extend([
            dag("etl", "2026-01-01T05:00:00Z", false),
            dag("elsewhere", "2026-01-01T05:00:00Z", false),
        ]);
        airflow.tasks.lock().unwrap().extend([
            ("etl".to_string(), vec![task("q", 2.0), task("q", 1.0)]),
            ("elsewhere".to_string(), vec![task("other", 1.0)]),
        ]);
        let pools = vec![PoolQueues {
            worker: "w".into(),
            queues: vec!["q".into()],
            sync_slots: 16,
        }];
        let reader = ScheduleReader::new(airflow.clone(), pools);
        (airflow, reader)
    }

    /// DAG `etl` has run once, its one task on `q` taking 6 slots (`ended`: when it ended).
    fn one_run_of_6_slots(airflow: &FakeAirflow, ended: Option<&str>) {
        airflow.runs.lock().unwrap().insert(
            "etl".into(),
            RecentRuns {
                run_ids: vec!["r1".into()],
                instances: vec![RunTaskInstance {
                    dag_run_id: "r1".into(),
                    queue: Some("q".into()),
                    pool_slots: 6,
                    queued_when: Some("2026-01-01T04:00:01Z".into()),
                    start_date: None,
                    end_date: ended.map(str::to_string),
                }],
            },
        );
    }

    fn slots(plan: &Plan) -> Vec<(String, u64)> {
        plan.for_worker("w")
            .iter()
            .map(|r| (r.dag.clone(), r.demand.slots))
            .collect()
    }

    #[tokio::test]
    async fn a_dag_on_the_pool_queues_is_planned_with_its_declared_slots_until_it_has_run() {
        let (airflow, mut reader) = setup();
        let plan = reader.read(Instant::now()).await.unwrap();
        assert_eq!(slots(&plan), vec![("etl".to_string(), 3)]);
        // A DAG on other queues costs its task list, never a learning.
        assert!(!airflow
            .calls
            .lock()
            .unwrap()
            .contains(&"runs elsewhere".to_string()));
        let run = plan.for_worker("w")[0].clone();
        assert_eq!(
            run.run_after,
            demand::parse_time("2026-01-01T05:00:00Z").unwrap()
        );
    }

    #[tokio::test]
    async fn a_paused_dag_does_not_count() {
        let (airflow, mut reader) = setup();
        airflow.dags.lock().unwrap()[0].is_paused = true;
        assert!(slots(&reader.read(Instant::now()).await.unwrap()).is_empty());
    }

    #[tokio::test]
    async fn a_failed_dag_list_fails_the_read_and_a_failed_learning_keeps_the_last_value() {
        let (airflow, mut reader) = setup();
        airflow.fail("dags", true);
        assert!(reader.read(Instant::now()).await.is_err());
        airflow.fail("dags", false);
        // Never learned and the learning fails: no entry, not a guess.
        airflow.fail("runs", true);
        assert!(slots(&reader.read(Instant::now()).await.unwrap()).is_empty());
        airflow.fail("runs", false);
        assert_eq!(
            slots(&reader.read(Instant::now()).await.unwrap()),
            vec![("etl".to_string(), 3)]
        );
        // The next run moved (a run was created): learning again fails, the last value stays.
        airflow.dags.lock().unwrap()[0].next_dagrun_run_after = Some("2026-01-01T06:00:00Z".into());
        airflow.fail("runs", true);
        airflow.fail("tasks", true);
        let plan = reader.read(Instant::now() + TASKS_TTL).await.unwrap();
        assert_eq!(slots(&plan), vec![("etl".to_string(), 3)]);
    }

    #[tokio::test]
    async fn learning_happens_again_only_when_the_next_run_moves() {
        let (airflow, mut reader) = setup();
        let t0 = Instant::now();
        reader.read(t0).await.unwrap();
        reader.read(t0).await.unwrap();
        let learnings = |a: &FakeAirflow| {
            a.calls
                .lock()
                .unwrap()
                .iter()
                .filter(|c| *c == "runs etl")
                .count()
        };
        assert_eq!(learnings(&airflow), 1);
        one_run_of_6_slots(&airflow, None);
        airflow.dags.lock().unwrap()[0].next_dagrun_run_after = Some("2026-01-01T06:00:00Z".into());
        let plan = reader.read(t0).await.unwrap();
        assert_eq!(learnings(&airflow), 2);
        assert_eq!(slots(&plan), vec![("etl".to_string(), 6)]);
    }

    #[tokio::test]
    async fn a_guess_is_learned_again_once_a_run_has_finished() {
        let (airflow, mut reader) = setup();
        let t0 = Instant::now();
        assert_eq!(
            slots(&reader.read(t0).await.unwrap()),
            vec![("etl".to_string(), 3)]
        );
        // The run under way finishes; the next run has not moved.
        one_run_of_6_slots(&airflow, Some("2026-01-01T04:00:09Z"));
        let within = reader.read(t0 + GUESS_TTL / 2).await.unwrap();
        assert_eq!(
            slots(&within),
            vec![("etl".to_string(), 3)],
            "kept within GUESS_TTL"
        );
        let after = reader.read(t0 + GUESS_TTL).await.unwrap();
        assert_eq!(slots(&after), vec![("etl".to_string(), 6)]);
        // Learned from a run now: kept until LEARNED_TTL.
        let calls = airflow.calls.lock().unwrap().len();
        reader.read(t0 + GUESS_TTL * 3).await.unwrap();
        assert!(!airflow.calls.lock().unwrap()[calls..].contains(&"runs etl".to_string()));
    }
}
