//! A child process that cannot outlive its test.

use std::process::Child;

/// A child process killed and reaped when dropped (e.g. when an assertion fails), so that a
/// failing test leaves no binary running behind it.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
