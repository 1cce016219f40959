//! The ranges the history answers for, and how each scales the finding thresholds: a state
//! becomes a finding once it adds up to 15 minutes a day, scaled to the range.

use super::tier::{TierSpec, COARSE, FINE, MINUTE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistoryRange {
    FifteenMinutes,
    OneHour,
    SixHours,
    #[default]
    OneDay,
    SevenDays,
    FourteenDays,
}

const DAY_MS: u64 = 86_400_000;
/// 15 minutes in a day: how long a state must add up to before it is a finding.
const FINDING_MS_PER_DAY: u64 = 15 * 60_000;
/// 2 hours in a day: the running time the below-minimum finding needs.
const RUNNING_FLOOR_MS_PER_DAY: u64 = 2 * 3_600_000;

impl HistoryRange {
    pub const ALL: [HistoryRange; 6] = [
        HistoryRange::FifteenMinutes,
        HistoryRange::OneHour,
        HistoryRange::SixHours,
        HistoryRange::OneDay,
        HistoryRange::SevenDays,
        HistoryRange::FourteenDays,
    ];

    pub fn parse(text: &str) -> Option<HistoryRange> {
        HistoryRange::ALL.into_iter().find(|r| r.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HistoryRange::FifteenMinutes => "15m",
            HistoryRange::OneHour => "1h",
            HistoryRange::SixHours => "6h",
            HistoryRange::OneDay => "1d",
            HistoryRange::SevenDays => "7d",
            HistoryRange::FourteenDays => "14d",
        }
    }

    pub fn millis(self) -> u64 {
        let minutes: u64 = match self {
            HistoryRange::FifteenMinutes => 15,
            HistoryRange::OneHour => 60,
            HistoryRange::SixHours => 6 * 60,
            HistoryRange::OneDay => 24 * 60,
            HistoryRange::SevenDays => 7 * 24 * 60,
            HistoryRange::FourteenDays => 14 * 24 * 60,
        };
        minutes * 60_000
    }

    /// 15 min × range ÷ 1 day. Exact in milliseconds for every range (9.375 s for 15m).
    pub fn finding_threshold_ms(self) -> u64 {
        FINDING_MS_PER_DAY * self.millis() / DAY_MS
    }

    /// 2 h × range ÷ 1 day: the below-minimum finding needs this much running time.
    pub fn running_floor_ms(self) -> u64 {
        RUNNING_FLOOR_MS_PER_DAY * self.millis() / DAY_MS
    }

    /// The tier that answers this range with between 60 and 2000 points.
    pub fn tier(self) -> TierSpec {
        match self {
            HistoryRange::FifteenMinutes | HistoryRange::OneHour => FINE,
            HistoryRange::SixHours | HistoryRange::OneDay => MINUTE,
            HistoryRange::SevenDays | HistoryRange::FourteenDays => COARSE,
        }
    }

    /// How many buckets of its tier the range spans.
    pub fn buckets(self) -> u64 {
        self.millis() / (u64::from(self.tier().width_s) * 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly_the_six_ranges() {
        for r in HistoryRange::ALL {
            assert_eq!(HistoryRange::parse(r.as_str()), Some(r));
        }
        for bad in ["", "2d", "1D", "15min", "24h", " 1d"] {
            assert_eq!(HistoryRange::parse(bad), None, "{bad:?}");
        }
        assert_eq!(HistoryRange::default(), HistoryRange::OneDay);
    }

    #[test]
    fn thresholds_follow_the_seeds_table() {
        let t = |r: HistoryRange| r.finding_threshold_ms();
        assert_eq!(t(HistoryRange::FifteenMinutes), 9_375);
        assert_eq!(t(HistoryRange::OneHour), 37_500, "about 40 seconds");
        assert_eq!(t(HistoryRange::SixHours), 225_000);
        assert_eq!(t(HistoryRange::OneDay), 15 * 60_000);
        assert_eq!(t(HistoryRange::SevenDays), 105 * 60_000, "1 h 45 min");
        assert_eq!(t(HistoryRange::FourteenDays), 210 * 60_000, "3 h 30 min");
        assert_eq!(HistoryRange::OneDay.running_floor_ms(), 2 * 3_600_000);
        assert_eq!(HistoryRange::OneHour.running_floor_ms(), 5 * 60_000);
        assert_eq!(HistoryRange::SevenDays.running_floor_ms(), 14 * 3_600_000);
    }

    #[test]
    fn every_range_gets_between_60_and_2000_points() {
        for r in HistoryRange::ALL {
            let n = r.buckets();
            assert!((60..=2000).contains(&n), "{}: {n}", r.as_str());
            assert!(
                n as usize <= r.tier().capacity,
                "{}: the tier keeps the whole range",
                r.as_str()
            );
            assert_eq!(r.millis() % (u64::from(r.tier().width_s) * 1000), 0);
        }
    }
}
