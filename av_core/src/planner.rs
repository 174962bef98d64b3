//! The verification planner: filled in by the planner work.
