-- The outbox purge deletes SENT rows by age through an index, so it keeps up with the
-- rate rows are created instead of scanning the table.
ALTER TABLE outbox_events ADD KEY by_finished (status, updated_at);

-- Devices unseen for delivery.device_ttl_s stop being fan-out targets; the janitor
-- frees their Redis state once and marks them expired. A device that returns is live
-- again and catches up from its watermark.
ALTER TABLE devices ADD COLUMN expired_at BIGINT NULL;
ALTER TABLE devices ADD KEY by_last_seen (expired_at, last_seen_at);
