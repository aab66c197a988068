-- Issue 39: a coach's session canceled (`cancelCoachSlot`). The mark is written once, with who
-- asked, why and under which trace (the slot's audit record; every booked order's change has
-- its own row in order_transitions under the same trace); `cancel_settled_at` is set when no
-- order booked on it is still waiting, paid or in use. Until then the cancel is resumed by
-- the scheduler's `coach_slot:cancel` (docs/operations.md "Canceling a coach's session").
ALTER TABLE coach_slots
    ADD COLUMN canceled_at       TIMESTAMPTZ,
    ADD COLUMN cancel_reason     TEXT,
    ADD COLUMN canceled_by       TEXT,
    ADD COLUMN cancel_trace_id   TEXT,
    ADD COLUMN cancel_settled_at TIMESTAMPTZ,
    ADD CONSTRAINT coach_slot_cancel_whole CHECK (
        (canceled_at IS NULL AND cancel_reason IS NULL AND canceled_by IS NULL AND cancel_trace_id IS NULL
            AND cancel_settled_at IS NULL)
        OR (canceled_at IS NOT NULL AND length(cancel_reason) BETWEEN 1 AND 500 AND canceled_by IS NOT NULL
            AND cancel_trace_id IS NOT NULL)
    );

-- The mark is written once: its time, reason, actor and trace never change afterwards.
CREATE FUNCTION coach_slot_cancel_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.canceled_at IS NOT NULL AND (NEW.canceled_at IS DISTINCT FROM OLD.canceled_at
        OR NEW.cancel_reason IS DISTINCT FROM OLD.cancel_reason
        OR NEW.canceled_by IS DISTINCT FROM OLD.canceled_by
        OR NEW.cancel_trace_id IS DISTINCT FROM OLD.cancel_trace_id) THEN
        RAISE EXCEPTION 'coach slot % was canceled already', OLD.id USING ERRCODE = 'check_violation',
            CONSTRAINT = 'coach_slot_cancel_once';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER coach_slot_cancel_guard BEFORE UPDATE ON coach_slots
    FOR EACH ROW EXECUTE FUNCTION coach_slot_cancel_guard();

-- Canceled slots whose bookings are not all settled yet: what the resuming task reads.
CREATE INDEX coach_slots_cancel_unsettled ON coach_slots (canceled_at)
    WHERE canceled_at IS NOT NULL AND cancel_settled_at IS NULL;
