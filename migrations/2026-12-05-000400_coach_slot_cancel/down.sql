DROP INDEX coach_slots_cancel_unsettled;
DROP TRIGGER coach_slot_cancel_guard ON coach_slots;
DROP FUNCTION coach_slot_cancel_guard();
ALTER TABLE coach_slots DROP CONSTRAINT coach_slot_cancel_whole,
    DROP COLUMN canceled_at, DROP COLUMN cancel_reason, DROP COLUMN canceled_by,
    DROP COLUMN cancel_trace_id, DROP COLUMN cancel_settled_at;
