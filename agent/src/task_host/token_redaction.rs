//! Execution API tokens out of what the task host reports.
//!
//! A supervisor's output can hold its own workload, token included (Airflow 3.0.x prints it on
//! start), and that output's tail travels to the agent, which logs it in its container log and
//! appends it to a failed task's log in Airflow. A token is a JWT: three base64url segments
//! joined by dots. The tail may begin inside one (it is cut by size), so any run of such
//! characters whose last two segments are long enough to be a payload and a signature goes,
//! with or without its header.

/// Payloads and signatures are longer than this; dotted names (`airflow.sdk.api`) are not.
const MIN_SEGMENT: usize = 20;
const REDACTED: &str = "[token redacted]";

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

fn looks_like_a_token(run: &str) -> bool {
    let segments: Vec<&str> = run.split('.').collect();
    segments
        .windows(3)
        .any(|w| !w[0].is_empty() && w[1].len() >= MIN_SEGMENT && w[2].len() >= MIN_SEGMENT)
}

/// `text` with every token-shaped run replaced.
pub fn redact_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(is_token_char) {
        out.push_str(&rest[..start]);
        let run_len = rest[start..]
            .find(|c| !is_token_char(c))
            .unwrap_or(rest.len() - start);
        let run = &rest[start..start + run_len];
        out.push_str(if looks_like_a_token(run) {
            REDACTED
        } else {
            run
        });
        rest = &rest[start + run_len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of an Execution API token (HS512), as Airflow 3.0's supervisor prints it.
    const TOKEN: &str = "eyJhbGciOiJIUzUxMiIsImtpZCI6Im5vdC11c2VkIiwidHlwIjoiSldUIn0.eyJzdWIiOiIwMWEyNGZhZS04NmIwLTczYjktODI0OC0yNGU3MmM1MDllZjAiLCJzY29wZSI6Indvcmtsb2FkIn0.j4F92pLdaMvIwLqGKA49eZB2Vtv3Q_jjZ4URwXS5eHoje96NtOwEW3gyNFnnHavtcDQRXQJ5X5A4OeAFpBqPJA";

    #[test]
    fn a_printed_workload_keeps_everything_but_its_token() {
        let line =
            format!("ExecuteTask(token='{TOKEN}', dag_rel_path='a.py', ti=TaskInstance(id=1))");
        assert_eq!(
            redact_tokens(&line),
            "ExecuteTask(token='[token redacted]', dag_rel_path='a.py', ti=TaskInstance(id=1))"
        );
    }

    #[test]
    fn a_token_cut_by_the_tail_goes_too() {
        let cut = &TOKEN[30..];
        assert_eq!(
            redact_tokens(&format!("{cut}', x=1")),
            "[token redacted]', x=1"
        );
    }

    #[test]
    fn ordinary_output_is_left_alone() {
        let text = "Traceback: airflow.sdk.execution_time.supervisor line 12\nValueError: 1.2.3 é";
        assert_eq!(redact_tokens(text), text);
    }
}
