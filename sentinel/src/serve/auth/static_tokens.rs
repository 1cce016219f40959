//! Static bearer tokens from a file: one token per line, blank lines and `#` comments ignored.
//!
//! Only SHA-256 hashes of the tokens are kept, and a presented token is compared by hash
//! against every one of them in constant time (no early exit, equal lengths), so neither
//! timing nor memory tells anything about the tokens. The file is re-read when its content
//! changes: a Kubernetes Secret update swaps the file behind a symlink, which a content check
//! sees whatever the file system's timestamps do.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use subtle::{Choice, ConstantTimeEq};
use tokio_util::sync::CancellationToken;

pub type TokenHash = [u8; 32];

pub fn hash(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

struct TokenSet {
    hashes: Vec<TokenHash>,
    /// Hash of the whole file, to notice changes.
    file_hash: TokenHash,
}

pub struct StaticTokens {
    path: PathBuf,
    current: RwLock<Arc<TokenSet>>,
}

/// How often the file is checked for changes.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl StaticTokens {
    /// Reads `path`; an unreadable file is an error (the caller treats it as bad config).
    pub fn load(path: &Path) -> std::io::Result<StaticTokens> {
        let set = read(path)?;
        Ok(StaticTokens {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(set)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.set().hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self) -> Arc<TokenSet> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether `token` is one of the configured tokens.
    pub fn contains(&self, token: &str) -> bool {
        let presented = hash(token);
        let set = self.set();
        let mut found = Choice::from(0u8);
        for known in &set.hashes {
            found |= known.ct_eq(&presented);
        }
        found.into()
    }

    /// Re-reads the file if its content changed. `Ok(Some(n))`: reloaded, now `n` tokens;
    /// `Ok(None)`: unchanged. On error the previous tokens stay in force.
    pub fn reload_if_changed(&self) -> std::io::Result<Option<usize>> {
        let bytes = std::fs::read(&self.path)?;
        let file_hash: TokenHash = Sha256::digest(&bytes).into();
        if file_hash == self.set().file_hash {
            return Ok(None);
        }
        let set = parse(&bytes, file_hash);
        let n = set.hashes.len();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
        Ok(Some(n))
    }

    /// Checks the file every [`RELOAD_CHECK_INTERVAL`] until `shutdown` is cancelled.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RELOAD_CHECK_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            match self.reload_if_changed() {
                Ok(Some(n)) => {
                    failing = false;
                    tracing::info!(path = %self.path.display(), tokens = n, "static tokens reloaded");
                    if n == 0 {
                        tracing::warn!(path = %self.path.display(), "the static tokens file holds no token");
                    }
                }
                Ok(None) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "cannot re-read the static tokens file; keeping the tokens loaded before");
                }
                Err(_) => {}
            }
        }
    }
}

fn read(path: &Path) -> std::io::Result<TokenSet> {
    let bytes = std::fs::read(path)?;
    let file_hash: TokenHash = Sha256::digest(&bytes).into();
    Ok(parse(&bytes, file_hash))
}

fn parse(bytes: &[u8], file_hash: TokenHash) -> TokenSet {
    let text = String::from_utf8_lossy(bytes);
    let hashes = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(hash)
        .collect();
    TokenSet { hashes, file_hash }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "astro-sentinel-static-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn lines_comments_and_blanks() {
        let path = temp_file("parse", "# KEDA\n  alpha  \n\nbeta\n#gamma\n");
        let t = StaticTokens::load(&path).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t.contains("alpha"));
        assert!(t.contains("beta"));
        assert!(!t.contains("gamma"));
        assert!(!t.contains("# KEDA"));
        assert!(!t.contains(""));
        assert!(!t.contains("alph"));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn reload_picks_up_new_content_and_keeps_old_tokens_on_error() {
        let path = temp_file("reload", "one\n");
        let t = StaticTokens::load(&path).unwrap();
        assert_eq!(t.reload_if_changed().unwrap(), None);
        std::fs::write(&path, "two\nthree\n").unwrap();
        assert_eq!(t.reload_if_changed().unwrap(), Some(2));
        assert!(!t.contains("one"));
        assert!(t.contains("three"));
        std::fs::remove_file(&path).unwrap();
        assert!(t.reload_if_changed().is_err());
        assert!(t.contains("two"), "tokens stay when the file is unreadable");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_missing_file_is_an_error() {
        assert!(StaticTokens::load(Path::new("/nonexistent/astro-sentinel/tokens")).is_err());
    }
}
