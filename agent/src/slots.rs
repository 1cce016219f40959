//! Task slots: a semaphore of `syncSlots` permits. A running job holds an owned permit for its
//! `concurrency_slots`, and dropping that permit is the only way a slot is freed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Slots {
    semaphore: Arc<Semaphore>,
    total: AtomicU32,
}

impl Slots {
    pub fn new(total: u32) -> Self {
        Slots {
            semaphore: Arc::new(Semaphore::new(total as usize)),
            total: AtomicU32::new(total),
        }
    }

    pub fn total(&self) -> u32 {
        self.total.load(Ordering::Acquire)
    }

    /// Slots not held by a job (never more than the current total, even while a shrink is
    /// still waiting for running jobs to hand slots back).
    pub fn free(&self) -> u32 {
        (self.semaphore.available_permits() as u32).min(self.total())
    }

    pub fn in_use(&self) -> u32 {
        self.total().saturating_sub(self.free())
    }

    /// Waits for `n` slots. A job asking for more slots than exist gets all of them rather
    /// than waiting forever.
    pub async fn acquire(&self, n: u32) -> OwnedSemaphorePermit {
        let n = n.clamp(1, self.total().max(1));
        self.semaphore
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the slot semaphore is never closed")
    }

    /// Applies a new total (Airflow's `concurrency` for this worker can be changed by an
    /// admin). Growing adds permits at once; shrinking takes permits out as jobs return them.
    pub fn resize(&self, new_total: u32) {
        let new_total = new_total.max(1);
        let old = self.total.swap(new_total, Ordering::AcqRel);
        if new_total > old {
            self.semaphore.add_permits((new_total - old) as usize);
        } else if new_total < old {
            let semaphore = self.semaphore.clone();
            tokio::spawn(async move {
                if let Ok(permits) = semaphore.acquire_many_owned(old - new_total).await {
                    permits.forget();
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn permits_are_slots_and_dropping_frees_them() {
        let slots = Slots::new(4);
        let a = slots.acquire(3).await;
        assert_eq!(slots.free(), 1);
        assert_eq!(slots.in_use(), 3);
        let b = slots.acquire(1).await;
        assert_eq!(slots.free(), 0);
        // A fifth slot is not available until one is dropped.
        let waiting = tokio::time::timeout(Duration::from_millis(50), slots.acquire(1)).await;
        assert!(waiting.is_err());
        drop(a);
        assert_eq!(slots.free(), 3);
        drop(b);
        assert_eq!(slots.free(), 4);
    }

    #[tokio::test]
    async fn a_job_wider_than_the_worker_takes_all_slots() {
        let slots = Slots::new(2);
        let all = slots.acquire(5).await;
        assert_eq!(all.num_permits(), 2);
        assert_eq!(slots.free(), 0);
    }

    #[tokio::test]
    async fn resize_grows_at_once_and_shrinks_as_jobs_end() {
        let slots = Slots::new(2);
        let held = slots.acquire(2).await;
        slots.resize(4);
        assert_eq!(slots.total(), 4);
        assert_eq!(slots.free(), 2);
        slots.resize(1);
        assert_eq!(slots.total(), 1);
        assert_eq!(slots.free(), 1, "free is capped by the new total");
        drop(held);
        // The shrink task takes three permits back once the job returns its two.
        tokio::time::timeout(Duration::from_secs(1), async {
            while slots.semaphore.available_permits() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("shrink completes");
        assert_eq!(slots.free(), 1);
    }
}
