DELETE FROM compensation_attempts a USING compensation_events e
 WHERE a.event_id = e.id AND e.kind = 'ALERT_DELIVERY';
DELETE FROM compensation_replays r USING compensation_events e
 WHERE r.event_id = e.id AND e.kind = 'ALERT_DELIVERY';
DELETE FROM compensation_events WHERE kind = 'ALERT_DELIVERY';
DROP TABLE alert_channel_tokens;
DROP INDEX compensation_alert_deliveries;
ALTER TABLE compensation_events DROP CONSTRAINT compensation_events_order;
ALTER TABLE compensation_events DROP CONSTRAINT compensation_events_kind_check;
ALTER TABLE compensation_events ADD CONSTRAINT compensation_events_kind_check
    CHECK (kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE',
                    'PROVIDER_REFUND'));
ALTER TABLE compensation_events ALTER COLUMN order_id SET NOT NULL;
