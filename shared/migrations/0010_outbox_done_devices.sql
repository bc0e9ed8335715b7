-- The devices that got their pending entries from a fan-out that failed for others, one
-- JSON array [tenant, user, device] a line: the outbox's redo (and an operator's retry)
-- skips them, so an id a device acked in between is not put back.
ALTER TABLE outbox_events ADD COLUMN done_devices MEDIUMTEXT NULL;
