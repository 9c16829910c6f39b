-- 0007: operator reads. Indexes only, so a read an operator makes costs what it shows, not
-- the history of the namespace:
--   * ix_pulse_worker_sessions_state: the sessions of a namespace in one state by id (the
--     workers view, and the sessions a queue delete must know about), without walking the
--     CLOSED and EXPIRED history.
--   * ix_orbit_audit_events_action, ix_orbit_audit_events_outcome: the audit list newest
--     first, filtered by action or by outcome, without reading the other events.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_worker_sessions
  ADD KEY ix_pulse_worker_sessions_state (namespace_id, state, id);

ALTER TABLE orbit_audit_events
  ADD KEY ix_orbit_audit_events_action (namespace_id, action, created_at),
  ADD KEY ix_orbit_audit_events_outcome (namespace_id, outcome, created_at)
