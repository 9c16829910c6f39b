-- A quota on subscriptions per application: each subscription makes the delivery hand-out
-- scan the namespace's result events for it, so one tenant's hundreds of subscriptions from
-- "earliest" cost the node work and rows in proportion. NULL = unlimited, like every quota;
-- checked when a subscription is created, under the resources row lock (first in the lock
-- order). Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE orbit_application_resources
  ADD COLUMN max_subscriptions BIGINT UNSIGNED NULL COMMENT 'Quota: subscriptions across all namespaces of the application, NULL = unlimited';
