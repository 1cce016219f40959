//! A temp folder for one test's files.

use std::path::PathBuf;

/// A temp folder removed on drop: its path is `.0`, and `.1` is the folder itself (removing
/// it when dropped). Its name carries `tag` to tell the tests' folders apart when one is left
/// behind (a killed test run).
pub struct TempDir(pub PathBuf, pub tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("astro-test-{tag}-"))
            .tempdir()
            .unwrap();
        TempDir(dir.path().to_path_buf(), dir)
    }

    /// Writes `content` to `name` in the folder; its path.
    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }
}
