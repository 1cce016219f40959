//! Task slots: a semaphore of `syncSlots` permits. A running job holds a [`Lease`] for its
//! `concurrency_slots`; dropping the lease is the only way a job's slots are freed, and it
//! wakes the fetch loop. The fetch loop's own slot while it asks for a job is a
//! [`Reservation`], which is not a slot in use: no job runs in it yet.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A handle on the worker's slots; clones share them.
#[derive(Clone)]
pub struct Slots(Arc<Shared>);

struct Shared {
    semaphore: Arc<Semaphore>,
    total: AtomicU32,
    /// Permits held by leases, i.e. by jobs.
    leased: AtomicU32,
    /// Slots were freed (a job ended, or the worker grew).
    freed: Notify,
}

impl Slots {
    pub fn new(total: u32) -> Self {
        Slots(Arc::new(Shared {
            semaphore: Arc::new(Semaphore::new(total as usize)),
            total: AtomicU32::new(total),
            leased: AtomicU32::new(0),
            freed: Notify::new(),
        }))
    }

    pub fn total(&self) -> u32 {
        self.0.total.load(Ordering::Acquire)
    }

    /// Slots not held by a job or reservation (never more than the current total, even while
    /// a shrink is still waiting for running jobs to hand slots back).
    pub fn free(&self) -> u32 {
        (self.0.semaphore.available_permits() as u32).min(self.total())
    }

    /// Slots held by running jobs; above the total while a shrink waits for them.
    pub fn in_use(&self) -> u32 {
        self.0.leased.load(Ordering::Acquire)
    }

    /// Waits for one slot, held until it becomes a job's lease or is dropped.
    pub async fn reserve(&self) -> Reservation {
        Reservation {
            permit: self.acquire(1).await,
            slots: self.clone(),
        }
    }

    /// Completes when slots were freed since the last call (at once if that was meanwhile).
    pub async fn freed(&self) {
        self.0.freed.notified().await;
    }

    /// A job asking for more slots than exist gets all of them rather than waiting forever.
    fn clamp(&self, n: u32) -> u32 {
        n.clamp(1, self.total().max(1))
    }

    async fn acquire(&self, n: u32) -> OwnedSemaphorePermit {
        self.0
            .semaphore
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the slot semaphore is never closed")
    }

    /// Applies a new total (Airflow's `concurrency` for this worker can be changed by an
    /// admin). Growing adds permits at once; shrinking takes permits out as jobs return them.
    pub fn resize(&self, new_total: u32) {
        let new_total = new_total.max(1);
        let old = self.0.total.swap(new_total, Ordering::AcqRel);
        if new_total > old {
            self.0.semaphore.add_permits((new_total - old) as usize);
            self.0.freed.notify_one();
        } else if new_total < old {
            let semaphore = self.0.semaphore.clone();
            tokio::spawn(async move {
                if let Ok(permits) = semaphore.acquire_many_owned(old - new_total).await {
                    permits.forget();
                }
            });
        }
    }
}

/// The fetch loop's slot while it asks Airflow for a job, so that a job that arrives always
/// has room. Dropping it gives the slot back without waking the fetch loop, which dropped it.
pub struct Reservation {
    permit: OwnedSemaphorePermit,
    slots: Slots,
}

impl Reservation {
    /// Hands the reserved slot to a job that needs `n` slots, waiting for the others.
    /// Airflow only hands out jobs that fit the free slots, so they are available unless an
    /// admin shrank the worker meanwhile.
    pub async fn into_lease(self, n: u32) -> Lease {
        let Reservation { mut permit, slots } = self;
        let n = slots.clamp(n);
        if n > 1 {
            permit.merge(slots.acquire(n - 1).await);
        }
        slots.0.leased.fetch_add(n, Ordering::AcqRel);
        Lease { permit, slots }
    }
}

/// The slots of a running job. Dropping it frees them and wakes the fetch loop.
pub struct Lease {
    permit: OwnedSemaphorePermit,
    slots: Slots,
}

impl Lease {
    pub fn count(&self) -> u32 {
        self.permit.num_permits() as u32
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slots
            .0
            .leased
            .fetch_sub(self.count(), Ordering::AcqRel);
        // The permits return right after this, when `permit` is dropped; the fetch loop, once
        // awake, waits for them in the semaphore anyway.
        self.slots.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::time::Duration;

    async fn lease(slots: &Slots, n: u32) -> Lease {
        slots.reserve().await.into_lease(n).await
    }

    /// Whether the fetch loop, waiting on [`Slots::freed`], would wake up now.
    fn woken(slots: &Slots) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::pin!(slots.freed()).poll(&mut cx).is_ready()
    }

    #[tokio::test]
    async fn leases_are_slots_and_dropping_one_frees_them_and_wakes_the_fetch_loop() {
        let slots = Slots::new(4);
        let a = lease(&slots, 3).await;
        assert_eq!((slots.free(), slots.in_use()), (1, 3));
        let b = lease(&slots, 1).await;
        assert_eq!((slots.free(), slots.in_use()), (0, 4));
        // A fifth slot is not available until one is dropped.
        let waiting = tokio::time::timeout(Duration::from_millis(50), slots.reserve()).await;
        assert!(waiting.is_err());
        assert!(!woken(&slots));
        drop(a);
        assert_eq!((slots.free(), slots.in_use()), (3, 1));
        assert!(woken(&slots));
        drop(b);
        assert_eq!((slots.free(), slots.in_use()), (4, 0));
    }

    #[tokio::test]
    async fn a_reservation_is_not_in_use_and_its_drop_wakes_nobody() {
        let slots = Slots::new(2);
        let reservation = slots.reserve().await;
        assert_eq!((slots.free(), slots.in_use()), (1, 0));
        drop(reservation);
        assert_eq!((slots.free(), slots.in_use()), (2, 0));
        assert!(!woken(&slots));
    }

    #[tokio::test]
    async fn a_job_wider_than_the_worker_takes_all_slots() {
        let slots = Slots::new(2);
        let all = lease(&slots, 5).await;
        assert_eq!(all.count(), 2);
        assert_eq!((slots.free(), slots.in_use()), (0, 2));
    }

    #[tokio::test]
    async fn resize_grows_at_once_and_shrinks_as_jobs_end() {
        let slots = Slots::new(2);
        let held = lease(&slots, 2).await;
        slots.resize(4);
        assert_eq!(slots.total(), 4);
        assert_eq!(slots.free(), 2);
        assert!(woken(&slots), "growing frees slots");
        slots.resize(1);
        assert_eq!(slots.total(), 1);
        assert_eq!(slots.free(), 1, "free is capped by the new total");
        assert_eq!(slots.in_use(), 2, "the job still holds its two");
        drop(held);
        assert_eq!(
            slots.in_use(),
            0,
            "in use at once, before the shrink completes"
        );
        // The shrink task takes three permits back once the job returns its two.
        tokio::time::timeout(Duration::from_secs(1), async {
            while slots.0.semaphore.available_permits() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("shrink completes");
        assert_eq!((slots.free(), slots.in_use()), (1, 0));
    }
}
