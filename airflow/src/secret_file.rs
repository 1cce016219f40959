//! Credentials given either as a value or as a file holding it (a mounted Kubernetes Secret).
//!
//! Files are the form to deploy with: a value in the environment is readable through
//! `/proc/<pid>/environ` of every process that inherited it, and a value on the command line
//! through `/proc/<pid>/cmdline` by anyone. The value forms stay for local runs.

use std::path::Path;

/// Why a credential could not be taken: the flag concerned and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct SecretError {
    pub flag: &'static str,
    pub problem: String,
}

/// The credential from `file` (flag `file_flag`) or `value` (flag `value_flag`), `None` when
/// neither is given. Giving both is an error, so that nobody wonders which one is used.
/// Trailing whitespace is not part of a secret: editors and `echo` end files with a newline.
pub fn value_or_file(
    value: Option<String>,
    value_flag: &'static str,
    file: Option<&Path>,
    file_flag: &'static str,
) -> Result<Option<String>, SecretError> {
    let err = |problem: String| SecretError {
        flag: file_flag,
        problem,
    };
    let text = match (value, file) {
        (Some(_), Some(_)) => {
            return Err(err(format!(
                "give either {file_flag} or {value_flag}, not both"
            )))
        }
        (None, None) => return Ok(None),
        (Some(value), None) => return Ok(Some(value)),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?,
    };
    let secret = text.trim_end();
    if secret.is_empty() {
        return Err(err(format!(
            "{} is empty",
            file.unwrap_or(Path::new("")).display()
        )));
    }
    Ok(Some(secret.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_file_is_read_without_its_trailing_newline() {
        let (_dir, path) = file_with("s3cret\n");
        let got = value_or_file(None, "--token", Some(&path), "--token-file").unwrap();
        assert_eq!(got.as_deref(), Some("s3cret"));
        let (_dir, path) = file_with("s3cret\r\n");
        let got = value_or_file(None, "--token", Some(&path), "--token-file").unwrap();
        assert_eq!(got.as_deref(), Some("s3cret"));
    }

    #[test]
    fn a_value_is_taken_as_given_and_nothing_is_none() {
        let got = value_or_file(Some("v".into()), "--token", None, "--token-file").unwrap();
        assert_eq!(got.as_deref(), Some("v"));
        assert_eq!(
            value_or_file(None, "--token", None, "--token-file"),
            Ok(None)
        );
    }

    #[test]
    fn both_forms_at_once_name_the_file_flag() {
        let (_dir, path) = file_with("s3cret");
        let e =
            value_or_file(Some("v".into()), "--token", Some(&path), "--token-file").unwrap_err();
        assert_eq!(e.flag, "--token-file");
        assert!(e.problem.contains("--token"), "{e:?}");
    }

    #[test]
    fn a_missing_or_empty_file_names_the_file_flag() {
        let e = value_or_file(
            None,
            "--token",
            Some(Path::new("/nonexistent/x")),
            "--token-file",
        )
        .unwrap_err();
        assert_eq!(e.flag, "--token-file");
        assert!(e.problem.contains("/nonexistent/x"), "{e:?}");
        let (_dir, path) = file_with("\n");
        let e = value_or_file(None, "--token", Some(&path), "--token-file").unwrap_err();
        assert_eq!(e.flag, "--token-file");
        assert!(e.problem.ends_with("is empty"), "{e:?}");
    }
}
