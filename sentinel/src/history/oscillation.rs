//! Seed 002's "no oscillation" check: over an hour of steady traffic the replica count should
//! change no more than a few times. An hour of the decision log oscillated when the count
//! changed at least [`MIN_CHANGES`] times, turned back at least [`MIN_REVERSALS`] times, and the
//! backlog at those changes stayed within one worker's slots — jitter the target sits on, not
//! a burst the pool followed.
//!
//! The count is the one the autoscaler set (`workers` decisions) where the cluster side reports
//! it, else what the Sentinel asked for (`desiredReplicas`). Every hour-long stretch of the
//! range (at least the last hour) is looked at; the worst one is reported.

use super::decisions::{Decision, DecisionKind};

pub const WINDOW_MS: u64 = 3_600_000;
pub const MIN_CHANGES: usize = 6;
pub const MIN_REVERSALS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oscillation {
    pub changes: usize,
    pub reversals: usize,
    pub lowest_backlog: u32,
    pub highest_backlog: u32,
    pub sync_slots: u32,
    /// Whose count changed: the autoscaler's (`workers`) or the Sentinel's.
    pub kind: DecisionKind,
}

/// The worst hour of `decisions` (oldest first) that oscillated, if any.
pub fn oscillation<'a>(decisions: impl IntoIterator<Item = &'a Decision>) -> Option<Oscillation> {
    let all: Vec<&Decision> = decisions.into_iter().collect();
    let kind = if all.iter().any(|d| d.kind == DecisionKind::Workers) {
        DecisionKind::Workers
    } else {
        DecisionKind::DesiredReplicas
    };
    let changes: Vec<&Decision> = all.into_iter().filter(|d| d.kind == kind).collect();
    let mut worst: Option<Oscillation> = None;
    let mut first = 0;
    for (last, newest) in changes.iter().enumerate() {
        while newest.at_ms.saturating_sub(changes[first].at_ms) >= WINDOW_MS {
            first += 1;
        }
        let hour = &changes[first..=last];
        if hour.len() < MIN_CHANGES {
            continue;
        }
        let reversals = hour
            .windows(2)
            .filter(|pair| rising(pair[0]) != rising(pair[1]))
            .count();
        let lowest = hour.iter().map(|d| d.backlog).min().unwrap_or(0);
        let highest = hour.iter().map(|d| d.backlog).max().unwrap_or(0);
        let sync_slots = newest.sync_slots;
        let steady = highest - lowest <= sync_slots;
        if reversals >= MIN_REVERSALS
            && steady
            && worst.is_none_or(|w| (hour.len(), reversals) > (w.changes, w.reversals))
        {
            worst = Some(Oscillation {
                changes: hour.len(),
                reversals,
                lowest_backlog: lowest,
                highest_backlog: highest,
                sync_slots,
                kind,
            });
        }
    }
    worst
}

fn rising(d: &Decision) -> bool {
    d.to > d.from
}

#[cfg(test)]
mod tests {
    use super::super::decisions::DecisionSource;
    use super::*;

    const T0_MS: u64 = 1_800_000_000_000;

    /// A change `from` → `to` at `minute`, with `backlog` slots of 4 per worker.
    fn change(kind: DecisionKind, minute: u64, from: u32, to: u32, backlog: u32) -> Decision {
        Decision {
            at_ms: T0_MS + minute * 60_000,
            kind,
            source: DecisionSource::Kubernetes,
            from,
            to,
            queued: 0,
            running_tasks: 0,
            backlog,
            sync_slots: 4,
            min_replicas: 1,
            max_replicas: 10,
        }
    }

    /// Up and down between 2 and 3 workers every `every` minutes, `n` changes, the backlog
    /// moving between 7 and 9 slots.
    fn see_saw(kind: DecisionKind, n: u64, every: u64) -> Vec<Decision> {
        (0..n)
            .map(|i| {
                let up = i % 2 == 0;
                let (from, to) = if up { (2, 3) } else { (3, 2) };
                change(kind, i * every, from, to, if up { 9 } else { 7 })
            })
            .collect()
    }

    #[test]
    fn six_changes_with_two_reversals_over_a_steady_backlog_within_an_hour() {
        let found = oscillation(&see_saw(DecisionKind::Workers, 6, 10)).unwrap();
        assert_eq!(
            found,
            Oscillation {
                changes: 6,
                reversals: 5,
                lowest_backlog: 7,
                highest_backlog: 9,
                sync_slots: 4,
                kind: DecisionKind::Workers,
            }
        );
        assert_eq!(
            oscillation(&see_saw(DecisionKind::Workers, 5, 10)),
            None,
            "5 changes"
        );
        assert_eq!(
            oscillation(&see_saw(DecisionKind::Workers, 6, 12)),
            None,
            "6 changes over exactly an hour: not within one"
        );
    }

    #[test]
    fn a_burst_the_pool_followed_is_not_oscillation() {
        // Up three times and down three times: one reversal.
        let climb: Vec<Decision> = [(1, 2), (2, 3), (3, 4), (4, 3), (3, 2), (2, 1)]
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| change(DecisionKind::Workers, i as u64 * 5, from, to, 6))
            .collect();
        assert_eq!(oscillation(&climb), None, "one reversal");
        // The see-saw, but the backlog moved by more than one worker's 4 slots.
        let mut moving = see_saw(DecisionKind::Workers, 6, 5);
        moving[3].backlog = 14;
        assert_eq!(oscillation(&moving), None);
    }

    #[test]
    fn the_autoscalers_count_is_judged_where_it_is_known() {
        // The Sentinel's count see-saws, the autoscaler's (smoothed) changed once.
        let mut log = see_saw(DecisionKind::DesiredReplicas, 8, 5);
        log.push(change(DecisionKind::Workers, 50, 2, 3, 8));
        assert_eq!(oscillation(&log), None);
        let sentinel_only = see_saw(DecisionKind::DesiredReplicas, 8, 5);
        let found = oscillation(&sentinel_only).unwrap();
        assert_eq!(
            (found.changes, found.kind),
            (8, DecisionKind::DesiredReplicas)
        );
    }
}
