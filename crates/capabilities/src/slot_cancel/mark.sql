-- The mark of a coach slot's cancel, written once (the trigger `coach_slot_cancel_guard`
-- refuses changing it): from now on the slot takes no booking (`orders::place` reserves a seat
-- only of a slot not canceled, under the same row lock), and its bookings are settled by
-- whoever settles it next (the request, or the scheduler's `coach_slot:cancel` after a crash).
-- Only a slot not canceled yet that has not started is marked; the caller locked it and
-- checked both.
--
--   $1  coach slot id   bigint
--   $2  reason          text
--   $3  actor           text
--   $4  trace id        text
UPDATE coach_slots
   SET canceled_at = now(), cancel_reason = $2, canceled_by = $3, cancel_trace_id = $4
 WHERE id = $1 AND canceled_at IS NULL AND starts_at > now()
RETURNING id, store_id, coach_name, starts_at, ends_at, capacity, remaining, price_cents, created_at,
          canceled_at, cancel_reason, canceled_by, cancel_trace_id, cancel_settled_at
