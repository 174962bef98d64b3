//! Cost tables: filled in by the planner work.
