//! Scaling history: what each worker wanted, what it got, and what held it back, over the last
//! 15 minutes to 14 days — the data behind the scaling history dialog.
//!
//! Data flows one way: after every refresh the [`recorder`] turns each worker's answer (the
//! one KEDA gets) and the [pool view](crate::pool) into a [`sample`]; the [`store`] adds it to three
//! downsampled [`tier`]s and to the [`decisions`] log; a request picks the tier of its
//! [`range`] and builds the [`answer`], with [`findings`] (and the decision log's
//! [`oscillation`]) worded by [`duration_text`].
//! [`persist`] keeps it across restarts when `history.path` is set, written by one replica at
//! a time ([`file_lock`]), together with the [`saved_logs`]: the pools' recent cold starts and
//! the [`pre_warm_log`], which says what pre-warming from the schedule did.
//!
//! With two Sentinel replicas, each records the same inputs on its own (both read the same
//! source every refresh); an answer names the replica that recorded it (`recordedBy`, from
//! [`instance`]) and since when (`recordingSince`), so the page can say whose recording it
//! shows. Nothing is exchanged between replicas: there is nothing to reconcile, and one
//! replica's restart loses only its own recording.

pub mod answer;
pub mod clock;
pub mod decisions;
pub mod duration_text;
pub mod file_lock;
pub mod findings;
pub mod format_v2;
pub mod instance;
pub mod oscillation;
pub mod persist;
pub mod pre_warm_log;
pub mod range;
pub mod recorder;
pub mod sample;
pub mod saved_logs;
pub mod store;
pub mod tier;
pub mod worker_history;
