use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether `/readyz` answers 200: set once the first refresh has read at least one queue, and
/// never cleared — a Sentinel whose data went stale stays in the Service so that KEDA hears
/// an explicit 503 from it rather than a connection error.
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
