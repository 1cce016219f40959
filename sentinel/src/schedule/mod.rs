//! Pre-warm from Airflow's schedule: most Airflow work is scheduled, and the api-server says
//! when each DAG runs next and what its earlier runs needed. For each worker pool, the
//! [`reader`] finds the unpaused DAGs whose tasks use its queues, their next `run_after` and
//! the slots a run needs at its start ([`demand`]); the [`schedule_loop`] reads that on a slow
//! cadence into a [`plan`]; at each backlog refresh the [`windows`] turn the plan into the
//! expected slots each worker's answer carries from `run_after − lead` ([`lead`]) until the
//! run's work arrives, apart from the real backlog ([`pre_warm`] is the refresh loop's hook).
//!
//! The schedule is read through Airflow's REST API only. With the postgres backlog source
//! there is no pre-warm: the database's `dag` table has the next run but not each task's
//! queue, which only Airflow's serialized DAGs hold, in a layout internal to Airflow.

pub mod demand;
pub mod lead;
pub mod plan;
pub mod pre_warm;
pub mod reader;
pub mod schedule_loop;
pub mod windows;
