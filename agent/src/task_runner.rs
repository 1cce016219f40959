//! Runs one job from start to report: start the task process, report `running`, ship its log
//! while it runs, give its slots back when the process ends, then ship the last log lines and
//! report `success` or `failed`.
//!
//! An executor callback (`ExecuteCallback`) runs the same way, through the same
//! `execute_workload`, in either launch mode. Its log is the exception: edge3 5.1.0 stores no
//! log for a callback (its log push answers 500: there is no task instance to file it under),
//! so the log is offered once, when the callback has ended, and otherwise stays in the worker's
//! log folder, which the agent says in its own log; the callback's state is reported either way.

use crate::config::LaunchMode;
use crate::context::Context;
use crate::log_shipper::LogShipper;
use crate::metrics::TaskResult;
use crate::reporter::{deliver, Delivery};
use crate::slots::Lease;
use crate::task_host_client::{Exit, RemoteTask};
use crate::task_log_file::TaskLogFile;
use crate::workload;
use airflow::backoff::Backoff;
use airflow::edge_types::{EdgeJob, JobState, TaskKey};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a running task's new log lines are pushed, the first time after one interval:
/// the Python worker's cadence (`job_poll_interval`) without its push at the very start, when
/// the log holds little more than the supervisor's first lines. Each push is a request the
/// api-server serves while it also starts and ends tasks; the last lines go out at the end.
const LOG_PUSH_INTERVAL: Duration = Duration::from_secs(5);
/// Attempts at the last log push before the final state is reported anyway.
const FINAL_LOG_ATTEMPTS: u32 = 5;

/// Runs `job`, holding `slots` while its task process runs. The slots go back as soon as the
/// process has ended, so the next job is fetched while this one's last log lines and final
/// state go out (a slot bounds task processes, and this one is gone).
pub async fn run(ctx: Arc<Context>, job: EdgeJob, slots: Lease) {
    if let Some(reason) = workload::unsupported(&job.command) {
        drop(slots);
        refuse(&ctx, &job, &reason).await;
        return;
    }
    let started = ctx.task_host.start_task(&job).await;
    follow(ctx, job, slots, started).await;
}

/// Fails a job whose workload this worker does not run, without starting a process: the
/// reason goes to the agent's log and to the job's log in Airflow.
async fn refuse(ctx: &Context, job: &EdgeJob, reason: &str) {
    let key = job.key();
    tracing::error!(task = %key, "{reason}: reporting the job failed");
    let mut shipper = LogShipper::new(
        job.log_path()
            .map(|p| TaskLogFile::new(&ctx.config.log_folder, p)),
    );
    shipper.append_note(&format!(
        "astro-agent on {}: {reason}",
        ctx.config.worker_name
    ));
    push_last_logs(ctx, &mut shipper, &key).await;
    report_final_state(ctx, &key, TaskResult::Unsupported).await;
    ctx.metrics
        .task_finished(TaskResult::Unsupported, Duration::ZERO);
    ctx.heartbeat_now.notify_one();
}

/// Follows a task a previous agent started (this agent's container restarted while it ran)
/// to its end, as if this agent had started it.
pub async fn resume(ctx: Arc<Context>, job: EdgeJob, slots: Lease, task: RemoteTask) {
    tracing::info!(task = %job.key(), pid = task.pid(), "taking over a task that was running before this agent started");
    follow(ctx, job, slots, Ok(task)).await;
}

async fn follow(
    ctx: Arc<Context>,
    job: EdgeJob,
    slots: Lease,
    started: Result<RemoteTask, String>,
) {
    let key = job.key();
    let begun = Instant::now();
    ctx.metrics.tasks_started.inc();
    ctx.heartbeat_now.notify_one();
    let log = job
        .log_path()
        .map(|p| TaskLogFile::new(&ctx.config.log_folder, p));
    if log.is_none() {
        tracing::warn!(task = %key, log_path = ?job.command.get("log_path"), "no usable log_path in the job: its log is not shipped");
    }
    let log_path = log.as_ref().map(TaskLogFile::path);
    let mut shipper = LogShipper::new(log);
    let callback = workload::is_callback(&job.command);

    let result = match started {
        Err(e) => {
            tracing::error!(task = %key, error = %e, "could not start the task process");
            shipper.append_note(&format!(
                "astro-agent on {}: could not start the task process (Airflow's supervisor with {}): {e}",
                ctx.config.worker_name,
                ctx.config.python.display()
            ));
            TaskResult::StartFailed
        }
        Ok(task) => supervise(&ctx, task, &key, &slots, &mut shipper, !callback).await,
    };

    drop(slots);

    if callback {
        offer_callback_log(&ctx, &mut shipper, &key, log_path.as_deref()).await;
    } else {
        push_last_logs(&ctx, &mut shipper, &key).await;
    }
    report_final_state(&ctx, &key, result).await;
    ctx.metrics.task_finished(result, begun.elapsed());
    ctx.heartbeat_now.notify_one();
}

/// Watches a started task process until it ends: reports `running` once, pushes its new log
/// lines every [`LOG_PUSH_INTERVAL`] (when `push_while_running`), and on anything but success
/// adds the supervisor's last output to the log, where the task's own lines may not say why it
/// ended.
async fn supervise(
    ctx: &Context,
    mut process: RemoteTask,
    key: &TaskKey,
    slots: &Lease,
    shipper: &mut LogShipper,
    push_while_running: bool,
) -> TaskResult {
    let mode = match process.launched_by() {
        LaunchMode::Prefork => "prefork",
        LaunchMode::Fresh => "fresh",
    };
    ctx.metrics.task_launches.with_label_values(&[mode]).inc();
    tracing::info!(task = %key, pid = process.pid(), mode, slots = slots.count(), "task started");
    let mut report_running = std::pin::pin!(deliver(
        &ctx.edge,
        key,
        JobState::Running,
        &ctx.give_up,
        Backoff::for_airflow()
    ));
    let mut running_reported = false;
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + LOG_PUSH_INTERVAL,
        LOG_PUSH_INTERVAL,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exit = {
        let mut wait = std::pin::pin!(process.wait(&ctx.kill));
        loop {
            tokio::select! {
                exit = &mut wait => break exit,
                _ = &mut report_running, if !running_reported => running_reported = true,
                _ = tick.tick(), if push_while_running => {
                    if let Err(e) = shipper.ship(&ctx.edge, key).await {
                        tracing::warn!(task = %key, error = %e, "log push failed; will retry");
                    }
                }
            }
        }
    };
    if !running_reported {
        report_running.await;
    }
    let (result, how, ended) = match &exit {
        Exit::Finished(e) if e.success() => (TaskResult::Success, String::new(), e),
        Exit::Finished(e) => (TaskResult::Failed, format!("ended with {e}"), e),
        Exit::Killed(e) => (
            TaskResult::Killed,
            format!("was stopped by the agent ({e})"),
            e,
        ),
    };
    if result != TaskResult::Success {
        shipper.append_note(&format!(
            "astro-agent on {}: the task process {how}. Supervisor output (its last lines):\n{}",
            ctx.config.worker_name, ended.output_tail
        ));
    }
    tracing::info!(task = %key, ?exit, "task process ended");
    result
}

/// Reports `success` or `failed` for the job, retrying until Airflow takes it or the agent
/// gives up (`ctx.give_up`); the pending-report gauge covers the wait.
async fn report_final_state(ctx: &Context, key: &TaskKey, result: TaskResult) {
    let final_state = if result == TaskResult::Success {
        JobState::Success
    } else {
        JobState::Failed
    };
    ctx.metrics.task_reports_pending.inc();
    let delivery = deliver(
        &ctx.edge,
        key,
        final_state,
        &ctx.give_up,
        Backoff::for_airflow(),
    )
    .await;
    ctx.metrics.task_reports_pending.dec();
    if delivery == Delivery::Delivered {
        tracing::info!(task = %key, state = final_state.as_str(), "job state reported");
    }
}

/// Offers a callback's log to Airflow once. A provider that keeps no log for callbacks refuses
/// it (edge3 5.1.0 answers 500); retrying would only repeat that, and the callback's outcome
/// does not depend on its log, so the log stays where the callback wrote it.
async fn offer_callback_log(
    ctx: &Context,
    shipper: &mut LogShipper,
    key: &TaskKey,
    log_path: Option<&std::path::Path>,
) {
    if let Err(e) = shipper.ship(&ctx.edge, key).await {
        tracing::info!(
            task = %key,
            log = ?log_path,
            error = %e,
            "the Edge provider keeps no log for executor callbacks: the callback's log stays on \
             this worker, not retried"
        );
    }
}

/// The final push gets a few attempts; after that the state report goes ahead, because a
/// task left `running` in Airflow is worse than a log with a gap.
async fn push_last_logs(ctx: &Context, shipper: &mut LogShipper, key: &TaskKey) {
    let mut backoff = Backoff::for_airflow();
    for attempt in 1..=FINAL_LOG_ATTEMPTS {
        match shipper.ship(&ctx.edge, key).await {
            Ok(()) => return,
            Err(e) if attempt == FINAL_LOG_ATTEMPTS || !e.is_retryable() => {
                tracing::error!(task = %key, error = %e, "giving up on the task's last log lines");
                return;
            }
            Err(e) => {
                tracing::warn!(task = %key, error = %e, "final log push failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = ctx.give_up.cancelled() => return,
                }
            }
        }
    }
}
