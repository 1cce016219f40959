//! KEDA's bearer token for the Sentinel's metric endpoints (`keda.auth.mode: staticToken`
//! without a value): made once, kept for as long as its Secret exists.

use rand::distr::{Alphanumeric, SampleString};

/// The Secret's key, which the chart's TriggerAuthentication names.
pub const KEY: &str = "token";

/// 48 letters and digits, about 285 bits: as long as the token the chart used to make.
pub fn new_token() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 48)
}

/// Whether a stored token can stay.
pub fn usable(stored: Option<&str>) -> bool {
    stored.is_some_and(|t| !t.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_alphanumeric_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 48);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    #[test]
    fn an_empty_token_is_replaced() {
        assert!(!usable(None));
        assert!(!usable(Some(" \n")));
        assert!(usable(Some("abc")));
    }
}
