ALTER TABLE compensation_events DROP CONSTRAINT compensation_events_order;
ALTER TABLE compensation_events ADD CONSTRAINT compensation_events_order
    CHECK ((order_id IS NULL) = (kind = 'ALERT_DELIVERY'));
DROP TABLE timeline_fences;
