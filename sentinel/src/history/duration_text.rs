//! Durations the way the scaling history writes them, in findings and tiles alike: "40 s",
//! "2 min", "1 h 45 min", "3 d 4 h" — the two largest units, the second rounded to the
//! nearest (half up) and left out when it is 0. Rounding up may carry: 1 h 59 min 30 s reads
//! "2 h", 23 h 59 min 30 s reads "1 d".
//!
//! The page writes its tiles with `ui/duration.js`, the same rule in JavaScript; both are
//! tested on one table (`tests/data/duration_text.json`, the page's in Chromium), so a tile
//! and a finding never round the same time differently.

const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")];

pub fn human_duration(seconds: u64) -> String {
    if seconds == 0 {
        return "0 s".into();
    }
    let first = leading_unit(seconds);
    let rounded = match UNITS.get(first + 1) {
        // Half up, in integers: (n + half) / size * size.
        Some(&(next, _)) => seconds.saturating_add(next / 2) / next * next,
        None => seconds,
    };
    // A carry lands exactly on a multiple of the larger unit, so the second unit is exact.
    let first = leading_unit(rounded);
    let (size, name) = UNITS[first];
    let mut text = format!("{} {name}", rounded / size);
    if let Some(&(next_size, next_name)) = UNITS.get(first + 1) {
        let rest = rounded % size / next_size;
        if rest > 0 {
            text.push_str(&format!(" {rest} {next_name}"));
        }
    }
    text
}

/// The index in [`UNITS`] of the largest unit `seconds` (> 0) holds at least once.
fn leading_unit(seconds: u64) -> usize {
    UNITS
        .iter()
        .position(|(size, _)| seconds >= *size)
        .expect("a positive number of seconds has a unit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_table_the_page_is_tested_on() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/data/duration_text.json")).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() > 20);
        for case in cases {
            let seconds = case[0].as_u64().unwrap();
            assert_eq!(human_duration(seconds), case[1], "{seconds} s");
        }
    }

    #[test]
    fn writes_the_seeds_examples() {
        assert_eq!(human_duration(120), "2 min");
        assert_eq!(human_duration(2 * 3600), "2 h");
        assert_eq!(human_duration(40 * 60), "40 min");
        assert_eq!(human_duration(105 * 60), "1 h 45 min");
        assert_eq!(human_duration(40), "40 s");
    }

    #[test]
    fn rounds_the_second_unit_and_carries() {
        assert_eq!(human_duration(3600 + 29), "1 h", "29 s rounds down");
        assert_eq!(human_duration(3600 + 30), "1 h 1 min", "30 s rounds up");
        assert_eq!(
            human_duration(2 * 3600 - 30),
            "2 h",
            "carried into the hour"
        );
        assert_eq!(
            human_duration(86_400 - 30),
            "1 d",
            "carried into a larger unit"
        );
        assert_eq!(human_duration(u64::MAX / 2).split(' ').count(), 4);
    }
}
