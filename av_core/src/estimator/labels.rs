//! Which draft positions a verification step labels, and how.
//!
//! After the target verified `admitted` drafts of a request and accepted the first `accepted`
//! of them (0-based positions `k`):
//!
//! * `k < accepted` → label 1 (accepted);
//! * `k == accepted` and `accepted < admitted` → label 0 (the first rejection);
//! * anything else → unlabeled: never verified, or after the first rejection, where the
//!   target's verdict is not about that draft at all (it was conditioned on a rejected prefix).
//!
//! In vLLM's terms `accepted = max(num_sampled − 1, 0)` and `admitted = accepted + num_rejected`.

use crate::error::{Error, Result};

/// The label of draft position `position`, or `None` when the step says nothing about it.
#[inline]
#[cfg_attr(not(test), allow(dead_code))] // only the tests call it since the module is private
pub fn label(position: usize, admitted: usize, accepted: usize) -> Option<bool> {
    if position < accepted {
        Some(true)
    } else if position == accepted && accepted < admitted {
        Some(false)
    } else {
        None
    }
}

/// Number of labeled positions of one request: the accepted ones plus the first rejection.
#[inline]
pub fn num_labeled(admitted: usize, accepted: usize) -> usize {
    if accepted < admitted {
        accepted + 1
    } else {
        accepted
    }
}

/// Whether one request's counts are possible: `0 ≤ accepted ≤ admitted ≤ num_positions`
/// (branch-free; [`validate_counts`] names what is wrong).
#[inline(always)]
pub fn counts_valid(admitted: i64, accepted: i64, num_positions: usize) -> bool {
    (0 <= accepted) & (accepted <= admitted) & (admitted <= num_positions as i64)
}

/// Checks one request's counts against the draft length `num_positions` and returns them as
/// `(admitted, accepted)`.
pub fn validate_counts(
    row: usize,
    admitted: i64,
    accepted: i64,
    num_positions: usize,
) -> Result<(usize, usize)> {
    if admitted < 0 {
        return Err(Error::value(
            "num_admitted",
            format!("must be non-negative, got {admitted} at row {row}"),
        ));
    }
    if accepted < 0 {
        return Err(Error::value(
            "num_accepted",
            format!("must be non-negative, got {accepted} at row {row}"),
        ));
    }
    if admitted as u64 > num_positions as u64 {
        return Err(Error::value(
            "num_admitted",
            format!("must be at most num_positions = {num_positions}, got {admitted} at row {row}"),
        ));
    }
    if accepted > admitted {
        return Err(Error::value(
            "num_accepted",
            format!("must be at most num_admitted = {admitted}, got {accepted} at row {row}"),
        ));
    }
    Ok((admitted as usize, accepted as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_rule_by_hand() {
        // Three admitted, two accepted: 1, 1, 0.
        let labels: Vec<_> = (0..4).map(|k| label(k, 3, 2)).collect();
        assert_eq!(labels, [Some(true), Some(true), Some(false), None]);
        // Everything admitted was accepted: no zero label.
        let labels: Vec<_> = (0..3).map(|k| label(k, 2, 2)).collect();
        assert_eq!(labels, [Some(true), Some(true), None]);
        // Nothing admitted: nothing labeled.
        assert!((0..3).all(|k| label(k, 0, 0).is_none()));
        // First draft rejected: only position 0 labeled.
        let labels: Vec<_> = (0..3).map(|k| label(k, 3, 0)).collect();
        assert_eq!(labels, [Some(false), None, None]);
    }

    #[test]
    fn num_labeled_counts_the_labels() {
        for admitted in 0..6 {
            for accepted in 0..=admitted {
                let counted = (0..8)
                    .filter(|&k| label(k, admitted, accepted).is_some())
                    .count();
                assert_eq!(counted, num_labeled(admitted, accepted));
            }
        }
    }

    #[test]
    fn counts_are_validated() {
        assert!(validate_counts(0, -1, 0, 4).is_err());
        assert!(validate_counts(0, 2, -1, 4).is_err());
        assert!(validate_counts(0, 5, 0, 4).is_err());
        let err = validate_counts(3, 2, 3, 4).unwrap_err();
        assert_eq!(err.argument, "num_accepted");
        assert!(err.message.contains("row 3"));
        assert_eq!(validate_counts(0, 4, 4, 4).unwrap(), (4, 4));
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn label_example() {
        use crate::estimator::labels::label;

        // Three drafts verified, the first two accepted: labels 1, 1, 0, then nothing.
        let labels: Vec<_> = (0..4).map(|k| label(k, 3, 2)).collect();
        assert_eq!(labels, [Some(true), Some(true), Some(false), None]);
    }

    #[test]
    fn num_labeled_example() {
        use crate::estimator::labels::num_labeled;

        assert_eq!(num_labeled(3, 2), 3); // two accepted plus the rejection
        assert_eq!(num_labeled(2, 2), 2); // all accepted: no rejection to label
        assert_eq!(num_labeled(0, 0), 0);
    }

    #[test]
    fn validate_counts_example() -> crate::Result<()> {
        use crate::estimator::labels::validate_counts;

        assert_eq!(validate_counts(0, 4, 1, 4)?, (4, 1));
        let err = validate_counts(7, 2, 3, 4).unwrap_err();
        assert_eq!(err.argument, "num_accepted");
        assert!(err.message.contains("row 7"));
        Ok::<(), crate::Error>(())
    }
}
