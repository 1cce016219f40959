//! Durations the way the scaling history dialog writes them: "40 s", "2 min", "1 h 45 min",
//! "3 d 4 h" — the two largest units, the second left out when it is 0.

pub fn human_duration(seconds: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")];
    if seconds == 0 {
        return "0 s".into();
    }
    let first = UNITS
        .iter()
        .position(|(size, _)| seconds >= *size)
        .expect("a positive number of seconds has a unit");
    let (size, name) = UNITS[first];
    let mut text = format!("{} {name}", seconds / size);
    if let Some(&(next_size, next_name)) = UNITS.get(first + 1) {
        let rest = seconds % size / next_size;
        if rest > 0 {
            text.push_str(&format!(" {rest} {next_name}"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_seeds_examples() {
        assert_eq!(human_duration(120), "2 min");
        assert_eq!(human_duration(2 * 3600), "2 h");
        assert_eq!(human_duration(40 * 60), "40 min");
        assert_eq!(human_duration(105 * 60), "1 h 45 min");
        assert_eq!(human_duration(40), "40 s");
    }

    #[test]
    fn keeps_two_units_at_most() {
        assert_eq!(human_duration(0), "0 s");
        assert_eq!(human_duration(59), "59 s");
        assert_eq!(human_duration(61), "1 min 1 s");
        assert_eq!(
            human_duration(3600 + 59),
            "1 h",
            "seconds dropped past an hour"
        );
        assert_eq!(human_duration(3 * 3600 + 30 * 60), "3 h 30 min");
        assert_eq!(human_duration(86_400), "1 d");
        assert_eq!(human_duration(14 * 86_400 + 5 * 3600 + 7), "14 d 5 h");
    }
}
