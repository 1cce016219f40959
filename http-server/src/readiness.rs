use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether `/readyz` answers 200. Each binary says when it is ready where it sets this.
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
