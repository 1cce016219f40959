use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether `/readyz` answers 200: registered with Airflow and not draining.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
}
